"""The cloud control plane: MQTT ingestion, the node registry, the REST API, the
scheduling loop, the durable store and green signals.

Where things are decided (each answered by a file name):

=====================================  ============================================
a node is declared offline or lost     fleet/liveness.py
a report or birth is accepted          fleet/ingest.py
a node's claim is plausible            fleet/plausibility.py
which nodes can run a job              scheduler/filters.py
a placement is scored                  scheduler/scoring.py (+ green/terms.py)
quotas are checked                     scheduler/quota.py
which running work is preempted        scheduler/preemption.py
a job waits for a cleaner hour         green/shifting.py
running training moves                 green/migration.py, green/pass_rule.py
network latency is estimated           green/latency.py
carbon intensity and price are fetched signals/service.py (providers beside it)
a job's desired state is built         loop/desired.py
a pass is committed                    loop/plans.py → store/store.py
a request is authenticated             api/auth.py
a spec is valid                        work/specs.py
an allocation's energy is measured     usage/meter.py
usage is priced and its avoided CO2    usage/pricing.py, usage/counterfactual.py
=====================================  ============================================

Packages: ``api/`` REST handlers; ``fleet/`` ingestion, registry, liveness;
``scheduler/`` the pure placement engine; ``green/`` carbon, price and latency
on its hooks; ``signals/`` grid and latency data; ``loop/`` the scheduling loop;
``store/`` the database; ``work/`` spec types, conversion, explanations and
REST views of work; ``streams/`` the event hub and job logs; ``models/`` the ONNX
model registry; ``eval/`` the trace-driven evaluation and the scheduler benchmark;
``usage/`` live accounting of energy, emissions, cost and emissions avoided; ``ui/``
the dashboard page.
``app.py`` wires them into one aiohttp application (keys in ``app_keys.py``).
"""
