"""The control plane's durable store (docs/store.md).

SQLAlchemy 2 async Core over SQLite (default, WAL, in the data directory) or
PostgreSQL. `open_store(settings.store)` connects and migrates; the `Store` it
returns is the whole API.
"""

from cloud.store.changes import WORK_STATE_EVENT, WorkStateChanged
from cloud.store.engine import DatabaseTarget, create_store_engine, resolve_database
from cloud.store.errors import (
    IllegalTransitionError,
    InvalidPlanError,
    LeadershipLostError,
    SchemaMismatchError,
    SchemaTooNewError,
    StoreConfigError,
    StoreError,
    StoreUnavailableError,
    TenantExistsError,
    TenantNotFoundError,
    VersionConflictError,
    WorkNotFoundError,
)
from cloud.store.leadership import LeadershipLease
from cloud.store.records import (
    AllocationRecord,
    AllocationState,
    CommitResult,
    CreatedTenant,
    EventRecord,
    Eviction,
    NewAllocation,
    NewEvent,
    NewTenant,
    NodeDesired,
    Placement,
    Plan,
    PriorityClass,
    StateChange,
    StoreSnapshot,
    SubmitResult,
    TenantRecord,
    WorkExplanation,
    WorkKind,
    WorkPage,
    WorkRecord,
)
from cloud.store.states import TERMINAL_STATES, TRANSITIONS, WorkState, is_legal
from cloud.store.store import Store, open_store

__all__ = [
    "TERMINAL_STATES",
    "TRANSITIONS",
    "WORK_STATE_EVENT",
    "AllocationRecord",
    "AllocationState",
    "CommitResult",
    "CreatedTenant",
    "DatabaseTarget",
    "EventRecord",
    "Eviction",
    "IllegalTransitionError",
    "InvalidPlanError",
    "LeadershipLease",
    "LeadershipLostError",
    "NewAllocation",
    "NewEvent",
    "NewTenant",
    "NodeDesired",
    "Placement",
    "Plan",
    "PriorityClass",
    "SchemaMismatchError",
    "SchemaTooNewError",
    "StateChange",
    "Store",
    "StoreConfigError",
    "StoreError",
    "StoreSnapshot",
    "StoreUnavailableError",
    "SubmitResult",
    "TenantExistsError",
    "TenantNotFoundError",
    "TenantRecord",
    "VersionConflictError",
    "WorkExplanation",
    "WorkKind",
    "WorkNotFoundError",
    "WorkPage",
    "WorkRecord",
    "WorkState",
    "WorkStateChanged",
    "create_store_engine",
    "is_legal",
    "open_store",
    "resolve_database",
]
