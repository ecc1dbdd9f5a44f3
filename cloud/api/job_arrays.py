"""Job arrays over REST (docs/rest.md#job-arrays): submit one, see it, cancel it.

`POST /v1/jobs` with `array` creates one ordinary training job per index, all in one
transaction (cloud/store/job_arrays.py), and answers with the array's view. The array's
own id names no job: `GET /v1/jobs/{array id}` shows its summary state and tasks,
`DELETE /v1/jobs/{array id}` cancels every task that has not ended. A task is a job
like any other (hold, requeue, logs, cancel by its id); `ARRAYID_7` names task 7
wherever a job's id is taken (`task_id_of`, used by cloud/api/references.py).

Each task's spec is the submitted spec with `array_task` (its array, index and the
throttle) and the GREENFED_ARRAY_* variables in its env. The first task holds the
Idempotency-Key and the digest of its spec as submitted: a retry's first task, made again
under the array's id, is compared with that digest (a PATCH may have changed the task
since); where the digest cannot tell, `submitted_form` undoes what the task adds, so the
retry compares like with like.
"""

from __future__ import annotations

from typing import Final

import msgspec
from aiohttp import web

from cloud.api.audit import audit_entry
from cloud.api.auth import tenant_of
from cloud.api.bodies import invalid_body, json_response
from cloud.api.problems import Problem
from cloud.api.refusals import idempotency_key_reused, new_dependencies, queue_full
from cloud.api.stored_specs import known_spec, shown_spec, spec_unreadable
from cloud.app_keys import STORE
from cloud.secrets.redaction import redacted
from cloud.store import (
    TERMINAL_STATES,
    IllegalTransitionError,
    QueueFullError,
    TenantRecord,
    VersionConflictError,
    WorkRecord,
)
from cloud.store.ids import IdGenerator
from cloud.store.job_arrays import ArrayTaskRecord
from cloud.store.records import submitted_as
from cloud.work.array_ranges import parse_array, split_task_name
from cloud.work.array_views import (
    ArrayTaskView,
    JobArrayView,
    array_state,
    counts_text,
    state_counts,
)
from cloud.work.specs import (
    MAX_ENV_VARIABLES,
    TRAINING_DECODER,
    ArrayTaskSpec,
    TrainingJobSpec,
    encode_spec,
)
from cloud.work.views import JobView
from shared.clock import utc_from_epoch
from shared.errors import FieldError, json_path
from shared.worker_env import ARRAY_VARIABLES

_CANCEL_RETRIES: Final = 5

# Dependency rows one array submission may write: each task keeps its own copy of
# `depends_on`, so an array writes tasks x len(depends_on) rows, in the submission's write
# transaction (every other tenant's writes wait for it) and then read by every
# scheduling pass while the tasks wait (cloud/store/dependencies.py `select_waiting`).
# 20,000 is two rows for each task of the largest array (10,000 tasks waiting for two
# jobs, or 312 tasks waiting for 64): measured on SQLite they add about a second to a
# pass, half what the 10,000 tasks themselves add, where the limits alone would allow
# 640,000 rows (10,000 tasks x 64): over 30 s added to every pass, and a submission
# holding the writer for 50 s.
MAX_ARRAY_DEPENDENCY_ROWS: Final = 20_000


def refuse_array_task(spec: TrainingJobSpec) -> None:
    """A submission never names its own task: greenfed sets `array_task`."""
    if spec.array_task is not None:
        raise invalid_body(
            "$.array_task", "is set by greenfed on the tasks of an array; submit `array` instead"
        )


def _refuse_full_env(spec: TrainingJobSpec) -> None:
    """Each task's env holds the GREENFED_ARRAY_* variables besides the submitted ones,
    within the same limit: a 422 on the submitted env now, not a task stored unreadable."""
    room = MAX_ENV_VARIABLES - len(ARRAY_VARIABLES)
    if len(spec.env) > room:
        raise invalid_body(
            "$.env",
            f"has {len(spec.env)} variables; an array's has at most {room}: each task's env "
            f"gets the {len(ARRAY_VARIABLES)} GREENFED_ARRAY_* variables too, within "
            f"{MAX_ENV_VARIABLES}",
        )


def _refuse_many_dependencies(spec: TrainingJobSpec, task_count: int) -> None:
    """Each task waits for every job of `depends_on`, a row per task and job: a 422 on
    `depends_on` now where the array would write more than MAX_ARRAY_DEPENDENCY_ROWS."""
    rows = task_count * len(spec.depends_on)
    if rows > MAX_ARRAY_DEPENDENCY_ROWS:
        raise invalid_body(
            "$.depends_on",
            f"names {len(spec.depends_on)} jobs for each of the array's {task_count} "
            f"tasks, {rows} dependencies; an array has at most {MAX_ARRAY_DEPENDENCY_ROWS} "
            "(tasks x depends_on): wait for fewer jobs (one job that waits for the others), "
            "or submit the array in parts",
        )


def task_specs(spec: TrainingJobSpec, array_id: str) -> list[tuple[int, TrainingJobSpec]]:
    """The spec of every task of the array `spec` asks for, by index (a 422 where a task
    would break a limit of the spec, or the array one of its own)."""
    assert spec.array is not None
    _refuse_full_env(spec)
    asked = parse_array(spec.array)
    _refuse_many_dependencies(spec, asked.count)
    shared_env = {
        "GREENFED_ARRAY_JOB_ID": array_id,
        "GREENFED_ARRAY_TASK_COUNT": str(asked.count),
        "GREENFED_ARRAY_TASK_MIN": str(asked.indices[0]),
        "GREENFED_ARRAY_TASK_MAX": str(asked.indices[-1]),
    }
    return [
        (
            index,
            msgspec.structs.replace(
                spec,
                array=None,
                array_task=ArrayTaskSpec(
                    array_id=array_id,
                    array=spec.array,
                    index=index,
                    count=asked.count,
                    throttle=asked.throttle,
                ),
                env={**spec.env, **shared_env, "GREENFED_ARRAY_TASK_ID": str(index)},
            ),
        )
        for index in asked.indices
    ]


def _task_documents(tasks: list[tuple[int, TrainingJobSpec]]) -> list[tuple[int, bytes]]:
    """Each task's spec as stored. The tasks are made with `msgspec.structs.replace`,
    which checks no limit of the spec: the last (its index the longest) is read back as
    every stored spec is, so none is stored that no view nor pass could read."""
    documents = [(index, encode_spec(task)) for index, task in tasks]
    try:
        TRAINING_DECODER.decode(documents[-1][1])
    except msgspec.ValidationError as error:
        refused = FieldError.from_msgspec(error)
        raise invalid_body(json_path(refused.path), refused.reason) from None
    return documents


def _submitted_task(record: WorkRecord) -> TrainingJobSpec | None:
    """The spec of `record` when it is a task of an array, exactly as stored (compared
    with a retry's); None: anything else (a deployment's key, a single job, or a spec
    this greenfed cannot read, which is no retry of what it is asked now either)."""
    if record.kind != "training":
        return None
    try:
        spec = TRAINING_DECODER.decode(record.spec)
    except (msgspec.DecodeError, ValueError):
        return None
    return spec if spec.array_task is not None else None


def submitted_form(task: TrainingJobSpec) -> TrainingJobSpec:
    """The spec of the array submission a task was made from."""
    if task.array_task is None:
        return task
    env = {name: value for name, value in task.env.items() if name not in ARRAY_VARIABLES}
    return msgspec.structs.replace(task, array=task.array_task.array, array_task=None, env=env)


async def submit_array(
    request: web.Request, tenant: TenantRecord, spec: TrainingJobSpec, key: str | None
) -> web.Response:
    """Create every task of the array `spec` asks for (its stored form), or none."""
    array_id = IdGenerator().new_id()
    tasks = _task_documents(task_specs(spec, array_id))
    store = request.app[STORE]
    try:
        result = await store.submit_array(
            tenant.tenant_id,
            array_id,
            tasks=tasks,
            priority=spec.priority,
            idempotency_key=key,
            dependencies=new_dependencies(spec),
        )
    except QueueFullError as error:
        raise queue_full(
            tenant,
            error,
            f"the array's {len(tasks)} tasks do not fit (each task counts); submit again "
            "once some have started, or cancel some",
        ) from None
    first = result.work
    earlier = _submitted_task(first)  # the key may be a deployment's, or a single job's
    if not result.created and (earlier is None or not _same_array(first, earlier, spec)):
        # The key's work is seen where this retry's would be: an array's by its id.
        task = None if earlier is None else earlier.array_task
        shown = first.work_id if task is None else task.array_id
        raise idempotency_key_reused(key, first, f"/v1/jobs/{shown}", same_kind=earlier is not None)
    assert earlier is not None  # created: one of the tasks just made
    assert earlier.array_task is not None
    found = await store.array_tasks(tenant.tenant_id, earlier.array_task.array_id)
    response = json_response(array_view(found, tenant.name), status=201 if result.created else 200)
    response.headers["Location"] = f"/v1/jobs/{earlier.array_task.array_id}"
    return response


def _same_array(first: WorkRecord, earlier: TrainingJobSpec, spec: TrainingJobSpec) -> bool:
    """Whether `spec` is the array submission whose first task is `first` (its spec
    `earlier`): the retry's first task is made again under that array's id and compared
    with the digest of the task as submitted; where the digest cannot tell, the task's
    submitted form with the retry."""
    assert earlier.array_task is not None
    _, retried_first = task_specs(spec, earlier.array_task.array_id)[0]
    verdict = submitted_as(first, encode_spec(retried_first))
    return submitted_form(earlier) == spec if verdict is None else verdict


def _as_index(task: TrainingJobSpec, index: int) -> TrainingJobSpec:
    """`task` as task `index` of its array was made from the same submission."""
    assert task.array_task is not None
    return msgspec.structs.replace(
        task,
        array_task=msgspec.structs.replace(task.array_task, index=index),
        env={**task.env, "GREENFED_ARRAY_TASK_ID": str(index)},
    )


def _as_submitted(tasks: tuple[ArrayTaskRecord, ...]) -> tuple[WorkRecord, TrainingJobSpec]:
    """A task whose spec is still as the array was submitted (a PATCH changes one task,
    never the array), with its spec: the first such by index. The first task keeps the
    digest of its spec as submitted: a task remade as the first that has that digest is
    as submitted. Where nothing tells (an array stored before the digest was kept
    without a key) or every task was changed since, the first task."""
    first = tasks[0].work
    first_spec = shown_spec(TRAINING_DECODER, first)
    if first_spec.array_task is None:  # no task as this version reads it
        raise spec_unreadable(first)
    if first.submitted_spec_sha256 is None or submitted_as(first, first.spec):
        return first, first_spec
    first_index = first_spec.array_task.index
    for task in tasks[1:]:
        spec = known_spec(TRAINING_DECODER, task.work)
        if spec is None or spec.array_task is None:
            continue
        if submitted_as(first, encode_spec(_as_index(spec, first_index))):
            return task.work, spec
    return first, first_spec


def array_view(tasks: tuple[ArrayTaskRecord, ...], tenant: str) -> JobView:
    """The view of an array with these tasks (at least one): a job view whose state is
    the array's summary, its spec (and the fields from it) the submitted one, its
    `array` the tasks."""
    first = tasks[0].work
    shown, spec = _as_submitted(tasks)
    assert spec.array_task is not None
    states = [task.work.state for task in tasks]
    counts = state_counts(states)
    throttle = spec.array_task.throttle
    limit = "" if throttle is None else f" (at most {throttle} placed at once)"
    submitted = submitted_form(spec)
    return JobView(
        id=tasks[0].array_id,
        name=spec.name,
        tenant=tenant,
        priority=shown.priority,
        state=array_state(states),
        reason=f"array of {len(tasks)} tasks: {counts_text(counts)}{limit}",
        attempts=sum(task.work.attempts for task in tasks),
        version=sum(task.work.version for task in tasks),
        submitted_at=utc_from_epoch(first.submitted_at),
        updated_at=utc_from_epoch(max(task.work.updated_at for task in tasks)),
        workers=spec.workers,
        accelerators_per_worker=spec.accelerators_per_worker,
        accelerator_kind=spec.accelerator_kind,
        failures=sum(task.work.failures for task in tasks),
        array_id=tasks[0].array_id,
        idempotency_key=first.idempotency_key,
        nodes=(),
        allocations=(),
        spec=redacted(submitted),
        array=JobArrayView(
            id=tasks[0].array_id,
            array=spec.array_task.array,
            count=len(tasks),
            throttle=throttle,
            state=array_state(states),
            states=counts,
            tasks=tuple(
                ArrayTaskView(
                    index=task.index,
                    id=task.work.work_id,
                    state=task.work.state,
                    reason=task.work.state_reason,
                    attempts=task.work.attempts,
                )
                for task in tasks
            ),
        ),
    )


async def _array_of(
    request: web.Request, array_id: str
) -> tuple[TenantRecord, tuple[ArrayTaskRecord, ...]] | None:
    """The caller's array (the admin: any tenant's) with its tenant; None: no such array."""
    caller = tenant_of(request)
    store = request.app[STORE]
    tasks = await store.array_tasks(None if caller.admin else caller.tenant_id, array_id)
    if not tasks:
        return None
    owner = tasks[0].work.tenant_id
    if owner == caller.tenant_id:
        return caller, tasks
    return (await store.get_tenant(owner) or caller), tasks


async def get_array(request: web.Request, array_id: str) -> web.Response | None:
    """`GET /v1/jobs/{array id}`: the array's view; None: no array of the caller's."""
    found = await _array_of(request, array_id)
    if found is None:
        return None
    tenant, tasks = found
    return json_response(array_view(tasks, tenant.name))


async def cancel_array(request: web.Request, array_id: str) -> web.Response | None:
    """`DELETE /v1/jobs/{array id}`: cancel every task that has not ended, in one
    transaction; None: no array of the caller's. 409 when every task had ended."""
    caller = tenant_of(request)
    store = request.app[STORE]
    for _ in range(_CANCEL_RETRIES):
        found = await _array_of(request, array_id)
        if found is None:
            return None
        tenant, tasks = found
        live = [task.work for task in tasks if task.work.state not in TERMINAL_STATES]
        if not live:
            raise Problem(
                409,
                "already-finished",
                "Job already finished",
                f"every task of array {array_id} has ended; only pending, scheduled or "
                "running work can be cancelled",
            )
        by_admin = tenant.tenant_id != caller.tenant_id
        try:
            await store.cancel_many(
                tenant.tenant_id,
                live,
                reason=f"cancelled by admin {caller.name}"
                if by_admin
                else "cancelled by the tenant",
                actor=caller.name,
                audit=(
                    audit_entry(
                        request,
                        "work.cancel",
                        array_id,
                        tenant=tenant.name,
                        kind="job array",
                        tasks=[task.work_id for task in live],
                    )
                    if caller.admin
                    else None
                ),
            )
        except (VersionConflictError, IllegalTransitionError):
            continue  # a task moved meanwhile: look again
        after = await store.array_tasks(tenant.tenant_id, array_id)
        return json_response(array_view(after, tenant.name))
    raise Problem(
        409,
        "changing",
        "Changing too fast",
        f"job array {array_id} changed on every attempt to have it cancelled; retry",
    )


async def task_id_of(request: web.Request, reference: str, *, any_tenant: bool) -> str | None:
    """The job id of the task `reference` names (``ARRAYID_7``) among the caller's arrays
    (with `any_tenant`, the admin's reach: every tenant's); None: it names none."""
    named = split_task_name(reference)
    if named is None:
        return None
    caller = tenant_of(request)
    scope = None if any_tenant and caller.admin else caller.tenant_id
    return await request.app[STORE].array_task_id(scope, *named)
