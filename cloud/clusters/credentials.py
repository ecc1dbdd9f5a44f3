"""A cluster's credentials (a slurmrestd JWT, `slurm.rest_token`) as secrets: encrypted
at rest with the control plane's secrets key (cloud/secrets/at_rest.py) before the
registration is stored, opened only to build the cluster's back-end, masked in every
view."""

from __future__ import annotations

from typing import Final

import msgspec

from cloud.clusters.views import ClusterSpec
from cloud.secrets.at_rest import SecretsAtRest
from shared.redact import MASK

REST_TOKEN_FIELD: Final = "slurm.rest_token"


def _owner(spec: ClusterSpec) -> str:
    # Bound to the cluster's name: a token copied to another registration does not open.
    return f"cluster:{spec.name}"


def sealed(spec: ClusterSpec, at_rest: SecretsAtRest) -> ClusterSpec:
    """The registration as the store keeps it (its token encrypted)."""
    if not spec.slurm.rest_token:
        return spec
    token = at_rest.encrypt(spec.slurm.rest_token, tenant_id=_owner(spec), field=REST_TOKEN_FIELD)
    return msgspec.structs.replace(
        spec, slurm=msgspec.structs.replace(spec.slurm, rest_token=token)
    )


def rest_token(spec: ClusterSpec, at_rest: SecretsAtRest | None) -> str:
    """The stored registration's token, opened ("" where it has none); raises
    SecretNotOpenedError where it does not open with this key."""
    if not spec.slurm.rest_token or at_rest is None:
        return ""
    return at_rest.decrypt(spec.slurm.rest_token, tenant_id=_owner(spec), field=REST_TOKEN_FIELD)


def shown(spec: ClusterSpec) -> ClusterSpec:
    """The registration as views show it: a token is said to be there, never shown."""
    if not spec.slurm.rest_token:
        return spec
    return msgspec.structs.replace(spec, slurm=msgspec.structs.replace(spec.slurm, rest_token=MASK))
