"""New work that could never run is refused at submission, with the field at fault.

- A deadline that has passed.
- Work that no node of the fleet as registered could ever hold: the rule is the
  scheduler's (`cloud.scheduler.unschedulable.never_fits`: for training, a node that
  isolates workers as the job and the cluster ask, a container runtime for an image, a
  sealing key for secrets; then kind, accelerators per member, model, memory, host
  memory, CPU cores, a deadline no registered accelerator can meet, a gang larger than
  the fleet or than the tenant's quota and its cohort could ever give it, training at
  sites where no agent trains). A spec with `allow_unschedulable` is accepted anyway (a
  fleet that will grow) and waits, pending as `unschedulable` with the same cause,
  until a node that can run it registers.
- Dependencies (`depends_on`) on a job the tenant does not have (another tenant's id is
  unknown too), on a deployment, on a job that has already ended so that the condition
  can never hold, or into a dependency loop.

Each is a 422 naming the field: `$.isolation`, `$.image`, `$.secret_env`,
`$.accelerators_per_worker`, `$.host_memory_gib`, `$.workers`, `$.deadline`,
`$.depends_on[0].job`. A retry of a submission accepted earlier still gets its original
(the caller looks the replay up first).
"""

from __future__ import annotations

from typing import Final

import msgspec
from aiohttp import web

from cloud.api.bodies import invalid_body
from cloud.api.problems import Problem
from cloud.api.registered_fleet import registered_fleet
from cloud.app_keys import REGISTRY, SETTINGS, STORE
from cloud.store import NewDependency, QueueFullError, TenantRecord, WorkRecord
from cloud.work.convert import spec_field, spec_of, to_work
from cloud.work.dependencies import Verdict, loop_from, verdict
from cloud.work.specs import WorkSpec
from cloud.work.views import DependencyView
from shared.errors import json_path
from shared.problems import InvalidParam
from shared.work_literals import DependencyCondition, spec_kind_of

# Work ids a loop search reads at most: a chain longer than this is not searched further.
_MAX_CHAIN: Final = 10_000


async def refused_now(
    request: web.Request, spec: WorkSpec, tenant: TenantRecord, now_s: float
) -> Problem | None:
    """Why the fleet as registered could never run `spec` (a 422), or None."""
    deadline = getattr(spec, "deadline", None)
    if deadline is not None and deadline.timestamp() <= now_s:
        return invalid_body("$.deadline", f"{deadline.isoformat()} has passed")
    if spec.allow_unschedulable:
        return None
    work = to_work(
        spec,
        work_id="submitted",
        tenant=tenant.name,
        submitted_at=now_s,
        min_isolation=request.app[SETTINGS].scheduling.min_isolation,
    )
    fleet = registered_fleet(request.app[REGISTRY], request.app[STORE])
    never = await fleet.never_fits(work, now_s)
    if never is None:
        return None
    path = spec_field(spec, never.field)
    hint = "; set allow_unschedulable to queue it for a fleet that will grow"
    return invalid_body(json_path(path), never.reason + ("" if path == ("deadline",) else hint))


async def refused_dependencies(
    request: web.Request, spec: WorkSpec, tenant: TenantRecord
) -> Problem | None:
    """Why `spec`'s `depends_on` could never be met (a 422 on `$.depends_on[i].job`)."""
    if not spec.depends_on:
        return None
    store = request.app[STORE]
    jobs = await store.tenant_work(tenant.tenant_id, [d.job for d in spec.depends_on])
    for index, dependency in enumerate(spec.depends_on):
        name = f"$.depends_on[{index}].job"
        record = jobs.get(dependency.job)
        if record is None:
            return invalid_body(name, f"no job {dependency.job!r}: name one of your training jobs")
        if record.kind != "training":
            return invalid_body(
                name, f"{dependency.job} is a deployment, which never ends: name a training job"
            )
        if verdict(dependency.condition, record.state) == "never":
            return invalid_body(
                name,
                f"job {dependency.job} already {record.state}: it can never have "
                f"{dependency.condition}",
            )
    edges = await _chain(request, tenant, [d.job for d in spec.depends_on])
    for index, dependency in enumerate(spec.depends_on):
        loop = loop_from(dependency.job, edges)
        if loop is not None:
            return invalid_body(
                f"$.depends_on[{index}].job",
                f"job {dependency.job} leads into a dependency loop: {' -> '.join(loop)}",
            )
    return None


async def _chain(
    request: web.Request, tenant: TenantRecord, start: list[str]
) -> dict[str, tuple[str, ...]]:
    """The dependency edges of everything `start` leads to (breadth first, bounded)."""
    store = request.app[STORE]
    edges: dict[str, tuple[str, ...]] = {}
    seen = set(start)
    frontier = start
    while frontier and len(seen) <= _MAX_CHAIN:
        found = await store.dependency_edges(tenant.tenant_id, frontier)
        edges.update(found)
        frontier = [job for jobs in found.values() for job in jobs if job not in seen]
        seen.update(frontier)
    return edges


def queue_full(tenant: TenantRecord, error: QueueFullError, then: str) -> Problem:
    """The 429 of new work beyond the tenant's max_queued; `then` says what to do (or
    what did not fit), e.g. "submit again once some have started, or cancel some"."""
    return Problem(
        429,
        "queue-full",
        "Too much work queued",
        f"tenant {tenant.name} has {error.queued} pending jobs and deployments, its "
        f"max_queued of {error.max_queued}: {then}",
    )


def job_array_refused(title: str, detail: str) -> Problem:
    """The 409 (`job-array`) of a job array's id or name where only one job is taken
    (cloud/api/job_arrays.py): the array is many jobs, so the detail says which one to
    name instead, or what takes the whole array. It names the path's `id` as at fault."""
    return Problem(409, "job-array", title, detail, (InvalidParam("id", detail),))


def idempotency_key_reused(
    key: str | None, earlier: WorkRecord, shown_at: str, *, same_kind: bool
) -> Problem:
    """The 409 of a retry whose body is not what its Idempotency-Key was first used with
    (`earlier`, seen at the path `shown_at`; `same_kind`: of the kind the retry asks for).

    Work stored before store v25 keeps no digest of its spec as submitted: a retry is
    compared with its spec as stored, which a PATCH or an apply may have changed since.
    A difference then proves nothing either way, and the retry is no proof of being the
    original either: it is refused (never answered with work that may be another
    submission's), saying why and how to find out instead of "another request body"."""
    if same_kind and earlier.submitted_spec_sha256 is None:
        detail = (
            f"Idempotency-Key {key!r} was used for {earlier.work_id}, stored before greenfed "
            "kept what each key was submitted with (store schema 25); its spec as it is now "
            "differs from this body, which is either another submission or the same one "
            f"changed since by a PATCH or an apply: nothing tells which. GET {shown_at} to "
            "see whether it is this submission (then it was accepted: do not submit it "
            "again); else use a new key"
        )
    else:
        detail = (
            f"Idempotency-Key {key!r} was used for another request body ({earlier.work_id}); "
            "use a new key for a different submission"
        )
    return Problem(409, "idempotency-key-reused", "Idempotency-Key reused", detail)


def new_dependencies(spec: WorkSpec) -> tuple[NewDependency, ...]:
    return tuple(NewDependency(d.job, d.condition) for d in spec.depends_on)


async def dependency_views(
    request: web.Request, tenant: TenantRecord, record: WorkRecord
) -> tuple[tuple[DependencyView, ...], tuple[DependencyView, ...]]:
    """(what the work waits for, what waits for it), for its view."""
    links = await request.app[STORE].work_links(tenant.tenant_id, record.work_id)
    waits_for = tuple(
        _view(other, dependency.condition, verdict(dependency.condition, other.state))
        for dependency, other in links.needs
    )
    needed_by = tuple(
        _view(other, dependency.condition, verdict(dependency.condition, record.state))
        for dependency, other in links.needed_by
    )
    return waits_for, needed_by


def _view(other: WorkRecord, condition: DependencyCondition, holds: Verdict) -> DependencyView:
    try:
        name = spec_of(other).name
    except (msgspec.DecodeError, ValueError):  # a spec this version cannot read
        name = ""
    return DependencyView(
        id=other.work_id,
        kind=spec_kind_of(other.kind),
        name=name,
        state=other.state,
        condition=condition,
        verdict=holds,
    )
