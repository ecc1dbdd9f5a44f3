"""`/v1/jobs` (training) and `/v1/deployments` (inference): submit, list, get, cancel, explain.

Both collections share one implementation, parameterised by `Collection`. Every read
and write is scoped to the caller's tenant: another tenant's id is not found (404), and
an id of the other collection is not found either. The admin sees every tenant's work
(lists, one item, its explanation) and may cancel it or change a deployment (PATCH);
such a cancellation names the admin in the work's reason and event, and both are in
the audit log.

A training job's secrets are encrypted (cloud/secrets/at_rest.py) before its spec is
encoded, stored or compared with a retry's; every view shows the spec redacted
(cloud/secrets/redaction.py), the admin's included.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Final, Generic, TypeVar

import msgspec
import structlog
from aiohttp import web

from cloud.api.audit import audit_entry
from cloud.api.auth import tenant_of
from cloud.api.bodies import PatchFields, decode_body, invalid_body, json_response, read_body
from cloud.api.bulk_actions import destructive
from cloud.api.job_arrays import cancel_array, get_array, refuse_array_task, submit_array
from cloud.api.problems import Problem, problem_reply
from cloud.api.query import RFC3339_PATTERN, comma_list, comma_list_pattern, parse_query
from cloud.api.references import dependencies_by_id, work_id_of
from cloud.api.refusals import (
    dependency_views,
    idempotency_key_reused,
    job_array_refused,
    new_dependencies,
    queue_full,
    refused_dependencies,
    refused_now,
)
from cloud.api.routes import Handler, Reply, RequestHeader, Route
from cloud.api.scope import TenantParameter, scoped_tenant, tenant_names
from cloud.api.stored_specs import exact_spec, known_spec, shown_spec
from cloud.app_keys import REGISTRY, SECRETS_AT_REST, STORE
from cloud.loop.inputs import backing_off
from cloud.loop.rollout import ROLLOUT_MIN_REPLICAS, rollout_event, settled_spec
from cloud.loop.scaling import scaled_canary, scaled_spec
from cloud.secrets.redaction import redacted
from cloud.store import (
    TERMINAL_STATES,
    AllocationRecord,
    IllegalTransitionError,
    NewEvent,
    QueueFullError,
    TenantRecord,
    UsageQuery,
    VersionConflictError,
    WorkNotFoundError,
    WorkRecord,
)
from cloud.store.records import submitted_as
from cloud.usage.views import usage_summary
from cloud.work.convert import check_convertible, spec_of
from cloud.work.explanation import Explanation, decode_explanation, not_looked_at
from cloud.work.specs import (
    DEPLOYMENT_DECODER,
    ID_PATTERN,
    TRAINING_DECODER,
    AutoscaleSpec,
    BatchingSpec,
    CanarySpec,
    DeploymentSpec,
    TrainingJobSpec,
    WorkSpec,
    check_submitted_secrets,
    encode_spec,
)
from cloud.work.views import (
    SCALED_EVENT,
    DeploymentList,
    DeploymentSummary,
    DeploymentView,
    ExplainView,
    JobList,
    JobSummary,
    JobView,
    allocation_view,
    replica_views,
    scaling_view,
    worker_views,
)
from shared.clock import utc_from_epoch
from shared.errors import FieldError, json_path
from shared.problems import InvalidParam
from shared.work_literals import (
    PRIORITY_CLASSES,
    WORK_STATES,
    PriorityClass,
    SpecKind,
    WorkKind,
    WorkState,
    work_kind_of,
)

MAX_PAGE_SIZE: Final = 1000
IDEMPOTENCY_KEY_MAX: Final = 255
_IDEMPOTENCY_KEY: Final = re.compile("[\x20-\x7e]+")
_ID = Annotated[str, msgspec.Meta(pattern=ID_PATTERN)]
_CHANGE_RETRIES: Final = 5

SpecT = TypeVar("SpecT", TrainingJobSpec, DeploymentSpec)


class WorkListQuery(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    state: (
        Annotated[
            str,
            msgspec.Meta(
                description="Comma-separated states, e.g. pending,running.",
                extra_json_schema={"pattern": comma_list_pattern(WORK_STATES)},
            ),
        ]
        | None
    ) = None
    priority: (
        Annotated[
            str,
            msgspec.Meta(
                description="Comma-separated priority classes, e.g. p0,p1.",
                extra_json_schema={"pattern": comma_list_pattern(PRIORITY_CLASSES)},
            ),
        ]
        | None
    ) = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_PAGE_SIZE)] = 50
    cursor: Annotated[
        _ID | None, msgspec.Meta(description="The next_cursor of the previous page.")
    ] = None
    tenant: TenantParameter = None  # the admin sees every tenant's without it


class _ArrayTaskShown(msgspec.Struct, frozen=True, kw_only=True):
    array_id: str
    index: int


class _JobShown(msgspec.Struct, frozen=True, kw_only=True):
    """What a job's summary shows of its spec, read without the spec's limits and checks
    (other fields ignored): a listing shows a job whose stored spec this greenfed cannot
    read as a spec, a limit broken say, with the rest (`_listed`)."""

    name: str
    workers: int = 1
    accelerators_per_worker: int = 1
    accelerator_kind: str = "gpu"
    array_task: _ArrayTaskShown | None = None


class _DeploymentShown(msgspec.Struct, frozen=True, kw_only=True):
    """What a deployment's summary shows of its spec, as `_JobShown` is for a job."""

    name: str
    model_id: str | None = None
    replicas: int = 1
    accelerators_per_replica: int = 1


_JOB_SHOWN: Final = msgspec.json.Decoder(_JobShown)
_DEPLOYMENT_SHOWN: Final = msgspec.json.Decoder(_DeploymentShown)
_log = structlog.get_logger("greenfed.api")


@dataclass(frozen=True, slots=True)
class Collection(Generic[SpecT]):
    spec_kind: SpecKind
    noun: str
    decoder: msgspec.json.Decoder[SpecT]
    summary: Callable[[WorkRecord, SpecT, str], JobSummary | DeploymentSummary]
    # The summary of work whose stored spec is no spec to this version; None: not even
    # the fields a summary shows can be read.
    rough_summary: Callable[[WorkRecord, str], JobSummary | DeploymentSummary | None]
    detail: Callable[
        [WorkRecord, SpecT, str, tuple[AllocationRecord, ...]], JobView | DeploymentView
    ]
    listing: Callable[
        [tuple[JobSummary | DeploymentSummary, ...], str | None], JobList | DeploymentList
    ]

    @property
    def store_kind(self) -> WorkKind:
        return work_kind_of(self.spec_kind)

    def path(self) -> str:
        return f"/v1/{self.noun}s"


def _common(record: WorkRecord, tenant: str) -> dict[str, object]:
    return {
        "id": record.work_id,
        "tenant": tenant,
        "priority": record.priority,
        "state": record.state,
        "reason": record.state_reason,
        "attempts": record.attempts,
        "version": record.version,
        "submitted_at": utc_from_epoch(record.submitted_at),
        "updated_at": utc_from_epoch(record.updated_at),
    }


def _job_fields(
    record: WorkRecord, spec: TrainingJobSpec | _JobShown, tenant: str
) -> dict[str, object]:
    waiting = record.state == "pending" and record.not_before is not None
    return {
        **_common(record, tenant),
        "failures": record.failures,
        "retry_at": utc_from_epoch(record.not_before) if waiting and record.not_before else None,
        "hold": record.hold if record.state == "pending" else None,
        "name": spec.name,
        "workers": spec.workers,
        "accelerators_per_worker": spec.accelerators_per_worker,
        "accelerator_kind": spec.accelerator_kind,
        "array_id": None if spec.array_task is None else spec.array_task.array_id,
        "array_index": None if spec.array_task is None else spec.array_task.index,
    }


def _deployment_fields(
    record: WorkRecord, spec: DeploymentSpec | _DeploymentShown, tenant: str
) -> dict[str, object]:
    return {
        **_common(record, tenant),
        "name": spec.name,
        "model_id": spec.model_id,
        "replicas": spec.replicas,
        "accelerators_per_replica": spec.accelerators_per_replica,
    }


def _rough_job(record: WorkRecord, tenant: str) -> JobSummary | None:
    try:
        shown = _JOB_SHOWN.decode(record.spec)
    except (msgspec.DecodeError, ValueError):
        return None
    return JobSummary(**_job_fields(record, shown, tenant))  # type: ignore[arg-type]


def _rough_deployment(record: WorkRecord, tenant: str) -> DeploymentSummary | None:
    try:
        shown = _DEPLOYMENT_SHOWN.decode(record.spec)
    except (msgspec.DecodeError, ValueError):
        return None
    return DeploymentSummary(**_deployment_fields(record, shown, tenant))  # type: ignore[arg-type]


def _placed(allocations: tuple[AllocationRecord, ...]) -> dict[str, object]:
    ordered = sorted(allocations, key=lambda a: a.member_index)
    return {
        "nodes": tuple(a.node_id for a in ordered),
        "allocations": tuple(allocation_view(a) for a in ordered),
    }


# Keys the control plane gives work itself (an apply's creation, cloud/api/apply.py)
# begin with a control character, which no Idempotency-Key header may hold.
OWN_IDEMPOTENCY_PREFIX: Final = "\x1e"


def _clients_key(key: str | None) -> str | None:
    """The work's Idempotency-Key as its client sent it (None: none, or the control
    plane's own)."""
    return None if key is None or key.startswith(OWN_IDEMPOTENCY_PREFIX) else key


JOBS: Final[Collection[TrainingJobSpec]] = Collection(
    spec_kind="training",
    noun="job",
    decoder=TRAINING_DECODER,
    summary=lambda record, spec, tenant: JobSummary(**_job_fields(record, spec, tenant)),  # type: ignore[arg-type]
    rough_summary=_rough_job,
    detail=lambda record, spec, tenant, allocations: JobView(
        **_job_fields(record, spec, tenant),  # type: ignore[arg-type]
        **_placed(allocations),  # type: ignore[arg-type]
        idempotency_key=_clients_key(record.idempotency_key),
        spec=redacted(spec),  # every job view: secrets by name only
    ),
    listing=lambda items, cursor: JobList(
        items=items,  # type: ignore[arg-type]
        count=len(items),
        next_cursor=cursor,
    ),
)
DEPLOYMENTS: Final[Collection[DeploymentSpec]] = Collection(
    spec_kind="deployment",
    noun="deployment",
    decoder=DEPLOYMENT_DECODER,
    summary=lambda record, spec, tenant: DeploymentSummary(
        **_deployment_fields(record, spec, tenant)  # type: ignore[arg-type]
    ),
    rough_summary=_rough_deployment,
    detail=lambda record, spec, tenant, allocations: DeploymentView(
        **_deployment_fields(record, spec, tenant),  # type: ignore[arg-type]
        **_placed(allocations),  # type: ignore[arg-type]
        idempotency_key=_clients_key(record.idempotency_key),
        spec=spec,
    ),
    listing=lambda items, cursor: DeploymentList(
        items=items,  # type: ignore[arg-type]
        count=len(items),
        next_cursor=cursor,
    ),
)


def not_found(collection: Collection[SpecT], work_id: str) -> Problem:
    return Problem(
        404, f"{collection.noun}-not-found", f"{collection.noun.capitalize()} not found",
        f"no {collection.noun} {work_id!r}",
    )  # fmt: skip


def _spec(collection: Collection[SpecT], record: WorkRecord) -> SpecT:
    """The stored spec, for a view: the fields this version knows (one a newer greenfed
    wrote may hold others), else a 409 for this work (cloud/api/stored_specs.py)."""
    return shown_spec(collection.decoder, record)


async def owner_of(request: web.Request, work_id: str) -> TenantRecord:
    """The tenant whose work the caller reaches by this id: its own; for the admin,
    whichever tenant's the work is (the admin itself when there is no such work)."""
    caller = tenant_of(request)
    if not caller.admin:
        return caller
    store = request.app[STORE]
    record = await store.find_work(work_id)
    if record is None or record.tenant_id == caller.tenant_id:
        return caller
    return await store.get_tenant(record.tenant_id) or caller


async def find(
    request: web.Request, collection: Collection[SpecT], work_id: str, *, any_tenant: bool = False
) -> tuple[TenantRecord, WorkRecord]:
    """The caller's work of this collection (with `any_tenant`, the admin's reach: any
    tenant's) and the tenant it belongs to, or a 404 problem. `work_id` may be a name or
    an id prefix too (cloud/api/references.py). A job array's id or name is a 409 that
    says to name one of its tasks: the array is many jobs, not one."""
    reference = work_id
    work_id = await work_id_of(
        request, collection.store_kind, collection.noun, reference, any_tenant=any_tenant
    )
    tenant = await owner_of(request, work_id) if any_tenant else tenant_of(request)
    record = await request.app[STORE].get_work(tenant.tenant_id, work_id)
    if record is None and collection is JOBS:  # a job array's id names no job
        await _refuse_array(request, reference, work_id, any_tenant=any_tenant)
    if record is None or record.kind != collection.store_kind:
        raise not_found(collection, work_id)
    return tenant, record


async def _refuse_array(
    request: web.Request, reference: str, array_id: str, *, any_tenant: bool
) -> None:
    """The 409 of naming the caller's job array (with `any_tenant`, the admin's reach:
    any tenant's) where this route acts on one job; nothing when `array_id` is no such
    array (another tenant's array stays not found)."""
    caller = tenant_of(request)
    scope = None if any_tenant and caller.admin else caller.tenant_id
    tasks = await request.app[STORE].array_tasks(scope, array_id)
    if not tasks:
        return
    route = request.match_info.route.resource
    path = route.canonical if route is not None else "/v1/jobs/{id}"  # e.g. /v1/jobs/{id}/hold
    named = "a job array" if reference == array_id else f"job array {array_id}"
    count = "1 task" if len(tasks) == 1 else f"{len(tasks)} tasks"
    one_task = path.replace("{id}", f"{array_id}_{tasks[0].index}")
    detail = (
        f"job {reference} is {named} ({count}), not one job: {request.method} {path} acts "
        f"on one task, by its id or ARRAYID_INDEX (e.g. {request.method} {one_task}); or "
        f"cancel the whole array (DELETE /v1/jobs/{array_id})"
    )
    raise job_array_refused("A job array is not one job", detail)


# ---- handlers ----------------------------------------------------------------------------


def _idempotency_key(request: web.Request) -> str | None:
    """1 to 255 printable ASCII characters (space to '~'): aiohttp hands other header
    bytes on as surrogate escapes, which no database column would take."""
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    if not (0 < len(key) <= IDEMPOTENCY_KEY_MAX and _IDEMPOTENCY_KEY.fullmatch(key)):
        reason = f"1 to {IDEMPOTENCY_KEY_MAX} printable ASCII characters"
        raise Problem(
            400,
            "invalid-header",
            "Invalid Idempotency-Key",
            f"Idempotency-Key must have {reason}",
            (InvalidParam("Idempotency-Key", reason),),
        )
    return key


def _check_schedulable(spec: WorkSpec) -> None:
    """What the scheduler itself would refuse (e.g. an unknown score term): a 422 now,
    on the spec's field where the scheduler's field is one (`$.score_weights`), else `$`."""
    refused = check_convertible(spec)
    if refused is None:
        return
    on_spec_field = bool(refused.path) and refused.path[0] in spec.__struct_fields__
    raise invalid_body(json_path(refused.path) if on_spec_field else "$", refused.reason)


def check_priority(tenant: TenantRecord, priority: PriorityClass) -> None:
    """A 403 unless the tenant may use `priority`: asked of a class when it is new to the
    work (a submission, an update that changes it), never of the class work already
    has, which it keeps when the tenant's allowed_priorities drop it (docs/rest.md)."""
    if priority not in tenant.allowed_priorities:
        allowed = ", ".join(tenant.allowed_priorities)
        reason = f"priority class {priority} is not allowed for this tenant (allowed: {allowed})"
        raise Problem(
            403,
            "priority-not-allowed",
            "Priority class not allowed",
            f"$.priority: {reason}",
            (InvalidParam("$.priority", reason),),
        )


def _stored_form(request: web.Request, spec: SpecT, tenant: TenantRecord) -> SpecT:
    """The spec as the store keeps it: its secrets' plaintext checked, then encrypted.
    Everything after this sees ciphertext only."""
    if isinstance(spec, TrainingJobSpec):
        refuse_array_task(spec)
        try:
            check_submitted_secrets(spec)
        except FieldError as error:
            raise invalid_body(json_path(error.path), error.reason) from None
    return request.app[SECRETS_AT_REST].encrypt_spec(spec, tenant_id=tenant.tenant_id)


class _DeadlineAsSent(msgspec.Struct):
    deadline: str | None = None


_DEADLINE_AS_SENT: Final = msgspec.json.Decoder(_DeadlineAsSent)
_RFC3339: Final = re.compile(RFC3339_PATTERN)


def _check_times_as_sent(raw: bytes, spec: WorkSpec) -> None:
    """A time is RFC 3339, as the OpenAPI document says (format date-time); msgspec
    also reads a space for the T and an offset without its colon."""
    if isinstance(spec, TrainingJobSpec) and spec.deadline is not None:
        sent = _DEADLINE_AS_SENT.decode(raw).deadline
        if sent is None or _RFC3339.fullmatch(sent) is None:
            raise invalid_body("$.deadline", "an RFC 3339 time, e.g. 2026-12-01T00:00:00Z")


def accepted_spec(
    request: web.Request, collection: Collection[SpecT], raw: bytes, tenant: TenantRecord
) -> SpecT:
    """The body as a submission takes it, in its stored form, with every check of the
    spec alone that a submission makes (dry runs and apply: cloud/api/apply.py) but its
    priority class's: the caller asks `check_priority` where the class is new (new work,
    or live work's changed class), so that re-applying the file of work whose class the
    tenant may no longer use is "unchanged", not refused."""
    decoded = decode_body(raw, collection.decoder)
    _check_times_as_sent(raw, decoded)
    spec = _stored_form(request, decoded, tenant)
    _check_schedulable(spec)
    return spec


async def check_admissible(request: web.Request, spec: WorkSpec, tenant: TenantRecord) -> None:
    """What a submission refuses of new work beyond its spec: a passed deadline, a
    dependency that can never hold, a model the tenant does not have."""
    refused = await refused_now(request, spec, tenant, time.time())
    refused = refused or await refused_dependencies(request, spec, tenant)
    if refused is not None:
        raise refused
    if isinstance(spec, DeploymentSpec) and (
        await request.app[STORE].get_model(tenant.tenant_id, spec.model_id) is None
    ):
        raise invalid_body(
            "$.model_id", f"no model {spec.model_id!r}: upload it first with POST /v1/models"
        )
    refuse_canary_as_sent(spec)


def refuse_canary_as_sent(spec: WorkSpec) -> None:
    """A deployment's `canary` is greenfed's record of a rollout in progress, made from a
    model update whose model and canary size were checked (`_canary`): a spec that sets
    it would serve a model unchecked (another tenant's, by id) and promote it."""
    if isinstance(spec, DeploymentSpec) and spec.canary is not None:
        raise invalid_body(
            "$.canary",
            "is set by greenfed when a model update asks for a rollout (PATCH with "
            "model_id and rollout); a new deployment's spec does not set it",
        )


async def _submit(request: web.Request, collection: Collection[SpecT]) -> web.Response:
    tenant = tenant_of(request)
    key = _idempotency_key(request)
    raw = await read_body(request)
    decoded = decode_body(raw, collection.decoder)
    _check_times_as_sent(raw, decoded)
    spec = _stored_form(request, decoded, tenant)
    check_priority(tenant, spec.priority)
    _check_schedulable(spec)
    spec = await dependencies_by_id(request, spec)  # names of jobs it waits for: their ids
    store = request.app[STORE]
    refused = await refused_now(request, spec, tenant, time.time())
    refused = refused or await refused_dependencies(request, spec, tenant)
    if refused is not None:
        # A retry of a submission accepted earlier (before its deadline passed, say)
        # still gets the original: the replay is looked up first; new work is refused.
        earlier = (
            None if key is None else await store.work_by_idempotency_key(tenant.tenant_id, key)
        )
        if earlier is None:
            raise refused
        if isinstance(spec, TrainingJobSpec) and spec.array is not None:
            return await submit_array(request, tenant, spec, key)  # the store finds the array
        return await _replay(request, collection, tenant, earlier, spec, encode_spec(spec), key)
    if isinstance(spec, DeploymentSpec) and (
        await store.get_model(tenant.tenant_id, spec.model_id) is None
    ):
        raise invalid_body(
            "$.model_id", f"no model {spec.model_id!r}: upload it first with POST /v1/models"
        )
    refuse_canary_as_sent(spec)
    if isinstance(spec, TrainingJobSpec) and spec.array is not None:
        return await submit_array(request, tenant, spec, key)  # one job per task
    document = encode_spec(spec)
    try:
        result = await store.submit_work(
            tenant.tenant_id,
            kind=collection.store_kind,
            spec=document,
            priority=spec.priority,
            idempotency_key=key,
            dependencies=new_dependencies(spec),
        )
    except QueueFullError as error:
        raise queue_full(
            tenant, error, "submit again once some have started, or cancel some"
        ) from None
    record = result.work
    if not result.created:
        return await _replay(request, collection, tenant, record, spec, document, key)
    body = collection.detail(record, spec, tenant.name, ())
    if spec.depends_on:  # new work: nothing waits for it yet, so only then is there any
        body = await _with_dependencies(request, tenant, record, body)
    response = json_response(body, status=201)
    response.headers["Location"] = f"{collection.path()}/{record.work_id}"
    return response


async def _replay(
    request: web.Request,
    collection: Collection[SpecT],
    tenant: TenantRecord,
    record: WorkRecord,
    spec: SpecT,
    document: bytes,
    key: str | None,
) -> web.Response:
    """A retry with the same Idempotency-Key: the original (200), or 409 for another body."""
    if not _same_submission(record, collection.store_kind, spec, document):
        raise idempotency_key_reused(
            key,
            record,
            f"{collection.path()}/{record.work_id}",
            same_kind=_submitted_alone(record, collection),
        )
    allocations = await request.app[STORE].work_allocations(tenant.tenant_id, record.work_id)
    # The work as it is now: its stored spec, which a PATCH or an apply may have changed.
    shown = collection.detail(record, _spec(collection, record), tenant.name, allocations)
    body = await _with_dependencies(request, tenant, record, shown)
    response = json_response(body, status=200)
    response.headers["Location"] = f"{collection.path()}/{record.work_id}"
    return response


def _submitted_alone(record: WorkRecord, collection: Collection[SpecT]) -> bool:
    """Whether `record` was submitted as one item of `collection`, as the retry asks: a
    key first used for the other collection, or for a job array (its first task holds
    the key), was used for another submission, whatever became of the work since."""
    if record.kind != collection.store_kind:
        return False
    if record.kind != "training":
        return True
    try:
        return _JOB_SHOWN.decode(record.spec).array_task is None
    except msgspec.DecodeError:  # unreadable here: nothing tells what it was submitted as
        return True


async def _with_dependencies(
    request: web.Request, tenant: TenantRecord, record: WorkRecord, body: JobView | DeploymentView
) -> JobView | DeploymentView:
    """`body` with what the work waits for and (a job) what waits for it, as a GET shows
    it: a submission's answer is the work as GET shows it (docs/rest.md)."""
    waits_for, needed_by = await dependency_views(request, tenant, record)
    if isinstance(body, JobView):
        return msgspec.structs.replace(body, waits_for=waits_for, needed_by=needed_by)
    return msgspec.structs.replace(body, waits_for=waits_for)


def _same_submission(record: WorkRecord, kind: WorkKind, spec: WorkSpec, document: bytes) -> bool:
    """A retry carries the spec submitted with the key: its digest is kept with the work
    (store v25), so a retry after a PATCH or an apply changed the spec still matches.
    Where the digest cannot tell, compared with the spec as stored, decoded when the
    bytes differ, so a spec stored by an older greenfed (without fields added since,
    which decode to their defaults) still matches its retry after an upgrade."""
    if record.kind != kind:
        return False
    verdict = submitted_as(record, document)
    if verdict is not None:
        return verdict
    if record.spec == document:
        return True
    try:
        return bool(spec_of(record) == spec)
    except (msgspec.DecodeError, ValueError):
        return False


async def _list(request: web.Request, collection: Collection[SpecT]) -> web.Response:
    query = parse_query(request, WorkListQuery)
    states: tuple[WorkState, ...] = comma_list("state", query.state, WORK_STATES)  # type: ignore[assignment]
    priorities: tuple[PriorityClass, ...] = comma_list("priority", query.priority, PRIORITY_CLASSES)  # type: ignore[assignment]
    scope = await scoped_tenant(request, query.tenant, admin_sees_all=True)
    names = await tenant_names(request, scope)
    page = await request.app[STORE].list_work(
        None if scope is None else scope.tenant_id,
        states=states,
        kinds=(collection.store_kind,),
        priorities=priorities,
        limit=query.limit,
        cursor=query.cursor,
    )
    listed = (
        _listed(collection, record, names.get(record.tenant_id, record.tenant_id))
        for record in page.items
    )
    items = tuple(item for item in listed if item is not None)
    return json_response(collection.listing(items, page.next_cursor))


def _listed(
    collection: Collection[SpecT], record: WorkRecord, tenant: str
) -> JobSummary | DeploymentSummary | None:
    """A listing's item: one unreadable spec never fails the listing of the others. A
    spec whose known fields make no spec (a limit broken) shows what a summary holds;
    one without even those is left out (logged; a GET of it says why)."""
    spec = known_spec(collection.decoder, record)
    if spec is not None:
        return collection.summary(record, spec, tenant)
    summary = collection.rough_summary(record, tenant)
    if summary is None:
        _log.warning("left out of a listing: its spec is unreadable", work_id=record.work_id)
    return summary


async def _get(request: web.Request, collection: Collection[SpecT]) -> web.Response:
    work_id = await work_id_of(
        request, collection.store_kind, collection.noun, request.match_info["id"], any_tenant=True
    )
    tenant = await owner_of(request, work_id)
    found = await request.app[STORE].work_with_allocations(tenant.tenant_id, work_id)
    if found is None and collection is JOBS:  # a job array's id names no job
        array = await get_array(request, work_id)
        if array is not None:
            return array
    if found is None or found[0].kind != collection.store_kind:
        raise not_found(collection, work_id)
    record, allocations = found
    body = collection.detail(record, _spec(collection, record), tenant.name, allocations)
    if isinstance(body, DeploymentView):
        scaled = await request.app[STORE].latest_event(record.work_id, SCALED_EVENT)
        body = msgspec.structs.replace(
            body,
            replica_states=replica_views(record.work_id, allocations, request.app[REGISTRY]),
            last_scaling=None if scaled is None else scaling_view(scaled),
        )
    waits_for, needed_by = await dependency_views(request, tenant, record)
    if isinstance(body, JobView):
        body = msgspec.structs.replace(
            body,
            waits_for=waits_for,
            needed_by=needed_by,
            allocations=worker_views(
                record.work_id, record.attempts, body.allocations, request.app[REGISTRY]
            ),
        )
    else:
        body = msgspec.structs.replace(body, waits_for=waits_for)
    metered = await request.app[STORE].usage(
        UsageQuery(tenant_id=record.tenant_id, work_ids=[record.work_id])
    )
    if metered:
        body = msgspec.structs.replace(body, usage=usage_summary(metered))
    return json_response(body)


async def _change_live_work(
    request: web.Request,
    collection: Collection[SpecT],
    done: str,
    change: Callable[[TenantRecord, WorkRecord], Awaitable[web.Response]],
    *,
    any_tenant: bool = False,
) -> web.Response:
    """Apply `change` to the caller's work (with `any_tenant`, the admin's reach: any
    tenant's) at the version just read, unless it has ended (409, saying it cannot be
    `done`). Work that moved meanwhile (placed, started, ended) is looked at again, a few
    times."""
    work_id = request.match_info["id"]
    for _ in range(_CHANGE_RETRIES):
        tenant, record = await find(request, collection, work_id, any_tenant=any_tenant)
        if record.state in TERMINAL_STATES:
            raise _finished(collection, record, done)
        try:
            return await change(tenant, record)
        except (VersionConflictError, IllegalTransitionError):
            continue  # it changed meanwhile: the next look says how
        except WorkNotFoundError:
            raise not_found(collection, work_id) from None
    raise Problem(
        409,
        "changing",
        "Changing too fast",
        f"{collection.noun} {work_id} changed on every attempt to have it {done}; retry",
    )


async def _cancel(request: web.Request, collection: Collection[SpecT]) -> web.Response:
    store = request.app[STORE]
    caller = tenant_of(request)
    if collection is JOBS:  # a job array's id or name: every task that has not ended
        array_id = await work_id_of(
            request, "training", collection.noun, request.match_info["id"], any_tenant=True
        )
        cancelled = await cancel_array(request, array_id)
        if cancelled is not None:
            return cancelled

    async def cancel(tenant: TenantRecord, record: WorkRecord) -> web.Response:
        by_admin = tenant.tenant_id != caller.tenant_id
        result = await store.cancel_work(
            tenant.tenant_id,
            record.work_id,
            reason=f"cancelled by admin {caller.name}" if by_admin else "cancelled by the tenant",
            expected_version=record.version,
            actor=caller.name,
            audit=(
                audit_entry(
                    request,
                    "work.cancel",
                    record.work_id,
                    tenant=tenant.name,
                    kind=collection.noun,
                    state=record.state,
                )
                if caller.admin
                else None
            ),
        )
        cancelled = result.work[0]
        return json_response(
            collection.detail(cancelled, _spec(collection, cancelled), tenant.name, ())
        )

    return await _change_live_work(request, collection, "cancelled", cancel, any_tenant=True)


def _finished(collection: Collection[SpecT], record: WorkRecord, done: str) -> Problem:
    return Problem(
        409,
        "already-finished",
        f"{collection.noun.capitalize()} already finished",
        f"{collection.noun} {record.work_id} is {record.state}; only pending, scheduled or "
        f"running work can be {done}",
    )


_NOT_LOOKED_AT: Final = "The scheduler has not looked at it yet; it will on its next pass."


async def _explain(request: web.Request, collection: Collection[SpecT]) -> web.Response:
    work_id = await work_id_of(
        request, collection.store_kind, collection.noun, request.match_info["id"], any_tenant=True
    )
    tenant = await owner_of(request, work_id)
    found = await request.app[STORE].work_explanation(tenant.tenant_id, work_id)
    if found is None or found.work.kind != collection.store_kind:
        raise not_found(collection, work_id)
    explanation = None
    message = _NOT_LOOKED_AT
    if found.explanation is not None:
        try:
            explanation = decode_explanation(found.explanation)
            message = explanation.message
        except msgspec.DecodeError:  # written by a newer, incompatible scheduler
            message = "The stored explanation could not be read by this greenfed version."
    elif found.work.state_reason:
        message = found.work.state_reason
    explained_at = None if found.explained_at is None else utc_from_epoch(found.explained_at)
    record = found.work
    if record.state == "pending" and record.hold is not None:
        # Out of the queue until a person lifts the hold: the scheduler's last word on it
        # (made before) no longer says why it waits; the hold's reason does.
        explanation, message = None, record.state_reason or record.hold
    elif backing_off(record, time.time()):
        # Out of the queue until its retry may be placed: no pass explains it meanwhile.
        explanation = _backoff_explanation(record)
        message, explained_at = explanation.message, explanation.decided_at
    elif (
        record.state == "pending"
        and explanation is not None
        and explanation.outcome in _PLACED_OUTCOMES
    ):
        # Back in the queue since the pass that placed it (requeued, its node lost, a
        # failure retried): that pass's word no longer holds, the reason does, until a
        # pass explains it again (one that finds it waiting as it did before it was
        # placed writes no new explanation, only a reason that changed).
        explanation, message, explained_at = None, record.state_reason or message, None
    body = ExplainView(
        id=record.work_id,
        kind=collection.spec_kind,
        state=record.state,
        reason=record.state_reason,
        explained_at=explained_at,
        message=message,
        explanation=explanation,
    )
    return json_response(body)


# What a pass explains of work it placed (all or some of it, or moved it).
_PLACED_OUTCOMES: Final = frozenset({"placed", "partial", "moved"})


def _backoff_explanation(record: WorkRecord) -> Explanation:
    """Why a job that failed waits (code `backoff`): its retry policy
    (cloud/work/retries.py) queues it again at `not_before`. Decided when it failed, the
    last change to the record."""
    assert record.not_before is not None
    retry_at = utc_from_epoch(record.not_before)
    reason = (record.state_reason or "it failed").removesuffix(".")
    return not_looked_at(
        "backoff",
        f"Waiting out its retry backoff until {retry_at:%Y-%m-%dT%H:%M:%SZ}: {reason}.",
        utc_from_epoch(record.updated_at),
        retry_at=retry_at,
    )


# aiohttp handlers per collection (distinct functions: routes are declared per handler).


async def submit_job(request: web.Request) -> web.Response:
    return await _submit(request, JOBS)


async def list_jobs(request: web.Request) -> web.Response:
    return await _list(request, JOBS)


async def get_job(request: web.Request) -> web.Response:
    return await _get(request, JOBS)


@destructive("work.cancel")  # held to the limit when the admin cancels
async def cancel_job(request: web.Request) -> web.Response:
    return await _cancel(request, JOBS)


async def explain_job(request: web.Request) -> web.Response:
    return await _explain(request, JOBS)


async def submit_deployment(request: web.Request) -> web.Response:
    return await _submit(request, DEPLOYMENTS)


async def list_deployments(request: web.Request) -> web.Response:
    return await _list(request, DEPLOYMENTS)


async def get_deployment(request: web.Request) -> web.Response:
    return await _get(request, DEPLOYMENTS)


@destructive("work.cancel")
async def cancel_deployment(request: web.Request) -> web.Response:
    return await _cancel(request, DEPLOYMENTS)


async def explain_deployment(request: web.Request) -> web.Response:
    return await _explain(request, DEPLOYMENTS)


# ---- routes ------------------------------------------------------------------------------

_IDEMPOTENCY_HEADER = RequestHeader(
    "Idempotency-Key",
    "Makes the submission safe to retry: a retry with the same key and body returns the "
    "original (200); the same key with another body is a 409.",
    # Printable ASCII; HTTP strips the spaces around a header's value.
    {"type": "string", "pattern": "^[!-~]([ -~]{0,253}[!-~])?$"},
)


@dataclass(frozen=True, slots=True)
class _Handlers:
    submit: Handler
    list: Handler
    get: Handler
    cancel: Handler
    explain: Handler


def _routes(collection: Collection[SpecT], handlers: _Handlers) -> tuple[Route, ...]:
    noun = collection.noun
    base = collection.path()
    spec_type = TrainingJobSpec if collection.store_kind == "training" else DeploymentSpec
    view_type = JobView if collection.store_kind == "training" else DeploymentView
    list_type = JobList if collection.store_kind == "training" else DeploymentList
    tag = f"{noun}s"
    return (
        Route(
            "POST",
            base,
            handlers.submit,
            f"Submit a {noun}",
            "tenant",
            tag,
            body=spec_type,
            headers=(_IDEMPOTENCY_HEADER,),
            replies=(
                Reply(201, f"The {noun}, committed", view_type, headers=("Location",)),
                Reply(200, "A retry with the same Idempotency-Key: the original", view_type),
                problem_reply(403, "The priority class is not allowed for this tenant"),
                problem_reply(409, "The Idempotency-Key was used with another body"),
                problem_reply(429, "The tenant's pending work is at its max_queued"),
            ),
        ),
        Route(
            "GET",
            base,
            handlers.list,
            f"List the tenant's {noun}s (the admin: every tenant's), newest first",
            "tenant",
            tag,
            query=WorkListQuery,
            replies=(Reply(200, f"A page of {noun}s", list_type),),
        ),
        Route(
            "GET",
            base + "/{id}",
            handlers.get,
            f"One {noun}: state, reason, attempts, placement (the admin: any tenant's)",
            "tenant",
            tag,
            replies=(Reply(200, f"The {noun}", view_type),),
        ),
        Route(
            "DELETE",
            base + "/{id}",
            handlers.cancel,
            f"Cancel a {noun} (the admin: any tenant's)",
            "tenant",
            tag,
            description=(
                "Nodes stop it (SIGTERM, then SIGKILL after its grace period). The admin's "
                "cancellation of another tenant's work names the admin in its reason and "
                "`work.state` event (`actor`) and is in the audit log."
            ),
            replies=(
                Reply(200, f"The {noun}, now cancelled", view_type),
                problem_reply(409, f"The {noun} had already finished"),
            ),
        ),
        Route(
            "GET",
            base + "/{id}/explain",
            handlers.explain,
            f"Why the {noun} waits, or why it runs where it does",
            "tenant",
            tag,
            replies=(Reply(200, "The scheduler's latest explanation", ExplainView),),
        ),
    )


class RolloutRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Serve a new model on canary replicas first (docs/inference.md#canary-rollouts)."""

    canary_replicas: Annotated[int, msgspec.Meta(ge=1, le=4096)] | None = None
    canary_share: Annotated[float, msgspec.Meta(gt=0, lt=1)] | None = None
    hold_s: Annotated[float, msgspec.Meta(ge=0, le=86_400)] = 60.0
    max_error_rate: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.01
    max_p95_ratio: Annotated[float, msgspec.Meta(ge=1, le=100)] = 1.5
    min_requests: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 20


def _canary(spec: DeploymentSpec, model_id: str, rollout: RolloutRequest) -> CanarySpec:
    if spec.replicas < ROLLOUT_MIN_REPLICAS:
        raise invalid_body(
            "$.rollout",
            f"a canary needs at least {ROLLOUT_MIN_REPLICAS} replicas (one keeps the model); "
            f"the deployment would have {spec.replicas}",
        )
    if rollout.canary_replicas is not None and rollout.canary_share is not None:
        raise invalid_body("$.rollout", "give canary_replicas or canary_share, not both")
    if rollout.canary_replicas is not None:
        count = rollout.canary_replicas
    else:
        count = max(1, math.floor(spec.replicas * (rollout.canary_share or 0.0)))
    if count >= spec.replicas:
        raise invalid_body(
            "$.rollout.canary_replicas", f"must be below the deployment's {spec.replicas} replicas"
        )
    return CanarySpec(
        model_id=model_id,
        replicas=count,
        hold_s=rollout.hold_s,
        max_error_rate=rollout.max_error_rate,
        max_p95_ratio=rollout.max_p95_ratio,
        min_requests=rollout.min_requests,
    )


class DeploymentUpdate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What may change in a running deployment without placing it again."""

    model_id: (
        Annotated[
            str,
            msgspec.Meta(min_length=1, max_length=64, description="Serve this model from now on."),
        ]
        | None
    ) = None
    batching: BatchingSpec | None = None
    replicas: (
        Annotated[
            int,
            msgspec.Meta(
                ge=1,
                le=4096,
                description="Scale to this many replicas (within autoscale's bounds, if set).",
            ),
        ]
        | msgspec.UnsetType
    ) = msgspec.UNSET
    # An object turns autoscaling on or changes it; null turns it off.
    autoscale: AutoscaleSpec | msgspec.UnsetType | None = msgspec.UNSET
    rollout: RolloutRequest | None = None  # with model_id: a canary first


_UPDATE_DECODER: Final = msgspec.json.Decoder(DeploymentUpdate)
# A rollout changes nothing without a model_id (a 422 of its own).
_DEPLOYMENT_CHANGES: Final = PatchFields(
    present=("replicas", "autoscale"), not_null=("model_id", "batching")
)


def _scaled(spec: DeploymentSpec, body: DeploymentUpdate) -> DeploymentSpec:
    """`spec` with the update's replicas and autoscale, checked together (a 422 names
    the field at fault)."""
    autoscale = spec.autoscale if body.autoscale is msgspec.UNSET else body.autoscale
    replicas = spec.replicas if body.replicas is msgspec.UNSET else body.replicas
    if autoscale is not None and body.replicas is msgspec.UNSET:
        # Turning autoscaling on (or moving its bounds) brings the count inside them.
        replicas = max(autoscale.min_replicas, min(autoscale.max_replicas, replicas))
    if autoscale is not None and not autoscale.min_replicas <= replicas <= autoscale.max_replicas:
        raise invalid_body(
            "$.replicas",
            f"must be within autoscale's {autoscale.min_replicas}..{autoscale.max_replicas}",
        )
    # The count first, the bounds then: a spec checks its replicas against its autoscale
    # each time it is made, and the old count may lie outside the new bounds.
    rescaled = scaled_spec(msgspec.structs.replace(spec, autoscale=None), replicas)
    try:
        return msgspec.structs.replace(rescaled, autoscale=autoscale)
    except FieldError as error:  # e.g. min_available above the new autoscale's floor
        raise invalid_body(json_path(error.path), error.reason) from error


async def update_deployment(request: web.Request) -> web.Response:
    """Change the model or the batching: nodes load and warm the new model while the old
    one keeps serving, then switch; no request fails during the switch."""
    body = decode_body(await read_body(request), _UPDATE_DECODER)
    store = request.app[STORE]
    caller = tenant_of(request)

    async def update(tenant: TenantRecord, record: WorkRecord) -> web.Response:
        _DEPLOYMENT_CHANGES.check(body)  # once the deployment is known to be there
        # Exactly, or not at all: the spec is stored again, and a tolerant read would
        # drop the fields a newer greenfed wrote.
        stored = exact_spec(DEPLOYMENTS.decoder, record)
        if body.model_id is None and body.rollout is not None:
            raise invalid_body("$.rollout", "a rollout needs the new model_id")
        # The count first: a new canary is checked against the replicas it will run on,
        # and one in progress comes down with them (scaled_spec).
        spec = _scaled(stored, body)
        if body.model_id is not None:
            if await store.get_model(tenant.tenant_id, body.model_id) is None:
                raise invalid_body(
                    "$.model_id",
                    f"no model {body.model_id!r}: upload it first with POST /v1/models",
                )
            if body.rollout is not None:
                spec = msgspec.structs.replace(
                    spec, canary=_canary(spec, body.model_id, body.rollout)
                )
            else:
                spec = msgspec.structs.replace(spec, model_id=body.model_id, canary=None)
        if body.batching is not None:
            spec = msgspec.structs.replace(spec, batching=body.batching)
        spec, rollout_ended = rollout_after_update(
            record, stored, spec, new_model=body.model_id is not None, by=caller.name
        )
        updated = await store.update_spec(
            tenant.tenant_id,
            record.work_id,
            encode_spec(spec),
            expected_version=record.version,
            audit=(
                audit_entry(
                    request,
                    "work.update",
                    record.work_id,
                    tenant=tenant.name,
                    kind=DEPLOYMENTS.noun,
                    changes=_given(body),
                )
                if caller.admin
                else None
            ),
        )
        if rollout_ended is not None:
            await store.record_event(rollout_ended)
        allocations = await store.work_allocations(tenant.tenant_id, record.work_id)
        return json_response(DEPLOYMENTS.detail(updated, spec, tenant.name, allocations))

    return await _change_live_work(request, DEPLOYMENTS, "updated", update, any_tenant=True)


def rollout_after_update(
    record: WorkRecord, stored: DeploymentSpec, updated: DeploymentSpec, *, new_model: bool, by: str
) -> tuple[DeploymentSpec, NewEvent | None]:
    """`updated` with what becomes of the rollout `stored` (the spec of `record`) had, and
    the `work.rollout` event to record once it is stored, where the update ends it: the
    one step of PATCH /v1/deployments/{id} and of apply by name (cloud/api/apply.py). A
    new model replaces it, superseded (`updated` keeps the canary of its own, or none);
    else it goes on at the new count, in proportion (`scaled_canary`), and a deployment
    left below 2 replicas has no room for one (rolled back, as the loop does when the
    autoscaler scales it so)."""
    if stored.canary is None:
        return updated, None
    if new_model:
        reason = f"replaced by a model update by {by}"
        return updated, rollout_event(record, stored, "superseded", reason)
    canary = scaled_canary(stored.canary, stored.replicas, updated.replicas)
    kept = msgspec.structs.replace(updated, canary=canary)
    if kept.replicas < ROLLOUT_MIN_REPLICAS:
        reason = f"scaled to {kept.replicas} replica"
        return settled_spec(kept, "rolled-back"), rollout_event(
            record, stored, "rolled-back", reason
        )
    return kept, None


def _given(body: DeploymentUpdate) -> dict[str, object]:
    """The fields the update sets, as asked (an explicit null included)."""
    return {
        field.name: getattr(body, field.name)
        for field in msgspec.structs.fields(body)
        if getattr(body, field.name) is not field.default
    }


async def _end_rollout(request: web.Request, outcome: str) -> web.Response:
    store = request.app[STORE]

    async def end(tenant: TenantRecord, record: WorkRecord) -> web.Response:
        spec = exact_spec(DEPLOYMENTS.decoder, record)  # stored again: exactly
        if spec.canary is None:
            raise Problem(
                409, "no-rollout", "No rollout", f"deployment {record.work_id} has no rollout"
            )
        settled = settled_spec(spec, outcome)
        updated = await store.update_spec(
            tenant.tenant_id, record.work_id, encode_spec(settled), expected_version=record.version
        )
        await store.record_event(
            rollout_event(record, spec, outcome, f"{outcome} by {tenant.name}")
        )
        allocations = await store.work_allocations(tenant.tenant_id, record.work_id)
        return json_response(DEPLOYMENTS.detail(updated, settled, tenant.name, allocations))

    return await _change_live_work(request, DEPLOYMENTS, outcome, end)


async def promote_rollout(request: web.Request) -> web.Response:
    """Promote the canary's model to every replica now."""
    return await _end_rollout(request, "promoted")


async def abort_rollout(request: web.Request) -> web.Response:
    """Roll the canary back now."""
    return await _end_rollout(request, "aborted")


ROUTES: Final = (
    _routes(JOBS, _Handlers(submit_job, list_jobs, get_job, cancel_job, explain_job))
    + _routes(
        DEPLOYMENTS,
        _Handlers(
            submit_deployment,
            list_deployments,
            get_deployment,
            cancel_deployment,
            explain_deployment,
        ),
    )
    + (
        Route(
            "PATCH",
            DEPLOYMENTS.path() + "/{id}",
            update_deployment,
            "Change a deployment's model, batching, replicas or autoscaling in place "
            "(the admin: any tenant's)",
            "tenant",
            "deployments",
            body=Annotated[
                DeploymentUpdate,
                msgspec.Meta(extra_json_schema=_DEPLOYMENT_CHANGES.json_schema()),
            ],
            description=(
                "Nodes load and warm the new model beside the old one, then switch between two "
                "batches: no request fails during the update. `replicas` scales the "
                "deployment now; `autoscale` lets the scheduler scale it on its load "
                "(null turns that off). `model_id` with `rollout` serves the new model on "
                "canary replicas first: promoted when healthy, rolled back on a breach. The "
                "admin may change any tenant's deployment (`model_id` then names a model of "
                "that tenant); the change is in the audit log (`work.update`)."
            ),
            replies=(
                Reply(200, "The deployment with its new spec", DeploymentView),
                problem_reply(409, "The deployment had already finished"),
            ),
        ),
    )
    + tuple(
        Route(
            "POST",
            DEPLOYMENTS.path() + "/{id}/rollout/" + action,
            handler,
            summary,
            "tenant",
            "deployments",
            replies=(
                Reply(200, "The deployment with its settled spec", DeploymentView),
                problem_reply(409, "No rollout in progress, or the deployment had ended"),
            ),
        )
        for action, handler, summary in (
            ("promote", promote_rollout, "Promote a canary's model to every replica now"),
            ("abort", abort_rollout, "Roll a canary back now"),
        )
    )
)
