"""The fleet as the control plane sees it.

===============  =====================================================================
ingest.py        MQTT ingestion: node messages checked, then applied to the registry
plausibility.py  what a node may claim: limits on inventory, figures, timestamps
assignments.py   who runs what (gates log chunks, audits reports), from the store
registry.py      NodeRegistry: the live view of every node, from what nodes say
liveness.py      Liveness: when a silent node is offline, when its work is lost
views.py         the REST representation of nodes
===============  =====================================================================
"""
