"""Opening a worker's secrets: with this node's sealing key, for exactly this node, job
and attempt (shared/sealing.py), just before the worker starts and only into its
environment. A worker whose document names secrets it cannot open does not start."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.messages import DesiredTraining
from shared.sealing import SealedSecrets, SealedSecretsError, open_sealed

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey


def open_worker_secrets(
    spec: DesiredTraining, key: X25519PrivateKey | None, node_id: str
) -> SealedSecrets:
    """Raises SealedSecretsError with the reason, for people."""
    if spec.sealed_secrets is None:
        if spec.secret_names:
            raise SealedSecretsError(
                "the job's secrets did not come sealed to this node (the control plane "
                "knows no sealing key of it: enrol it again)"
            )
        return SealedSecrets()
    if key is None:
        raise SealedSecretsError("this node has no sealing key to open the job's secrets")
    opened = open_sealed(
        spec.sealed_secrets, key, node_id=node_id, job_id=spec.job_id, attempt=spec.attempt
    )
    if sorted(opened.env) != sorted(spec.secret_names):
        raise SealedSecretsError("the sealed secrets are not the ones the document names")
    return opened
