"""The fleet as the control plane sees it: MQTT ingestion, the node registry and the
REST representation of nodes."""
