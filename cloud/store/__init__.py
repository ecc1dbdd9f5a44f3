"""The control plane's durable store (docs/store.md).

SQLAlchemy 2 async Core over SQLite (default, WAL, in the data directory) or
PostgreSQL. `open_store(settings.store)` connects and migrates; the `Store` it
returns is the whole API.
"""

from cloud.store.changes import WORK_STATE_EVENT, WorkStateChanged
from cloud.store.engine import DatabaseTarget, create_store_engine, resolve_database
from cloud.store.errors import (
    IllegalTransitionError,
    InvalidPassWriteError,
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
from cloud.store.node_admin import NodeAdminRecord
from cloud.store.records import (
    AllocationRecord,
    CommitResult,
    CreatedTenant,
    EventRecord,
    EvictionWrite,
    ModelPage,
    ModelRecord,
    ModelTensor,
    NewAllocation,
    NewEvent,
    NewModel,
    NewTenant,
    NodeDesired,
    PassWrite,
    PlacementWrite,
    StateWrite,
    StoreSnapshot,
    SubmitResult,
    TenantRecord,
    WorkExplanation,
    WorkPage,
    WorkRecord,
)
from cloud.store.states import TERMINAL_STATES, TRANSITIONS, is_legal
from cloud.store.store import Store, open_store
from cloud.store.usage import (
    CounterfactualRecord,
    UsageHour,
    UsageMark,
    UsageQuery,
    UsageTotal,
    UsageWrite,
)

__all__ = [
    "TERMINAL_STATES",
    "TRANSITIONS",
    "WORK_STATE_EVENT",
    "AllocationRecord",
    "CommitResult",
    "CounterfactualRecord",
    "CreatedTenant",
    "DatabaseTarget",
    "EventRecord",
    "EvictionWrite",
    "IllegalTransitionError",
    "InvalidPassWriteError",
    "LeadershipLease",
    "LeadershipLostError",
    "ModelPage",
    "ModelRecord",
    "ModelTensor",
    "NewAllocation",
    "NewEvent",
    "NewModel",
    "NewTenant",
    "NodeAdminRecord",
    "NodeDesired",
    "PassWrite",
    "PlacementWrite",
    "SchemaMismatchError",
    "SchemaTooNewError",
    "StateWrite",
    "Store",
    "StoreConfigError",
    "StoreError",
    "StoreSnapshot",
    "StoreUnavailableError",
    "SubmitResult",
    "TenantExistsError",
    "TenantNotFoundError",
    "TenantRecord",
    "UsageHour",
    "UsageMark",
    "UsageQuery",
    "UsageTotal",
    "UsageWrite",
    "VersionConflictError",
    "WorkExplanation",
    "WorkNotFoundError",
    "WorkPage",
    "WorkRecord",
    "WorkStateChanged",
    "create_store_engine",
    "is_legal",
    "open_store",
    "resolve_database",
]
