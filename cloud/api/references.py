"""Path parameters that name work the way a person does: by id, name or id prefix.

`work_id_of` turns the `{id}` of a work route into the id it means
(cloud/work/lookup.py decides; the store reads the candidates). Used by
cloud/api/work.py's `find` and by the routes that look work up themselves, so every
route under /v1/jobs/{id} and /v1/deployments/{id} takes all three. A reference that
matches nothing is returned unchanged (the route's own 404 names it); several matches
are a 409 listing them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, TypeVar

import msgspec
from aiohttp import web

from cloud.api.auth import tenant_of
from cloud.api.bodies import invalid_body
from cloud.api.job_arrays import task_id_of
from cloud.api.problems import Problem
from cloud.app_keys import STORE
from cloud.store import WorkRecord
from cloud.work.lookup import (
    SHOWN_CANDIDATES,
    Ambiguous,
    array_named,
    as_id_prefix,
    by_name,
    by_prefix,
    is_full_id,
)
from cloud.work.specs import DependencySpec, DeploymentSpec, TrainingJobSpec
from shared.clock import utc_from_epoch
from shared.errors import FieldError, json_path
from shared.problems import InvalidParam
from shared.work_literals import WorkKind

AMBIGUOUS: Final = "ambiguous-reference"
SpecT = TypeVar("SpecT", TrainingJobSpec, DeploymentSpec)


async def dependencies_by_id(
    request: web.Request, spec: SpecT, *, stored: Sequence[DependencySpec] = ()
) -> SpecT:
    """`spec` with each `depends_on` job named by its id: a name or an id prefix is
    resolved among the tenant's training jobs as a path's `{id}` is (a spec applied
    from a directory names the jobs it waits for, whose ids it cannot know). What
    matches nothing is left for the dependency checks to refuse; several matches, or a
    job named twice once resolved, are a 422 on that dependency.

    `stored`: the `depends_on` of the work `spec` is applied to again. A name its job
    bears there keeps that job's id (`_kept_ids`): the name meant that job when the
    work was created, and a newer run of the name since is another job, not a change
    of the file."""
    if all(is_full_id(dependency.job) for dependency in spec.depends_on):
        return spec
    kept_ids = await _kept_ids(request, spec.depends_on, stored)
    resolved = []
    for index, dependency in enumerate(spec.depends_on):
        field = f"$.depends_on[{index}].job"
        job_id = kept_ids.get(index)
        if job_id is None:
            job_id = await _resolved_dependency(request, field, dependency.job)
        resolved.append(msgspec.structs.replace(dependency, job=job_id))
    try:
        return msgspec.structs.replace(spec, depends_on=tuple(resolved))
    except FieldError as error:  # one job named twice: by its name and by its id, say
        raise invalid_body(json_path(error.path), error.reason) from None


async def _resolved_dependency(request: web.Request, field: str, reference: str) -> str:
    """The id of the training job `reference` names today (a 422 on `field` where it
    names several, or a job array)."""
    try:
        job_id, is_array = await _resolve(request, "training", "job", reference, any_tenant=False)
    except Problem as problem:
        if problem.slug != AMBIGUOUS:
            raise
        raise invalid_body(field, problem.detail) from None
    if is_array:
        await _refuse_array(request, field, reference, job_id)
    return job_id


class _Named(msgspec.Struct, frozen=True):
    """The one field of a stored spec that `_kept_ids` reads."""

    name: str | None = None


_NAMED: Final = msgspec.json.Decoder(_Named)


async def _kept_ids(
    request: web.Request, given: Sequence[DependencySpec], stored: Sequence[DependencySpec]
) -> dict[int, str]:
    """Per position of `given` whose job is a reference, not an id: the id of the
    `stored` dependency whose job bears that name (the one at the same position, else
    the only one), as the work was created with it. A name no stored job bears (another
    dependency, added or renamed) is resolved as for new work."""
    if not stored:
        return {}
    records = await request.app[STORE].tenant_work(
        tenant_of(request).tenant_id, [dependency.job for dependency in stored]
    )
    names = [_name_of(records.get(dependency.job)) for dependency in stored]
    kept: dict[int, str] = {}
    for index, dependency in enumerate(given):
        if is_full_id(dependency.job):
            continue
        bearing = [position for position, name in enumerate(names) if name == dependency.job]
        if index in bearing:
            kept[index] = stored[index].job
        elif len(bearing) == 1:
            kept[index] = stored[bearing[0]].job
    return kept


def _name_of(record: WorkRecord | None) -> str | None:
    """The name of a stored training job; None for none (gone, another tenant's, not a
    training job, or a spec this version cannot read)."""
    if record is None or record.kind != "training":
        return None
    try:
        return _NAMED.decode(record.spec).name
    except msgspec.DecodeError:
        return None


async def _refuse_array(request: web.Request, field: str, reference: str, job_id: str) -> None:
    """A 422 on `field`, where `reference` (a name) resolved to a job array: the array is
    no job to wait for, and "no job <array id>" would name an id the caller never sent."""
    tasks = await request.app[STORE].array_tasks(tenant_of(request).tenant_id, job_id)
    example = f" ({job_id}_{tasks[0].index})" if tasks else ""
    raise invalid_body(
        field,
        f"{reference!r} names job array {job_id}, which is no job; name one of its tasks{example}",
    )


async def work_id_of(
    request: web.Request, kind: WorkKind, noun: str, reference: str, *, any_tenant: bool
) -> str:
    """The id `reference` names among the caller's work of `kind` (with `any_tenant`,
    the admin's reach: every tenant's)."""
    work_id, _ = await _resolve(request, kind, noun, reference, any_tenant=any_tenant)
    return work_id


async def _resolve(
    request: web.Request, kind: WorkKind, noun: str, reference: str, *, any_tenant: bool
) -> tuple[str, bool]:
    """`work_id_of`'s answer, and whether it is a job array's id found by its name."""
    if is_full_id(reference):
        return reference, False
    if kind == "training":  # ARRAYID_7: task 7 of a job array
        task = await task_id_of(request, reference, any_tenant=any_tenant)
        if task is not None:
            return task, False
    caller = tenant_of(request)
    scope = None if any_tenant and caller.admin else caller.tenant_id
    store = request.app[STORE]
    found: WorkRecord | Ambiguous | None = None
    # Each job array once: an array of more tasks than are read must not hide the other
    # live work of its name (that would pick the array, unasked).
    live = await store.live_work_named(scope, kind, reference, limit=SHOWN_CANDIDATES + 1)
    active, arrays = live.work, live.arrays
    newest = (
        () if active or arrays else await store.work_matching(scope, kind, name=reference, limit=1)
    )
    array_id = array_named(active, arrays, newest)
    if array_id is not None:
        return array_id, True
    found = by_name(reference, active, newest, arrays)
    prefix = as_id_prefix(reference)
    if found is None and prefix is not None:
        matches = await store.work_matching(
            scope, kind, id_prefix=prefix, limit=SHOWN_CANDIDATES + 1
        )
        found = by_prefix(reference, matches)
    if isinstance(found, Ambiguous):
        raise ambiguous_problem(noun, found)
    return (reference if found is None else found.work_id), False


def ambiguous_problem(noun: str, ambiguous: Ambiguous) -> Problem:
    listed = [
        (record.work_id, f"{record.state}, submitted {_at(record.submitted_at)}")
        for record in ambiguous.candidates
    ] + [
        (
            array.array_id,
            f"job array, {array.live_tasks} tasks not ended, submitted {_at(array.submitted_at)}",
        )
        for array in ambiguous.arrays
    ]
    shown = ", ".join(f"{work_id} ({about})" for work_id, about in sorted(listed, reverse=True))
    more = " and more" if len(listed) >= SHOWN_CANDIDATES else ""
    reason = (
        f"{ambiguous.by} {ambiguous.reference!r} matches several {noun}s: {shown}{more}; "
        "use an id (or a longer prefix of one)"
    )
    return Problem(
        409,
        AMBIGUOUS,
        f"Ambiguous {noun} reference",
        reason,
        (InvalidParam("id", reason),),
    )


def _at(epoch_s: float) -> str:
    return f"{utc_from_epoch(epoch_s):%Y-%m-%dT%H:%M:%SZ}"
