"""Tests of the files under deploy/: Prometheus rules, Grafana dashboards."""
