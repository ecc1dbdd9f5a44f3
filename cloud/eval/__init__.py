"""Trace-driven evaluation of scheduling policies (``greenfed eval``), and the
scheduler core benchmark (``greenfed bench scheduler``).

==================  ==========================================================
fleet.py            fleet files as scheduler nodes (host CPU as a ``cpu`` pool)
workload.py         the workload file format; diurnal inference traffic
generate.py         the default, seeded workload for the default fleet
simulation.py       discrete-event simulation driving ``schedule`` in simulated time
metrics.py          from simulation records to kWh, tCO2eq, cost, waits, misses, SLOs
runner.py           one simulation per policy over the same scenario
report.py           the table, JSON and plot
scheduler_bench.py  one timed scheduling pass over a synthetic cluster and queue
==================  ==========================================================

Guide: docs/green.md.
"""
