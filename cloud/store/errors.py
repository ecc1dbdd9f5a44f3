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
