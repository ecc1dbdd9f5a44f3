"""Opening a worker's secrets: with this node's sealing key, for exactly this node, job
and attempt (shared/sealing.py), just before the worker starts and only into its
environment. A worker whose document names secrets it cannot open does not start, nor
does one whose job has secrets (`has_secrets`: a registry password names no variable)
that the control plane withheld."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from shared.messages import DesiredTraining
from shared.sealing import SealedSecrets, SealedSecretsError, open_sealed

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

# The control plane withholds a job's secrets for one of these reasons (it logs which:
# "secrets withheld"); the node cannot tell them apart, so it names them all.
WITHHELD_REASON: Final = (
    "the job's secrets did not come sealed to this node: the control plane withheld them "
    "(it knows no sealing key of this node: enrol the node again; or its secrets key was "
    "replaced since the job was submitted: submit the job again; or they did not fit "
    "the node's desired document: the control plane's log says which)"
)


def open_worker_secrets(
    spec: DesiredTraining, key: X25519PrivateKey | None, node_id: str
) -> SealedSecrets:
    """Raises SealedSecretsError with the reason, for people."""
    if spec.sealed_secrets is None:
        if spec.secret_names or spec.has_secrets:
            raise SealedSecretsError(WITHHELD_REASON)
        return SealedSecrets()
    if key is None:
        raise SealedSecretsError("this node has no sealing key to open the job's secrets")
    opened = open_sealed(
        spec.sealed_secrets, key, node_id=node_id, job_id=spec.job_id, attempt=spec.attempt
    )
    if sorted(opened.env) != sorted(spec.secret_names):
        raise SealedSecretsError("the sealed secrets are not the ones the document names")
    return opened
