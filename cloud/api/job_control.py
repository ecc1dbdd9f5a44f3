"""Job control: hold, release, suspend, resume and requeue a training job, and change a
queued one (`PATCH /v1/jobs/{id}`), as Slurm's `scontrol hold/release/requeue` and
Kueue's `suspend` do.

What each action does to the job (the store's side is cloud/store/job_control.py):

- hold (pending work): it stays pending, out of the queue: "held by NAME";
- release (held work): queued again;
- suspend (pending work; or scheduled or running work that saves checkpoints): placed
  work stops as on a preemption, its checkpoint kept; pending, out of the queue:
  "suspended by NAME";
- resume (suspended work): queued again; placed, it resumes from its newest checkpoint;
- requeue (scheduled or running work): stopped and queued again, as on a preemption (a
  job that checkpoints resumes, others start over); never uses up `store.max_attempts`;
- PATCH (pending and never placed): a new priority, resources, deadline or start window,
  checked as a submission is; what it sends that the job already has changes nothing
  (the job keeps its version, and no event or audit entry names it).

Anything else is a 409 problem whose detail says why and what to do instead. The admin
may control any tenant's job. Every action is in the audit log and the event stream
(`work.hold`, `work.state`, `work.updated`, each naming the actor).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Final

import msgspec
from aiohttp import web

from cloud.access.views import AuditAction
from cloud.api.audit import audit_entry
from cloud.api.auth import tenant_of
from cloud.api.bodies import PatchFields, decode_body, json_response, read_body
from cloud.api.problems import Problem, problem_reply
from cloud.api.refusals import refused_now
from cloud.api.routes import Reply, Route
from cloud.api.stored_specs import exact_spec, shown_spec
from cloud.api.work import (
    JOBS,
    _change_live_work,
    _check_schedulable,
    _check_times_as_sent,
    check_priority,
)
from cloud.app_keys import STORE
from cloud.store import NewAudit, TenantRecord, WorkRecord
from cloud.store.states import PLACED_STATES, HoldKind
from cloud.work.spec_changes import spec_changes
from cloud.work.specs import (
    TRAINING_DECODER,
    Deadline,
    Gib,
    StartWindowText,
    TrainingJobSpec,
    encode_spec,
)
from cloud.work.views import JobView
from shared.messages import AcceleratorKind
from shared.work_literals import PriorityClass

_SPEC_OBJECT: Final = msgspec.json.Decoder(dict[str, object])


def _refused(kind: str, title: str, detail: str) -> Problem:
    return Problem(409, kind, title, detail)


def _who(caller: TenantRecord, owner: TenantRecord) -> str:
    """How a reason names who acted: the tenant, or the admin acting for it."""
    return f"admin {caller.name}" if caller.tenant_id != owner.tenant_id else caller.name


def _checkpoints(record: WorkRecord) -> bool:
    return shown_spec(TRAINING_DECODER, record).checkpoint_interval_s is not None


def _state_words(record: WorkRecord) -> str:
    if record.state == "pending" and record.hold is not None:
        return record.hold
    return record.state


async def _control(
    request: web.Request,
    done: str,
    change: Callable[[TenantRecord, TenantRecord, WorkRecord], Awaitable[WorkRecord | None]],
) -> web.Response:
    """Apply `change(caller, owner, record)` to the job at the version just read (the
    admin: any tenant's); it returns the job as it now is, or None
    when there was nothing to change (holding a held job)."""
    store = request.app[STORE]
    caller = tenant_of(request)

    async def apply(owner: TenantRecord, record: WorkRecord) -> web.Response:
        changed = await change(caller, owner, record) or record
        allocations = await store.work_allocations(owner.tenant_id, record.work_id)
        spec = shown_spec(TRAINING_DECODER, changed)
        return json_response(JOBS.detail(changed, spec, owner.name, allocations))

    return await _change_live_work(request, JOBS, done, apply, any_tenant=True)


def _audit(
    request: web.Request, action: AuditAction, owner: TenantRecord, record: WorkRecord
) -> NewAudit:
    return audit_entry(
        request, action, record.work_id, tenant=owner.name, kind=JOBS.noun, state=record.state
    )


async def hold_job(request: web.Request) -> web.Response:
    """Keep a pending job out of the queue until it is released."""

    async def hold(
        caller: TenantRecord, owner: TenantRecord, record: WorkRecord
    ) -> WorkRecord | None:
        if record.state != "pending":
            raise _refused(
                "not-pending",
                "Only a pending job can be held",
                f"job {record.work_id} is {record.state}: only a pending job can be held; "
                "suspend it (if it saves checkpoints) or requeue it to stop it",
            )
        if record.hold == "held":
            return None
        if record.hold == "suspended":
            raise _refused(
                "suspended",
                "The job is suspended",
                f"job {record.work_id} is suspended: it is out of the queue already; "
                "resume it to queue it again",
            )
        return await request.app[STORE].set_hold(
            owner.tenant_id, record.work_id, "held",
            reason=f"held by {_who(caller, owner)}", actor=caller.name,
            expected_version=record.version, audit=_audit(request, "work.hold", owner, record),
        )  # fmt: skip

    return await _control(request, "held", hold)


async def _lift(request: web.Request, hold: HoldKind, verb: str, other: str) -> web.Response:
    async def lift(caller: TenantRecord, owner: TenantRecord, record: WorkRecord) -> WorkRecord:
        if record.state != "pending" or record.hold != hold:
            hint = f"; {other} it instead" if record.hold not in (None, hold) else ""
            raise _refused(
                f"not-{hold}",
                f"The job is not {hold}",
                f"job {record.work_id} is {_state_words(record)}, not {hold}: nothing to "
                f"{verb}{hint}",
            )
        action: AuditAction = "work.release" if hold == "held" else "work.resume"
        return await request.app[STORE].set_hold(
            owner.tenant_id, record.work_id, None,
            reason=f"{verb}d by {_who(caller, owner)}", actor=caller.name,
            expected_version=record.version, audit=_audit(request, action, owner, record),
        )  # fmt: skip

    return await _control(request, f"{verb}d", lift)


async def release_job(request: web.Request) -> web.Response:
    """Queue a held job again."""
    return await _lift(request, "held", "release", "resume")


async def resume_job(request: web.Request) -> web.Response:
    """Queue a suspended job again; placed, it resumes from its newest checkpoint."""
    return await _lift(request, "suspended", "resume", "release")


async def suspend_job(request: web.Request) -> web.Response:
    """Stop a job that saves checkpoints (or keep a pending one from starting) until it is
    resumed."""

    async def suspend(
        caller: TenantRecord, owner: TenantRecord, record: WorkRecord
    ) -> WorkRecord | None:
        store = request.app[STORE]
        reason = f"suspended by {_who(caller, owner)}"
        audit = _audit(request, "work.suspend", owner, record)
        if record.state == "pending":
            if record.hold == "suspended":
                return None
            if record.hold == "held":
                raise _refused(
                    "held",
                    "The job is held",
                    f"job {record.work_id} is held: it is out of the queue already; "
                    "release it first to suspend it",
                )
            return await store.set_hold(
                owner.tenant_id, record.work_id, "suspended", reason=reason,
                actor=caller.name, expected_version=record.version, audit=audit,
            )  # fmt: skip
        if record.state in PLACED_STATES and not _checkpoints(record):
            raise _refused(
                "not-checkpointing",
                "The job does not save checkpoints",
                f"job {record.work_id} does not save checkpoints (no checkpoint_interval_s): "
                "suspending it would lose its progress; cancel it, or requeue it to start "
                "it over",
            )
        result = await store.requeue_placed(
            owner.tenant_id, record.work_id, hold="suspended",
            reason=f"{reason}; resumes from its newest checkpoint", actor=caller.name,
            expected_version=record.version, audit=audit,
        )  # fmt: skip
        return result.work[0]

    return await _control(request, "suspended", suspend)


def _queued_how(record: WorkRecord) -> str:
    """What a pending job needs to be queued: a held or suspended one is out of the
    queue, and only lifting its hold queues it again."""
    if record.hold == "held":
        return "a held one is out of the queue: release it to queue it again"
    if record.hold == "suspended":
        return "a suspended one is out of the queue: resume it to queue it again"
    return "a pending one is in the queue already"


async def requeue_job(request: web.Request) -> web.Response:
    """Stop a scheduled or running job and queue it again, as a preemption would."""

    async def requeue(caller: TenantRecord, owner: TenantRecord, record: WorkRecord) -> WorkRecord:
        if record.state not in PLACED_STATES:
            raise _refused(
                "not-placed",
                "Only a scheduled or running job can be requeued",
                f"job {record.work_id} is {_state_words(record)}: only a scheduled or "
                f"running job can be requeued; {_queued_how(record)}",
            )
        then = "resumes from its newest checkpoint" if _checkpoints(record) else "starts over"
        result = await request.app[STORE].requeue_placed(
            owner.tenant_id, record.work_id, reason=f"requeued by {_who(caller, owner)}; {then}",
            actor=caller.name, expected_version=record.version,
            audit=_audit(request, "work.requeue", owner, record),
        )  # fmt: skip
        return result.work[0]

    return await _control(request, "requeued", requeue)


# ---- PATCH /v1/jobs/{id} -------------------------------------------------------------------


class JobUpdate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What may change in a queued job (pending, never placed); each field as in the spec.
    `deadline` and `start_window` take null to drop them."""

    priority: PriorityClass | msgspec.UnsetType = msgspec.UNSET
    workers: Annotated[int, msgspec.Meta(ge=1, le=1024)] | msgspec.UnsetType = msgspec.UNSET
    accelerators_per_worker: Annotated[int, msgspec.Meta(ge=1, le=64)] | msgspec.UnsetType = (
        msgspec.UNSET
    )
    accelerator_kind: AcceleratorKind | msgspec.UnsetType = msgspec.UNSET
    memory_gib: Gib | msgspec.UnsetType = msgspec.UNSET
    host_memory_gib: Gib | msgspec.UnsetType = msgspec.UNSET
    cpus_per_worker: Annotated[int, msgspec.Meta(ge=0, le=4096)] | msgspec.UnsetType = msgspec.UNSET
    estimated_duration_s: (
        Annotated[float, msgspec.Meta(gt=0, le=365 * 86400.0)] | msgspec.UnsetType
    ) = msgspec.UNSET
    deadline: Deadline | msgspec.UnsetType | None = msgspec.UNSET
    start_window: StartWindowText | msgspec.UnsetType | None = msgspec.UNSET


_UPDATE_DECODER: Final = msgspec.json.Decoder(JobUpdate)
_JOB_CHANGES: Final = PatchFields(present=JobUpdate.__struct_fields__)
_SPEC_ENCODER: Final = msgspec.json.Encoder()


def _given(body: JobUpdate) -> dict[str, object]:
    return {
        name: getattr(body, name)
        for name in body.__struct_fields__
        if getattr(body, name) is not msgspec.UNSET
    }


def _patched(spec: TrainingJobSpec, given: dict[str, object]) -> TrainingJobSpec:
    """The spec with the given fields, checked as a submission's is (a 422 names the
    field at fault: the body's fields carry the spec's names)."""
    document = _SPEC_OBJECT.decode(encode_spec(spec))
    document.update(msgspec.to_builtins(given))
    for name, value in given.items():
        if value is None:
            del document[name]
    return decode_body(_SPEC_ENCODER.encode(document), TRAINING_DECODER)


async def update_job(request: web.Request) -> web.Response:
    """Change a queued job's priority, resources, deadline or start window."""
    raw = await read_body(request)
    body = decode_body(raw, _UPDATE_DECODER)

    async def update(
        caller: TenantRecord, owner: TenantRecord, record: WorkRecord
    ) -> WorkRecord | None:
        _JOB_CHANGES.check(body)  # once the job is known to be there
        if record.state != "pending" or record.attempts > 0:
            ran = "is " + record.state if record.state != "pending" else "has run before"
            raise _refused(
                "job-started",
                "A started job cannot change",
                f"job {record.work_id} {ran} (attempt {record.attempts}): its spec can no "
                "longer change; cancel it and submit a new one, or requeue it to run it "
                "again as it is",
            )
        given = _given(body)
        # Read exactly: the fields a newer greenfed wrote would be lost, stored again.
        stored = exact_spec(TRAINING_DECODER, record)
        spec = _patched(stored, given)
        changed = tuple(change.field for change in spec_changes(stored, spec))
        if not changed:
            return None  # what was sent is what the job has: no new version, no event
        if "deadline" in given and given["deadline"] is not None:
            _check_times_as_sent(raw, spec)
        if "priority" in changed:  # the class it has, it keeps (check_priority)
            check_priority(owner, spec.priority)
        _check_schedulable(spec)
        refused = await refused_now(request, spec, owner, time.time())
        if refused is not None:
            raise refused
        return await request.app[STORE].update_queued(
            owner.tenant_id, record.work_id, spec=encode_spec(spec), priority=spec.priority,
            changed_fields=changed, actor=caller.name, expected_version=record.version,
            audit=audit_entry(
                request, "work.update", record.work_id, tenant=owner.name, kind=JOBS.noun,
                changes={name: value for name, value in given.items() if name in changed},
            ),
        )  # fmt: skip

    return await _control(request, "changed", update)


# ---- routes --------------------------------------------------------------------------------

_ACTIONS: Final = (
    (
        "hold",
        hold_job,
        "Hold a pending job: it stays pending, out of the queue, until released",
        "The job is not pending, or is suspended",
    ),
    ("release", release_job, "Release a held job: it is queued again", "The job is not held"),
    (
        "suspend",
        suspend_job,
        "Suspend a job: a running one that saves checkpoints stops; pending until resumed",
        "The job does not save checkpoints, or is held",
    ),
    (
        "resume",
        resume_job,
        "Resume a suspended job: queued again, it continues from its newest checkpoint",
        "The job is not suspended",
    ),
    (
        "requeue",
        requeue_job,
        "Requeue a scheduled or running job: stopped and queued again, as on a preemption",
        "The job is not scheduled or running",
    ),
)

_ACTION_ROUTES: Final = tuple(
    Route(
        "POST",
        JOBS.path() + "/{id}/" + action,
        handler,
        summary + " (the admin: any tenant's)",
        "tenant",
        "jobs",
        description=(
            "Recorded in the audit log; the job's `reason` and its `work.hold` or "
            "`work.state` event name who asked (docs/rest.md#job-control)."
        ),
        replies=(
            Reply(200, "The job as it now is", JobView),
            problem_reply(409, refusal + ", had already finished, or is a job array (`job-array`)"),
        ),
    )
    for action, handler, summary, refusal in _ACTIONS
)

ROUTES: Final = (
    *_ACTION_ROUTES,
    Route(
        "PATCH",
        JOBS.path() + "/{id}",
        update_job,
        "Change a queued job's priority, resources, deadline or start window "
        "(the admin: any tenant's)",
        "tenant",
        "jobs",
        body=Annotated[JobUpdate, msgspec.Meta(extra_json_schema=_JOB_CHANGES.json_schema())],
        description=(
            "Only a job that is pending and has never been placed; checked as a submission "
            "is (a 422 names the field at fault, a 403 a priority class the tenant may not "
            "use). A `work.updated` event names the fields that changed; the audit log "
            "records the change (`work.update`). Fields sent as the job has them change "
            "nothing: with no other, the job is answered as it is (same version, no event)."
        ),
        replies=(
            Reply(200, "The job with its new spec", JobView),
            problem_reply(403, "The priority class is not allowed for this tenant"),
            problem_reply(
                409,
                "The job has started (or ended): cancel and resubmit; or the id is a job "
                "array's (`job-array`): change its tasks one by one",
            ),
        ),
    ),
)
