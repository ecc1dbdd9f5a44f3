"""Tenants' secrets on the control plane: encrypted at rest in the store (`at_rest`),
masked in every view (`redaction`), sealed to the one node that runs the worker
(`release`). Nothing here ever logs, stores or shows a plaintext value.
"""
