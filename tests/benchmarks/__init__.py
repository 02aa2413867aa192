"""Benchmarks run by hand (`python -m tests.benchmarks.overhead`); pytest collects none."""
