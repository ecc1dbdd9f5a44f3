"""The edge agent: one `Agent` per node, a composition of small modules.

It runs the same code on real hardware (probes from edge/discovery/) and in
simulations (probes from sim_devices/), so everything tested against simulated
fleets is the code that ships. Every module has the same hooks (module.py);
modules.py is the one place that lists them, in the order they run.

Where things happen:

===================  ===========================================================
core.py              Agent: discovery, the MQTT session, the modules' lifetimes
module.py            AgentModule: the hooks every module has, and when they run
modules.py           the registry: which modules, wired how, in which order
context.py           NodeIdentity, AgentCounters, and publishing on a channel
birth.py             the birth (retained online `status`), the goodbye, the will
telemetry.py         telemetry sampled off the loop and sent every interval
desired.py           `desired` received, checked and applied
reported.py          `reported` published on connect and on every change
outbox.py            events queued until the broker has them (the outbox)
job_logs.py          training workers' output shipped on `logs`
training_workers.py  training workers bound to, and stopped with, the agent
inference_server.py  the local inference endpoint, started with the first
                     deployment; models fetched by edge/inference/model_fetch.py
===================  ===========================================================
"""

from .context import AgentCounters, NodeIdentity
from .core import Agent
from .module import AgentModule

__all__ = ["Agent", "AgentCounters", "AgentModule", "NodeIdentity"]
