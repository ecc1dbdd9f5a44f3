"""Typed errors of the store: callers branch on the type, people read the message."""

from __future__ import annotations

from collections.abc import Iterable


class StoreError(Exception):
    """Base of every error the store raises on purpose."""


class StoreConfigError(StoreError):
    """A `[store]` setting that cannot be used; the message names the setting."""


class StoreUnavailableError(StoreError):
    """The database cannot be reached or opened; the message names `store.database_url`."""


class SchemaTooNewError(StoreError):
    """The database was migrated by a newer greenfed than this one; refusing to touch it."""


class SchemaMismatchError(StoreError):
    """The database's migration history disagrees with this code's migrations."""


class WorkNotFoundError(StoreError):
    """No such work item (or it belongs to another tenant, which is the same to the caller)."""

    def __init__(self, work_id: str) -> None:
        super().__init__(f"work {work_id} not found")
        self.work_id = work_id


class TenantNotFoundError(StoreError):
    def __init__(self, tenant: str) -> None:
        super().__init__(f"tenant {tenant} not found")
        self.tenant = tenant


class TenantExistsError(StoreError):
    def __init__(self, name: str) -> None:
        super().__init__(f"a tenant named {name!r} already exists")
        self.name = name


class IllegalTransitionError(StoreError):
    """A state change the work state machine does not allow; nothing was changed."""

    def __init__(self, work_id: str, from_state: str, to_state: str) -> None:
        super().__init__(f"work {work_id}: {from_state} -> {to_state} is not a legal transition")
        self.work_id = work_id
        self.from_state = from_state
        self.to_state = to_state


class VersionConflictError(StoreError):
    """Work changed since the caller read it (optimistic concurrency); nothing was changed.

    The scheduling loop takes a fresh snapshot and plans again.
    """

    def __init__(self, work_ids: Iterable[str]) -> None:
        self.work_ids = tuple(sorted(work_ids))
        super().__init__(f"work changed since it was read: {', '.join(self.work_ids)}")


class InvalidPassWriteError(StoreError):
    """A pass's write or an allocation that cannot be stored as given; nothing changed."""


class LeadershipLostError(StoreError):
    """This process no longer holds scheduling leadership; it must not commit plans."""


class JoinTokenError(StoreError):
    """A join token that cannot be redeemed. The subclass says why; the REST layer logs
    it and tells an anonymous caller only that the token was refused."""

    reason = "refused"

    def __init__(self, token_id: str | None) -> None:
        super().__init__(f"join token {token_id or '(unknown)'}: {self.reason}")
        self.token_id = token_id


class JoinTokenUnknownError(JoinTokenError):
    """No such token (never issued, mistyped, or an id no token has)."""

    reason = "unknown"


class JoinTokenExpiredError(JoinTokenError):
    reason = "expired"


class JoinTokenUsedUpError(JoinTokenError):
    reason = "used up"


class JoinTokenRevokedError(JoinTokenError):
    reason = "revoked"


class NodeAlreadyEnrolledError(StoreError):
    """The node id belongs to an enrolled, unrevoked node: revoke it before enrolling
    that id again (a token must not take over another node's identity)."""

    def __init__(self, node_id: str) -> None:
        super().__init__(f"node {node_id} is already enrolled; revoke it first to enrol it again")
        self.node_id = node_id


class TokenNotFoundError(StoreError):
    """No bearer token of that id (the REST layer says the same of another tenant's)."""

    def __init__(self, token_id: str) -> None:
        super().__init__(f"token {token_id} not found")
        self.token_id = token_id


class TokenNotActiveError(StoreError):
    """Rotating a token that was already rotated or revoked: rotate its replacement."""

    def __init__(self, token_id: str, state: str) -> None:
        super().__init__(f"token {token_id} is {state}; only an active token can be rotated")
        self.token_id = token_id
        self.state = state


class LastAdminTokenError(StoreError):
    """Revoking an admin tenant's last working token would lock the admin out."""

    def __init__(self, token_id: str) -> None:
        super().__init__(
            f"token {token_id} is the admin's last working token: rotate it instead, or "
            "create another first"
        )
        self.token_id = token_id


class QueueFullError(StoreError):
    """A new submission beyond the tenant's `max_queued` pending work; nothing stored."""

    def __init__(self, tenant_id: str, max_queued: int, queued: int) -> None:
        super().__init__(
            f"tenant {tenant_id} has {queued} pending jobs and deployments, its max_queued "
            f"of {max_queued}"
        )
        self.tenant_id = tenant_id
        self.max_queued = max_queued
        self.queued = queued


class NotAStoreError(StoreError):
    """The database holds no greenfed store (no `schema_version` table) to back up."""


class BackupFormatError(StoreError):
    """Not a greenfed store backup, a newer format, or a damaged or truncated file; the
    message says which. Nothing was restored."""


class StoreInUseError(StoreError):
    """A control plane is scheduling on the database a restore would replace; stop every
    replica first. Nothing was changed."""


class RestoreTargetNotEmptyError(StoreError):
    """The database a restore was pointed at holds a store; `--force` replaces it.
    `description` says what is there (schema, cluster, counts); nothing was changed."""

    def __init__(self, target: str, description: str) -> None:
        super().__init__(
            f"{target} is not empty ({description}); restore into an empty database, or "
            "pass --force to replace what is there"
        )
        self.target = target
        self.description = description


class ClusterExistsError(StoreError):
    def __init__(self, name: str) -> None:
        super().__init__(f"a cluster named {name!r} is registered already")
        self.name = name


class ClusterNotFoundError(StoreError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no cluster {name!r}")
        self.name = name


class AgentPackageExistsError(StoreError):
    def __init__(self, version: str) -> None:
        super().__init__(f"agent version {version!r} is published already")
        self.version = version


class AgentRolloutRunningError(StoreError):
    def __init__(self, rollout_id: str) -> None:
        super().__init__(f"rollout {rollout_id} is running")
        self.rollout_id = rollout_id
