"""The edge agent and what it runs.

``agent/`` the agent as small modules (birth, telemetry, desired and reported
state, the event outbox, the lazy inference server); ``discovery/`` accelerator
probes (NVML, NPUs, CPU, ONNX Runtime providers); ``training/`` training workers;
``inference/`` ONNX Runtime serving (``model_fetch.py``: where a model is fetched
and verified). ``edge`` never imports ``cloud``: an agent installs with the edge
extra alone.
"""
