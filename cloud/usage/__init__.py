"""Live accounting: what every allocation used, emitted, cost and avoided.

`meter` turns a node's telemetry into each allocation's energy, `pricing` prices it
on the recorded grid into hourly rows, `counterfactual` decides the carbon-agnostic
baseline at placement, `accountant` runs it all while this process leads and writes
it to the store, `views` is what the REST API, the events and the CLI show, and
`metrics` exports the totals and the grid to Prometheus.
"""
