"""Declarative work: apply a spec by name, and dry runs that store nothing.

- `PUT /v1/jobs/{name}` and `PUT /v1/deployments/{name}` (`greenfed apply`): create the
  tenant's work of that name, or bring the live one in line with the spec. A deployment
  changes in place where it can (model, batching, replicas, autoscale: as PATCH does);
  a queued job (pending, never placed) takes what PATCH /v1/jobs/{id} takes; a started
  job is immutable, and the 409 says what to do instead. Applying the spec of ended work
  again changes nothing; another spec under an ended name is new work. `dry_run=true`
  answers what would be done, changing nothing (`greenfed diff`).
- `POST /v1/jobs/dry-run` and `POST /v1/deployments/dry-run` (`greenfed submit
  --dry-run`): every check a submission makes, then where the scheduler would place the
  work now (cloud/loop/dry_run.py).

Names are the tenant's own: the admin applies in its own tenant too. An update is in
the audit log (`work.update`) and is a `work.updated` event (a queued job's names the
fields that changed); nothing of a dry run is.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

import msgspec
from aiohttp import web

from cloud.api.audit import audit_entry
from cloud.api.auth import tenant_of
from cloud.api.bodies import invalid_body, json_response, read_body
from cloud.api.problems import Problem, problem_reply
from cloud.api.query import parse_query
from cloud.api.references import ambiguous_problem, dependencies_by_id
from cloud.api.refusals import job_array_refused, new_dependencies, queue_full, refused_now
from cloud.api.routes import Handler, Reply, Route
from cloud.api.stored_specs import exact_spec, known_spec, shown_spec
from cloud.api.work import (
    DEPLOYMENTS,
    JOBS,
    OWN_IDEMPOTENCY_PREFIX,
    Collection,
    SpecT,
    accepted_spec,
    check_admissible,
    check_priority,
    rollout_after_update,
)
from cloud.app_keys import REGISTRY, SCHEDULER, SETTINGS, STORE
from cloud.loop.dry_run import dry_run_explanation, dry_run_fair_share
from cloud.scheduler import DEFAULT_POLICY
from cloud.store import (
    TERMINAL_STATES,
    IllegalTransitionError,
    NewEvent,
    QueueFullError,
    TenantRecord,
    VersionConflictError,
    WorkRecord,
)
from cloud.store.work_lookup import NamedArray
from cloud.work.apply_views import ApplyView, DryRunView
from cloud.work.lookup import SHOWN_CANDIDATES, Ambiguous, by_name
from cloud.work.spec_changes import (
    IN_PLACE_DEPLOYMENT_FIELDS,
    QUEUED_JOB_FIELDS,
    FieldChange,
    applied_in_place,
    not_in_place,
    spec_changes,
)
from cloud.work.specs import DeploymentSpec, TrainingJobSpec, WorkSpec, encode_spec
from shared.errors import FieldError, json_path
from shared.problems import InvalidParam

_CHANGE_RETRIES: Final = 5


class DryRunQuery(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    dry_run: bool = False


# ---- dry runs ----------------------------------------------------------------------------


async def _placement(
    request: web.Request, collection: Collection[SpecT], tenant: TenantRecord, spec: SpecT
) -> DryRunView:
    """Where `spec` would go if submitted now (a pass that commits nothing)."""
    app = request.app
    policy = await app[SCHEDULER].current_policy() if SCHEDULER in app else DEFAULT_POLICY
    store = await app[STORE].load_snapshot()
    nodes = app[REGISTRY].nodes()
    fair_share = await dry_run_fair_share(app[STORE], app[SETTINGS].scheduling, app.get(SCHEDULER))
    explanation = await asyncio.to_thread(
        dry_run_explanation,
        time.time(),
        nodes,
        store,
        tenant_id=tenant.tenant_id,
        kind=collection.store_kind,
        spec=spec,
        policy=policy,
        fair_share=fair_share,
    )
    waits_for = tuple(dependency.job for dependency in spec.depends_on)
    message = (
        "Not looked at: the scheduler would not queue it."
        if explanation is None
        else explanation.message
    )
    if waits_for:
        message = f"Once {', '.join(waits_for)} ended as asked: {message}"
    return DryRunView(
        kind=collection.spec_kind,
        name=spec.name,
        message=message,
        explanation=explanation,
        waits_for=waits_for,
    )


def _refuse_array(spec: WorkSpec, doing: str) -> None:
    """A job array is many jobs, created together (cloud/api/job_arrays.py): neither one
    name's work nor one placement."""
    if isinstance(spec, TrainingJobSpec) and spec.array is not None:
        raise invalid_body(
            "$.array",
            f"{doing} takes single jobs, not job arrays: submit the array with POST /v1/jobs "
            "(greenfed submit); its tasks are then reached as ARRAYID_INDEX",
        )


async def _dry_run(request: web.Request, collection: Collection[SpecT]) -> web.Response:
    tenant = tenant_of(request)
    spec = accepted_spec(request, collection, await read_body(request), tenant)
    check_priority(tenant, spec.priority)  # a dry run is of new work
    _refuse_array(spec, "a dry run")
    spec = await dependencies_by_id(request, spec)
    await check_admissible(request, spec, tenant)
    return json_response(await _placement(request, collection, tenant, spec))


async def dry_run_job(request: web.Request) -> web.Response:
    return await _dry_run(request, JOBS)


async def dry_run_deployment(request: web.Request) -> web.Response:
    return await _dry_run(request, DEPLOYMENTS)


# ---- apply -------------------------------------------------------------------------------


def _refused(slug: str, title: str, detail: str, fields: tuple[str, ...] = ()) -> Problem:
    return Problem(
        409, slug, title, detail, tuple(InvalidParam(f"$.{field}", detail) for field in fields)
    )


async def _named(
    request: web.Request, collection: Collection[SpecT], tenant: TenantRecord, name: str
) -> tuple[WorkRecord | None, WorkRecord | None]:
    """(the live work of that name, else None; the newest ended one, else None). A job
    array's tasks are one match, as everywhere a name is taken (cloud/work/lookup.py):
    the name of a live array is a 409 naming it once, however many tasks it has."""
    store = request.app[STORE]
    live = await store.live_work_named(
        tenant.tenant_id, collection.store_kind, name, limit=SHOWN_CANDIDATES + 1
    )
    found = by_name(name, live.work, (), live.arrays)
    if isinstance(found, Ambiguous):
        raise ambiguous_problem(collection.noun, found)
    if found is not None:
        return found, None
    if live.arrays:
        raise _array_named(name, live.arrays[0])
    newest = await store.work_matching(tenant.tenant_id, collection.store_kind, name=name, limit=1)
    return None, newest[0] if newest else None


def _created_meanwhile(ended: WorkRecord | None) -> bool:
    """Whether the "newest" work of the name is live after all: created by a concurrent
    apply between `_named`'s two reads. Taken as ended, it would give a second creation
    key, and the name two jobs; the caller looks again instead."""
    return ended is not None and ended.state not in TERMINAL_STATES


def _array_named(name: str, array: NamedArray) -> Problem:
    """The 409 of applying the name of a live job array: apply takes single jobs, and
    the array's tasks are changed one by one (PATCH /v1/jobs/ARRAYID_INDEX)."""
    tasks = "1 task" if array.live_tasks == 1 else f"{array.live_tasks} tasks"
    detail = (
        f"job {name} is job array {array.array_id} ({tasks} not ended), "
        "which apply does not change: cancel it (greenfed cancel "
        f"{array.array_id}) and apply again, apply it under a new name, or change its "
        f"tasks one by one (PATCH /v1/jobs/{array.array_id}_INDEX)"
    )
    return job_array_refused("A job array is not applied", detail)


def _view(
    record: WorkRecord | None,
    collection: Collection[SpecT],
    spec: WorkSpec,
    *,
    action: str,
    dry_run: bool,
    message: str,
    changes: tuple[FieldChange, ...] = (),
    placement: DryRunView | None = None,
) -> ApplyView:
    return ApplyView(
        action=action,  # type: ignore[arg-type]
        dry_run=dry_run,
        kind=collection.spec_kind,
        name=spec.name,
        id=None if record is None else record.work_id,
        state=None if record is None else record.state,
        message=message,
        changes=changes,
        placement=placement,
    )


async def _create(
    request: web.Request,
    collection: Collection[SpecT],
    tenant: TenantRecord,
    spec: SpecT,
    dry_run: bool,
    creation_key: str,
) -> web.Response | None:
    """201 with the work created, or None where a concurrent apply of the same name
    created it first (`creation_key`: the store's idempotency key for this creation)."""
    await check_admissible(request, spec, tenant)
    noun = collection.noun
    if dry_run:
        placement = await _placement(request, collection, tenant, spec)
        view = _view(
            None, collection, spec, action="created", dry_run=True, placement=placement,
            message=f"{noun} {spec.name} would be created: {placement.message}",
        )  # fmt: skip
        return json_response(view)
    try:
        result = await request.app[STORE].submit_work(
            tenant.tenant_id,
            kind=collection.store_kind,
            spec=encode_spec(spec),
            priority=spec.priority,
            idempotency_key=creation_key,
            dependencies=new_dependencies(spec),
        )
    except QueueFullError as error:
        raise queue_full(
            tenant, error, "apply again once some have started, or cancel some"
        ) from None
    if not result.created:
        return None
    record = result.work
    view = _view(
        record, collection, spec, action="created", dry_run=False,
        message=f"{noun} {spec.name} created: {record.work_id}",
    )  # fmt: skip
    response = json_response(view, status=201)
    response.headers["Location"] = f"{collection.path()}/{record.work_id}"
    return response


def _kept(
    collection: Collection[SpecT],
    record: WorkRecord,
    stored: SpecT,
    spec: SpecT,
    changes: tuple[FieldChange, ...],
) -> WorkSpec:
    """The spec the live work (its spec `stored`) keeps once `spec` is applied, or a 409
    saying why it cannot take `changes` and what to do instead."""
    noun, name = collection.noun, spec.name
    if isinstance(spec, DeploymentSpec):
        fixed = not_in_place(changes, IN_PLACE_DEPLOYMENT_FIELDS)
        if fixed:
            raise _refused(
                "not-in-place",
                "Not changeable in place",
                f"deployment {name} ({record.work_id}) cannot change {', '.join(fixed)} in "
                f"place (only {', '.join(sorted(IN_PLACE_DEPLOYMENT_FIELDS))}): cancel it "
                f"(greenfed cancel {record.work_id}) and apply again, or apply it under a "
                "new name",
                fixed,
            )
        assert isinstance(stored, DeploymentSpec)
        try:
            return applied_in_place(stored, spec)
        except FieldError as error:
            raise invalid_body(json_path(error.path), error.reason) from None
    if record.state != "pending" or record.attempts > 0:
        started = record.state if record.state != "pending" else "pending again after a run"
        raise _refused(
            "job-started",
            "A started job cannot change",
            f"job {name} ({record.work_id}) is {started}: a started job is immutable; "
            f"cancel it (greenfed cancel {record.work_id}) and apply again, or apply it "
            "under a new name",
        )
    fixed = not_in_place(changes, QUEUED_JOB_FIELDS)
    if fixed:
        raise _refused(
            "not-in-place",
            "Not changeable in place",
            f"queued {noun} {name} ({record.work_id}) cannot change {', '.join(fixed)} "
            f"(only {', '.join(sorted(QUEUED_JOB_FIELDS))}): cancel it (greenfed cancel "
            f"{record.work_id}) and apply again, or apply it under a new name",
            fixed,
        )
    return spec


async def _admitted(
    request: web.Request,
    collection: Collection[SpecT],
    tenant: TenantRecord,
    record: WorkRecord,
    stored: SpecT,
    spec: SpecT,
    changes: tuple[FieldChange, ...],
) -> WorkSpec:
    """`_kept`, then what PATCH /v1/jobs/{id} refuses of a queued job's new spec (a
    passed deadline, a shape the fleet never fits): the same update either way."""
    kept = _kept(collection, record, stored, spec, changes)
    if isinstance(kept, TrainingJobSpec):
        refused = await refused_now(request, kept, tenant, time.time())
        if refused is not None:
            raise refused
    return kept


def _with_rollout(
    record: WorkRecord, stored: WorkSpec, kept: WorkSpec, by: str
) -> tuple[WorkSpec, NewEvent | None]:
    """A deployment's rollout in progress as the kept spec leaves it, and its
    `work.rollout` event where that ends it: as a PATCH of the same change would."""
    if isinstance(stored, DeploymentSpec) and isinstance(kept, DeploymentSpec):
        new_model = kept.model_id != stored.model_id
        return rollout_after_update(record, stored, kept, new_model=new_model, by=by)
    return kept, None


async def _update(
    request: web.Request,
    collection: Collection[SpecT],
    tenant: TenantRecord,
    record: WorkRecord,
    kept: WorkSpec,
    changes: tuple[FieldChange, ...],
) -> WorkRecord:
    store = request.app[STORE]
    audit = audit_entry(
        request,
        "work.update",
        record.work_id,
        tenant=tenant.name,
        kind=collection.noun,
        changes={change.field: msgspec.json.decode(change.after) for change in changes},
        applied=True,
    )
    if isinstance(kept, TrainingJobSpec):
        return await store.update_queued(
            tenant.tenant_id,
            record.work_id,
            spec=encode_spec(kept),
            priority=kept.priority,
            changed_fields=tuple(change.field for change in changes),
            actor=tenant.name,
            expected_version=record.version,
            audit=audit,
        )
    return await store.update_spec(
        tenant.tenant_id,
        record.work_id,
        encode_spec(kept),
        expected_version=record.version,
        audit=audit,
    )


async def _as_stored(request: web.Request, given: SpecT, stored: SpecT) -> SpecT:
    """`given` with its `depends_on` by id, as `stored` (the spec of the work of its
    name) holds them: a name keeps the id it had when that work was created, though a
    newer job of the name exists now (re-applying an unchanged file is no change); any
    other name means the job it names today."""
    return await dependencies_by_id(request, given, stored=stored.depends_on)


async def _same_as_ended(
    request: web.Request, collection: Collection[SpecT], ended: WorkRecord, given: SpecT
) -> bool:
    """Whether `given` is the spec of the ended work of its name, read as `_as_stored`
    reads it for live work."""
    stored = known_spec(collection.decoder, ended)
    return stored is not None and await _as_stored(request, given, stored) == stored


async def _apply(request: web.Request, collection: Collection[SpecT]) -> web.Response:
    query = parse_query(request, DryRunQuery)
    tenant = tenant_of(request)
    name = request.match_info["id"]
    # As sent: `depends_on` may name jobs; each path below resolves them (_as_stored).
    given = accepted_spec(request, collection, await read_body(request), tenant)
    _refuse_array(given, "apply")
    if given.name != name:
        raise invalid_body("$.name", f"must be {name!r}, the name in the path")
    noun = collection.noun
    for _ in range(_CHANGE_RETRIES):
        live, ended = await _named(request, collection, tenant, name)
        if live is None and _created_meanwhile(ended):
            continue
        if live is None:
            if ended is not None and await _same_as_ended(request, collection, ended, given):
                view = _view(
                    ended, collection, given, action="unchanged", dry_run=query.dry_run,
                    message=f"{noun} {name} ({ended.work_id}) already {ended.state} with "
                    "this spec; submit it to run it again",
                )  # fmt: skip
                return json_response(view)
            # Two applies of one name at once must create it once: they share the store's
            # idempotency key for "the work after the last one that ended" (the control
            # character keeps it apart from every Idempotency-Key a client may send).
            basis = ended.work_id if ended is not None else "-"
            creation_key = f"{OWN_IDEMPOTENCY_PREFIX}apply:{collection.store_kind}:{name}:{basis}"
            check_priority(tenant, given.priority)  # new work: its class is new
            spec = await dependencies_by_id(request, given)  # new work: today's jobs
            created = await _create(request, collection, tenant, spec, query.dry_run, creation_key)
            if created is None:
                continue  # another apply created it: look again (unchanged, or update)
            return created
        shown = shown_spec(collection.decoder, live)
        spec = await _as_stored(request, given, shown)
        changes = spec_changes(shown, spec)
        if not changes:
            view = _view(
                live, collection, spec, action="unchanged", dry_run=query.dry_run,
                message=f"{noun} {name} ({live.work_id}) unchanged",
            )  # fmt: skip
            return json_response(view)
        if any(change.field == "priority" for change in changes):
            # Only a new class is asked about: the one the work has, it keeps.
            check_priority(tenant, spec.priority)
        if isinstance(spec, DeploymentSpec) and any(c.field == "model_id" for c in changes):
            await check_admissible(request, spec, tenant)  # the new model is the tenant's
        fields = ", ".join(change.field for change in changes)
        # Read exactly: an update stores the spec again, and must lose none of its fields.
        stored = exact_spec(collection.decoder, live)
        kept = await _admitted(request, collection, tenant, live, stored, spec, changes)
        kept, rollout_ended = _with_rollout(live, stored, kept, tenant.name)
        if query.dry_run:
            view = _view(
                live, collection, spec, action="updated", dry_run=True, changes=changes,
                message=f"{noun} {name} ({live.work_id}) would change: {fields}",
            )  # fmt: skip
            return json_response(view)
        try:
            updated = await _update(request, collection, tenant, live, kept, changes)
        except (VersionConflictError, IllegalTransitionError):
            continue  # it changed meanwhile (placed, ended): look again
        if rollout_ended is not None:
            await request.app[STORE].record_event(rollout_ended)
        view = _view(
            updated, collection, spec, action="updated", dry_run=False, changes=changes,
            message=f"{noun} {name} ({updated.work_id}) changed: {fields}",
        )  # fmt: skip
        return json_response(view)
    raise Problem(
        409, "changing", "Changing too fast",
        f"{noun} {name} changed on every attempt to apply the spec; retry",
    )  # fmt: skip


async def apply_job(request: web.Request) -> web.Response:
    return await _apply(request, JOBS)


async def apply_deployment(request: web.Request) -> web.Response:
    return await _apply(request, DEPLOYMENTS)


# ---- routes ------------------------------------------------------------------------------


def _routes(collection: Collection[SpecT], dry_run: Handler, apply: Handler) -> tuple[Route, ...]:
    noun = collection.noun
    spec_type = TrainingJobSpec if collection.store_kind == "training" else DeploymentSpec
    return (
        Route(
            "POST",
            collection.path() + "/dry-run",
            dry_run,
            f"Check a {noun} spec and say where it would be placed now, storing nothing",
            "tenant",
            f"{noun}s",
            body=spec_type,
            description=(
                "Every check of a submission (a 4xx problem names the field at fault), then "
                "a scheduling pass over the current nodes and queue with this work added as "
                "the tenant's newest: its explanation, as `GET .../explain` would show it "
                "once submitted. Nothing is stored, published or audited."
            ),
            replies=(
                Reply(200, "Where it would go, or why it would wait", DryRunView),
                problem_reply(403, "The priority class is not allowed for this tenant"),
            ),
        ),
        Route(
            "PUT",
            collection.path() + "/{id}",
            apply,
            f"Create or update the tenant's {noun} of this name (apply)",
            "tenant",
            f"{noun}s",
            body=spec_type,
            query=DryRunQuery,
            description=(
                f"`{{id}}` is the {noun}'s name, as in the body. Creates it when no {noun} of "
                "that name is live; else changes the live one in place: a deployment's "
                "model_id, batching, replicas and autoscale (under autoscale both before "
                "and after, its current count is kept); a queued job's priority, resources, "
                "deadline and start window. A started job, and any other field, is a 409 "
                "saying what to do instead. The spec of ended work applied again changes "
                "nothing. `dry_run=true`: what would be done, with each changed field "
                "before and after (and, for a creation, where it would go), storing nothing. "
                "An update is audited (`work.update`)."
            ),
            replies=(
                Reply(201, f"The {noun}, created", ApplyView, headers=("Location",)),
                Reply(200, "Updated, unchanged, or (dry_run) what would be done", ApplyView),
                problem_reply(403, "The priority class is not allowed for this tenant"),
                problem_reply(
                    409,
                    "The live work cannot take the change, several live items have the name, "
                    "or the name is a live job array's",
                ),
                problem_reply(429, "The tenant's pending work is at its max_queued"),
            ),
        ),
    )


# Registered before cloud/api/work.py's routes: /v1/jobs/dry-run before /v1/jobs/{id}.
ROUTES: Final = _routes(JOBS, dry_run_job, apply_job) + _routes(
    DEPLOYMENTS, dry_run_deployment, apply_deployment
)
