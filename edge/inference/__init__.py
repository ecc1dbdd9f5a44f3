"""Inference replicas on the agent: what the `deployments` part of `desired` asks for."""
