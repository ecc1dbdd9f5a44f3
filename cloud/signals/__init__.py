"""Green signals: grid carbon intensity, electricity price and network round-trip times.

==================  ==========================================================
model.py            readings, forecasts and the provider interface
grid.py             GridSignals: the immutable, hourly view the scheduler scores on
units.py            unit conversions (lb/MWh → g/kWh), UTC times, clocks
hourly.py           provider readings (5 min, 30 min, 1 h) → hourly values
datasets.py         the shipped data (data/) and readers for its CSV formats
static.py           static table provider and the built-in fallback table
trace.py            replay of recorded series; the fast path for the simulator
forecast.py         forecasters from history (seasonal-naive, profile-level, …)
http_client.py      one GET for every HTTP client: typed decoding, error mapping
electricitymaps.py  Electricity Maps API v3 client
watttime.py         WattTime API v3 client (login token, co2_moer)
ukgrid.py           UK Carbon Intensity API client (national and regional)
carbonaware.py      Green Software Foundation Carbon Aware SDK Web API client
service.py          SignalService: TTL cache, fallback chain, staleness, snapshots
factory.py          the provider chain and service from `[signals]` settings
latency_matrix.py   RTT between GCP regions: measured, gaps from distance
==================  ==========================================================

Data sources and licences: data/ATTRIBUTION.md. Guide: docs/signals.md.
"""
