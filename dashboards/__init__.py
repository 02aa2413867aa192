"""Dashboards shipped with the gateway: the finance page (`web/`, served at /dashboard),
Grafana dashboards (`grafana/*.json`) and Prometheus alert rules (`alerts/*.yaml`).
A package only so that a built wheel carries these files."""
