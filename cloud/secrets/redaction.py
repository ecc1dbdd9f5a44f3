"""A training job's spec as every view shows it: `secret_env` by name, each value and the
registry password masked. Neither plaintext nor ciphertext leaves through a view: the
names say what the job gets; what a value is, only the job's workers know."""

from __future__ import annotations

import msgspec

from cloud.work.specs import TrainingJobSpec
from shared.redact import MASK


def redacted(spec: TrainingJobSpec) -> TrainingJobSpec:
    if not spec.has_secrets:
        return spec
    auth = spec.registry_auth
    return msgspec.structs.replace(
        spec,
        secret_env=dict.fromkeys(spec.secret_env, MASK),
        registry_auth=None if auth is None else msgspec.structs.replace(auth, password=MASK),
    )
