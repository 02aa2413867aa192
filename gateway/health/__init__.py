"""Upstream health: latency models, load scraped from engines, circuit breakers shared
through Redis, warm-up, and the SLA guard that combines them to pick who answers in
time."""
