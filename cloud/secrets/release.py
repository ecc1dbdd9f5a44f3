"""A job's secrets released to the node that holds the allocation, and to no one else.

The scheduling loop builds each node's `desired` document (cloud/loop/desired.py); for a
training job with secrets it asks `SecretRelease.sealed` for that node's copy: the
values opened from their at-rest form (at_rest.py) and sealed (shared/sealing.py) to the
node's own public key, bound to the node, the job and the attempt. The node's key is the
one its birth announced, as the boundary let it through (cloud/fleet/ingest.py: dropped
when it is not a key or not the one pinned at enrolment).

Nothing is released, and the worker's node refuses to start it saying why, when the node
has no usable key or the secrets do not open (the secrets key was replaced): that is
logged once per interval for each node and reason (the node's refusal sends its operator
to this log), naming the node and the job, never a value.
"""

from __future__ import annotations

from typing import Final

import structlog

from cloud.secrets.at_rest import (
    REGISTRY_PASSWORD_FIELD,
    SecretNotOpenedError,
    SecretsAtRest,
    secret_env_field,
)
from cloud.work.specs import TrainingJobSpec
from shared.logs import RateLimitedLog
from shared.sealing import RegistryCredentials, SealedSecrets, SealingKeyError, seal

LOG_INTERVAL_S: Final = 60.0
# The rate limiter keeps a time for each (reason, node) it logged; past this many it is
# replaced by a fresh one, so a fleet's churn of nodes over months cannot grow it.
LOG_KEYS_MAX: Final = 10_000


class SecretRelease:
    def __init__(self, at_rest: SecretsAtRest, *, log_interval_s: float = LOG_INTERVAL_S) -> None:
        self._at_rest = at_rest
        self._logger = structlog.get_logger("greenfed.secrets")
        self._log_interval_s = log_interval_s
        self._log = RateLimitedLog(self._logger, log_interval_s)
        self._log_keys: set[str] = set()

    def sealed(
        self,
        spec: TrainingJobSpec,
        *,
        tenant_id: str,
        node_id: str,
        job_id: str,
        attempt: int,
        public_key: str | None,
    ) -> str | None:
        """The stored `spec`'s secrets sealed for `node_id`'s workers of this attempt;
        None when it has none, or when they cannot be released (logged)."""
        if not spec.has_secrets:
            return None
        if public_key is None:
            self._withheld(
                "no-key",
                "secrets withheld: the node has no usable sealing key",
                node_id=node_id,
                job_id=job_id,
            )
            return None
        try:
            plaintext = self.plaintext(spec, tenant_id=tenant_id)
        except SecretNotOpenedError as error:
            self._withheld(
                "not-opened", "secrets withheld", node_id=node_id, job_id=job_id, error=str(error)
            )
            return None
        try:
            return seal(plaintext, public_key, node_id=node_id, job_id=job_id, attempt=attempt)
        except (SealingKeyError, ValueError) as error:
            self._withheld(
                "not-sealed", "secrets withheld", node_id=node_id, job_id=job_id, error=str(error)
            )
            return None

    def _withheld(self, reason: str, event: str, /, *, node_id: str, **fields: object) -> None:
        """Logs a withheld release, limited per reason and node: one node's withheld job
        must not hide another node's, whose operator is told this log says why."""
        key = f"{reason}/{node_id}"
        if key not in self._log_keys and len(self._log_keys) >= LOG_KEYS_MAX:
            # Forgetting when each node last logged costs at most one early line per node.
            self._log = RateLimitedLog(self._logger, self._log_interval_s)
            self._log_keys.clear()
        self._log_keys.add(key)
        self._log.warning(key, event, node_id=node_id, **fields)

    def plaintext(self, spec: TrainingJobSpec, *, tenant_id: str) -> SealedSecrets:
        """The stored spec's secrets opened: what the node's workers get."""
        at_rest = self._at_rest
        env = {
            name: at_rest.decrypt(value, tenant_id=tenant_id, field=secret_env_field(name))
            for name, value in spec.secret_env.items()
        }
        auth = spec.registry_auth
        registry = spec.image_registry()
        credentials = None
        if auth is not None and registry is not None:
            credentials = RegistryCredentials(
                registry=registry,
                username=auth.username,
                password=at_rest.decrypt(
                    auth.password, tenant_id=tenant_id, field=REGISTRY_PASSWORD_FIELD
                ),
            )
        return SealedSecrets(env=env, registry=credentials)
