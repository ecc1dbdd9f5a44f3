"""The work commands of the `greenfed` CLI and their tables.

`greenfed submit/jobs/job/cancel/deployments/deployment/logs/models/tenants` call a
running control plane through `greenfed.api_client`. People get rich tables (`-o wide`:
with more columns); scripts pass `-o json` or `-o yaml` and get the API's data
(`greenfed.output`). Whatever goes wrong (API unreachable, token refused, a spec file
that does not match the spec) is one line on stderr and a non-zero exit status, never a
traceback.
"""

from __future__ import annotations

import asyncio
import codecs
import functools
import os
import re
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, TextIO, TypeVar

import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cloud.models.views import ModelList, ModelView, TensorView
from cloud.work.array_ranges import task_name
from cloud.work.array_views import JobArrayView
from cloud.work.specs import DeploymentSpec, TrainingJobSpec, encode_spec
from cloud.work.views import (
    AllocationView,
    DeploymentList,
    DeploymentSummary,
    DeploymentView,
    ExplainView,
    FairShareView,
    JobList,
    JobSummary,
    JobView,
    ReplicaView,
    TenantCreated,
    TenantList,
    TenantView,
)
from greenfed.api_client import ApiClient, CliError, Reply, bulk_confirmation, path_segment
from greenfed.arguments import EXIT_OK
from greenfed.output import WIDE_COLUMNS, Output, emit
from greenfed.usage_commands import usage_line
from shared.messages import AcceleratorKind
from shared.mig_profiles import is_quota_resource
from shared.printable import printable
from shared.work_literals import SpecKind

# ---- rendering -----------------------------------------------------------------------------


def console(out: TextIO, *, wide: bool = False) -> Console:
    """The terminal's width; 160 columns into a file or pipe unless $COLUMNS says;
    `wide`: the table's own width, whatever the terminal's."""
    if wide:
        return Console(file=out, width=WIDE_COLUMNS, highlight=False)
    sized = out.isatty() or os.environ.get("COLUMNS", "").isdigit()
    return Console(file=out, width=None if sized else 160, highlight=False)


def plain(text: str | None) -> Text:
    """What a node, a cluster or a tenant wrote, as a table cell or a line: printable
    (shared/printable.py: no escape sequence, CR or newline reaches the terminal) and
    never read as Rich markup (`[/]` cannot break the table, `[link=...]` makes no link)."""
    return Text(printable(text or ""))


ReplyT = TypeVar("ReplyT")


async def act_and_say(
    client: ApiClient,
    method: str,
    path: str,
    reply_type: type[ReplyT],
    said: Callable[[ReplyT], str],
    *,
    output: Output,
) -> int:
    """One request whose reply is printed as `-o json|yaml` asks, or as one line for people."""
    reply = (await client.ask(method, path, reply_type)).value
    emit(output, reply, lambda: output.out.write(said(reply) + "\n"))
    return EXIT_OK


async def get_and_show(
    client: ApiClient,
    path: str,
    reply_type: type[ReplyT],
    show: Callable[[ReplyT], object],
    *,
    output: Output,
    params: Mapping[str, str] | None = None,
) -> int:
    """One GET whose reply is printed as `-o json|yaml` asks (the API's own bytes), or
    as `show` prints it for people (a table, honouring `output.wide`)."""
    reply = await client.ask("GET", path, reply_type, params=params)
    emit(output, reply.payload, lambda: show(reply.value))
    return EXIT_OK


def at_utc(moment: datetime | None) -> str:
    """A moment as UTC wall time for a table cell ("" for none)."""
    return "" if moment is None else f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S}Z"


def ago(moment: datetime | None) -> str:
    if moment is None:
        return ""
    seconds = max(0.0, (datetime.now(tz=UTC) - moment).total_seconds())
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h ago"
    return f"{seconds / 86400:.0f}d ago"


_STATE_STYLE: Final = {
    "pending": "yellow",
    "scheduled": "cyan",
    "running": "green",
    "succeeded": "bold green",
    "failed": "red",
    "cancelled": "dim",
}


def state_text(state: str) -> Text:
    return Text(state, style=_STATE_STYLE.get(state, ""))


def held_state_text(job: JobSummary) -> Text:
    """`pending (held)`, `pending (suspended)`: out of the queue until a person lifts it."""
    return Text.assemble(state_text(job.state), f" ({job.hold})" if job.hold else "")


def _with_tenants(
    items: tuple[JobSummary, ...] | tuple[DeploymentSummary, ...], asked: bool
) -> bool:
    """Show whose work each row is: when asked for another tenant's or everyone's, or
    when the rows come from more than one tenant (the admin's default view)."""
    return asked or len({item.tenant for item in items}) > 1


# `-o wide`: each listing's columns beyond its table's (which always name the tenant).
JOBS_WIDE: Final = ("failures", "retry at (UTC)", "submitted (UTC)", "updated (UTC)")
DEPLOYMENTS_WIDE: Final = ("attempts", "submitted (UTC)", "updated (UTC)")


def render_jobs(jobs: JobList, out: TextIO, *, tenants: bool = False, wide: bool = False) -> None:
    table = Table(title=f"jobs: {jobs.count}", title_justify="left")
    tenants = wide or _with_tenants(jobs.items, tenants)
    columns = ("id", "name", "state", "prio", "workers", "attempts", "submitted", "reason")
    for column in ("id", "tenant", *columns[1:]) if tenants else columns:
        table.add_column(column, overflow="fold" if column == "reason" else "ellipsis")
    for column in JOBS_WIDE if wide else ():
        table.add_column(column)
    for job in jobs.items:
        table.add_row(
            job.id if job.array_id is None else task_name(job.array_id, job.array_index or 0),
            *((job.tenant,) if tenants else ()),
            job.name,
            held_state_text(job),
            job.priority,
            f"{job.workers}×{job.accelerators_per_worker} {job.accelerator_kind}",
            str(job.attempts),
            ago(job.submitted_at),
            plain(job.reason),
            *(_job_wide_cells(job) if wide else ()),
        )
    console(out, wide=wide).print(table)
    if jobs.next_cursor:
        console(out).print(f"more: --cursor {jobs.next_cursor}")


def _job_wide_cells(job: JobSummary) -> tuple[str, ...]:
    return (
        str(job.failures),
        at_utc(job.retry_at),
        at_utc(job.submitted_at),
        at_utc(job.updated_at),
    )


def render_deployments(
    deployments: DeploymentList, out: TextIO, *, tenants: bool = False, wide: bool = False
) -> None:
    table = Table(title=f"deployments: {deployments.count}", title_justify="left")
    tenants = wide or _with_tenants(deployments.items, tenants)
    columns = ("id", "name", "state", "prio", "replicas", "model", "submitted", "reason")
    for column in ("id", "tenant", *columns[1:]) if tenants else columns:
        table.add_column(column, overflow="fold" if column == "reason" else "ellipsis")
    for column in DEPLOYMENTS_WIDE if wide else ():
        table.add_column(column)
    for item in deployments.items:
        table.add_row(
            item.id,
            *((item.tenant,) if tenants else ()),
            item.name,
            state_text(item.state),
            item.priority,
            f"{item.replicas}×{item.accelerators_per_replica}",
            item.model_id or "",
            ago(item.submitted_at),
            plain(item.reason),
            *(
                (str(item.attempts), at_utc(item.submitted_at), at_utc(item.updated_at))
                if wide
                else ()
            ),
        )
    console(out, wide=wide).print(table)
    if deployments.next_cursor:
        console(out).print(f"more: --cursor {deployments.next_cursor}")


def _power_limit_words(allocation: AllocationView) -> str:
    """The GPU power limit asked for a worker, and whether its node holds it."""
    asked = allocation.power_limit_w
    if asked is None:
        return ""
    if not allocation.power_limit_reported:
        return f", asked {asked:.0f} W (not yet confirmed by the node)"
    held = allocation.power_limit_held_w
    if held is None:
        why = allocation.power_limit_note or "the node holds its default limit"
        return f", asked {asked:.0f} W ({why})"
    return f", held to {held:.0f} W"


def _allocations_table(allocations: tuple[AllocationView, ...], *, wide: bool = False) -> Table:
    """Each member's placement; `worker`: what its node last reported of its worker
    (training), where any node reported one."""
    table = Table(title="placement", title_justify="left")
    reported = any(allocation.worker_state for allocation in allocations)
    columns = ("member", "node", "accelerators", "state", *(("worker",) if reported else ()))
    for column in (*columns, "since", "expected end"):
        table.add_column(column)
    for column in ("cpu cores", "host memory", "borrowed", "since (UTC)") if wide else ():
        table.add_column(column)
    for allocation in allocations:
        ids = f" ({','.join(allocation.accelerator_ids)})" if allocation.accelerator_ids else ""
        capped = _power_limit_words(allocation)
        table.add_row(
            str(allocation.member),
            allocation.node_id,
            plain(f"{allocation.accelerators} {allocation.accelerator_kind}{ids}{capped}"),
            allocation.state,
            *((allocation.worker_state or "",) if reported else ()),
            ago(allocation.started_at),
            allocation.expected_end.isoformat(timespec="seconds")
            if allocation.expected_end
            else "",
            *(
                (
                    str(allocation.cpu_cores),
                    f"{allocation.host_memory_bytes / 2**30:.1f} GiB",
                    "yes" if allocation.borrowed else "",
                    at_utc(allocation.started_at),
                )
                if wide
                else ()
            ),
        )
    return table


def worker_reason_lines(allocations: tuple[AllocationView, ...]) -> list[Text]:
    """What each worker's node said of it, whole on a line of its own (a cluster's: why
    the job waits in its queue), as the node wrote it but printable."""
    return [
        Text.assemble(
            f"worker {allocation.member} ({allocation.node_id}): ", plain(allocation.worker_reason)
        )
        for allocation in allocations
        if allocation.worker_reason
    ]


def replicas_line(work: DeploymentView) -> str:
    """Desired against ready replicas, the autoscaling rule and its latest decision."""
    ready = sum(1 for replica in work.replica_states if replica.state == "ready")
    line = f"replicas: {work.replicas} desired, {ready} ready"
    scale = work.spec.autoscale
    if scale is not None:
        target = (
            f"{scale.target_requests_per_s:g} requests/s"
            if scale.target_requests_per_s is not None
            else f"{scale.target_p95_latency_ms:g} ms p95"
        )
        line += f"  (autoscaled {scale.min_replicas}..{scale.max_replicas} on {target} per replica)"
    if work.spec.min_available is not None:
        # The disruption budget: drains, preemption and rollouts leave this many serving.
        line += f"\nmin_available: {work.spec.min_available} (kept serving through drains, "
        line += "preemption and rollouts)"
    canary = work.spec.canary
    if canary is not None:
        line += (
            f"\nrollout: model {canary.model_id} on {canary.replicas} canary replica(s), "
            f"promoted after {canary.hold_s:g} s healthy (errors ≤ {canary.max_error_rate:.1%}, "
            f"p95 ≤ {canary.max_p95_ratio:g}× the others')"
        )
    if work.last_scaling is not None:
        last = work.last_scaling
        line += (
            f"\nlast scaled {ago(last.at)}: {last.from_replicas} → {last.to_replicas}, "
            f"{printable(last.reason)}"
        )
    return line


def _serving_cells(replica: ReplicaView) -> tuple[str, str, str]:
    serving = replica.serving
    if serving is None:
        return ("", "", "")
    p95 = "" if serving.latency_p95_ms is None else f"{serving.latency_p95_ms:.1f}"
    return (f"{serving.requests_per_s:.1f}", p95, str(serving.errors))


def _replicas_table(work: DeploymentView, *, wide: bool = False) -> Table:
    table = Table(title="replicas", title_justify="left")
    for column in ("replica", "node", "state", "provider", "note"):
        # Names stay whole (a person copies them); the note wraps into what is left.
        if column == "note":
            table.add_column(column, overflow="fold")
        else:
            table.add_column(column, no_wrap=True)
    for column in ("model sha256", "requests/s", "p95 ms", "errors") if wide else ():
        table.add_column(column, no_wrap=True)
    for replica in work.replica_states:
        table.add_row(
            str(replica.replica),
            replica.node_id,
            state_text(replica.state),
            plain(replica.provider),
            plain(replica.reason),
            *((plain(replica.model_sha256), *_serving_cells(replica)) if wide else ()),
        )
    return table


def _print_endpoints(work: DeploymentView, target: Console) -> None:
    """One line per ready replica, outside any table: a URL cut short or folded over two
    lines cannot be copied."""
    ready = [replica for replica in work.replica_states if replica.endpoint]
    if not ready:
        return
    target.print("endpoints (POST inference requests here):")
    for replica in ready:
        line = f"  replica {replica.replica}  {printable(replica.endpoint or '')}"
        target.print(Text(line), soft_wrap=True)


def render_models(models: ModelList, out: TextIO, *, wide: bool = False) -> None:
    """`wide`: each sha256 whole, and when and where (`blob`) each was uploaded."""
    table = Table(title=f"models: {models.count}", title_justify="left")
    for column in ("id", "name", "opset", "inputs", "outputs", "size", "sha256", "uploaded"):
        table.add_column(column)
    for column in ("uploaded (UTC)", "blob") if wide else ():
        table.add_column(column)

    def tensors(items: tuple[TensorView, ...]) -> str:
        return ", ".join(
            f"{t.name} {t.dtype}[{', '.join('?' if d is None else str(d) for d in t.shape)}]"
            for t in items
        )

    for model in models.items:
        table.add_row(
            model.id,
            model.name,
            str(model.opset),
            plain(tensors(model.inputs)),  # named in the tenant's file
            plain(tensors(model.outputs)),
            f"{model.size_bytes / 2**20:.1f} MiB",
            model.sha256 if wide else model.sha256[:12],
            ago(model.created_at),
            *((at_utc(model.created_at), model.blob_url) if wide else ()),
        )
    console(out, wide=wide).print(table)
    if models.next_cursor:
        console(out).print(f"more: --cursor {models.next_cursor}")


def render_explanation(explain: ExplainView, target: Console) -> None:
    when = f" ({ago(explain.explained_at)})" if explain.explained_at else ""
    target.print(Text.assemble(("why: ", "bold"), plain(explain.message), when))
    explanation = explain.explanation
    if explanation is None:
        return
    if explanation.pending is not None and explanation.pending.rejections:
        rejected = ", ".join(f"{n} {name}" for name, n in explanation.pending.rejections.items())
        target.print(
            f"nodes: {explanation.pending.fitting_nodes}/{explanation.pending.nodes_total} fit; "
            f"rejected: {rejected}"
        )
    if explanation.placements:
        table = Table(title="score breakdown (chosen node per member)", title_justify="left")
        table.add_column("member")
        table.add_column("node")
        table.add_column("total", justify="right")
        table.add_column("terms (value × weight)")
        table.add_column("runners-up")
        for member in explanation.placements:
            terms = ", ".join(
                f"{t.name} {t.value:.2f}×{t.weight:g}" for t in member.chosen.terms if t.weight
            )
            runners = ", ".join(f"{r.node_id} {r.total:.3f}" for r in member.runners_up)
            table.add_row(
                str(member.member), member.node_id, f"{member.chosen.total:.3f}", terms, runners
            )
        target.print(table)


_VERB: Final = {"succeeded": "succeed", "failed": "fail", "ended": "end"}
_VERDICT: Final = {"holds": "holds", "waits": "waiting", "never": "can never hold"}


def dependency_lines(work: JobView | DeploymentView) -> list[str]:
    """The work's place in its dependency chain: what it waits for, what waits for it."""
    lines = [
        f"waits for: job {d.id} {d.name} to {_VERB[d.condition]} "
        f"(it is {d.state}: {_VERDICT[d.verdict]})"
        for d in work.waits_for
    ]
    if isinstance(work, JobView):
        lines.extend(
            f"needed by: {'job' if d.kind == 'training' else d.kind} {d.id} {d.name} "
            f"(it is {d.state}), once this job has {d.condition}"
            for d in work.needed_by
        )
    return lines


def runs_line(spec: TrainingJobSpec) -> str:
    """How a job's workers run, where it asks for anything: its image, the isolation it
    needs, its launch and limits, and its secrets by name (a view never holds their
    values)."""
    parts: list[str] = []
    if spec.image is not None:
        parts.append(f"image {spec.image} (pull {spec.image_pull_policy})")
    if spec.registry_auth is not None:
        # The tenant's words, shown to the admin: printable (specs refuse control
        # characters in it; a view from before that rule may hold them).
        login = printable(spec.registry_auth.username)
        parts.append(f"registry login {login}@{spec.image_registry()}")
    if spec.isolation != "none":
        parts.append(f"isolation {spec.isolation} or stronger")
    if spec.launch != "per-worker":
        parts.append(f"launch {spec.launch}")
    if spec.pids_limit is not None:
        parts.append(f"at most {spec.pids_limit} processes per worker")
    if spec.secret_env:
        parts.append(f"secrets {', '.join(sorted(spec.secret_env))} (values hidden)")
    return "runs: " + "; ".join(parts) if parts else ""


def render_work(
    work: JobView | DeploymentView,
    explain: ExplainView | None,
    out: TextIO,
    *,
    wide: bool = False,
) -> None:
    """`wide`: also its times in UTC and version, and its tables' further columns."""
    target = console(out, wide=wide)
    noun = "job" if isinstance(work, JobView) else "deployment"
    target.print(Text.assemble((f"{noun} {work.id}", "bold"), f"  {work.name}"))
    shape = (
        f"{work.workers} worker(s) × {work.accelerators_per_worker} {work.accelerator_kind}"
        if isinstance(work, JobView)
        else f"{work.replicas} replica(s) × {work.accelerators_per_replica}"
        + (f", model {work.model_id}" if work.model_id else "")
    )
    state = held_state_text(work) if isinstance(work, JobView) else state_text(work.state)
    target.print(Text.assemble("state: ", state, f"  ({work.priority}, {shape})"))
    if work.reason:
        target.print(Text.assemble("reason: ", plain(work.reason)))
    for line in dependency_lines(work):
        target.print(line)
    target.print(
        f"attempts: {work.attempts}  submitted: {ago(work.submitted_at)}  "
        f"updated: {ago(work.updated_at)}  tenant: {work.tenant}"
    )
    if wide:
        target.print(
            f"submitted at: {at_utc(work.submitted_at)}  updated at: {at_utc(work.updated_at)}  "
            f"version: {work.version}"
        )
    if isinstance(work, JobView) and (line := runs_line(work.spec)):
        target.print(Text(line))
    if isinstance(work, JobView) and (work.failures or work.retry_at):
        retry = (
            f"  retried after {work.retry_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
            if work.retry_at
            else ""
        )
        target.print(f"failures: {work.failures}{retry}")
    if work.allocations:
        target.print(_allocations_table(work.allocations, wide=wide))
        for reason_line in worker_reason_lines(work.allocations):
            target.print(reason_line)
    if isinstance(work, JobView) and work.array is not None:
        target.print(_array_tasks_table(work.array, wide=wide))
    if work.usage is not None:
        target.print(usage_line(work.usage))
    if isinstance(work, DeploymentView):
        target.print(Text(replicas_line(work)))
    if isinstance(work, DeploymentView) and work.replica_states:
        target.print(_replicas_table(work, wide=wide))
        _print_endpoints(work, target)
    if explain is not None:
        render_explanation(explain, target)


def _array_tasks_table(array: JobArrayView, *, wide: bool = False) -> Table:
    """The tasks of a job array, each named as `greenfed job`/`cancel` take it."""
    throttle = "" if array.throttle is None else f", at most {array.throttle} at once"
    table = Table(title=f"tasks: {array.count} ({array.array}{throttle})", title_justify="left")
    for column in ("task", "state", "attempts", "reason", *(("job id",) if wide else ())):
        table.add_column(column, overflow="fold" if column == "reason" else "ellipsis")
    for task in array.tasks:
        table.add_row(
            task_name(array.id, task.index),
            state_text(task.state),
            str(task.attempts),
            plain(task.reason),
            *((task.id,) if wide else ()),
        )
    return table


def _counts(values: Mapping[AcceleratorKind, int] | Mapping[str, int]) -> str:
    return ", ".join(f"{kind}={n}" for kind, n in sorted(values.items()))


def quota_text(tenant: TenantView) -> str:
    """Accelerator quotas as a person reads them: `unlimited` where none applies (no
    quotas and no cohort); with a cohort, a kind not listed has a quota of 0."""
    if not tenant.quotas and tenant.cohort is None:
        return "unlimited"
    return _counts(tenant.quotas) or "0 (borrows only)"


def borrowing_text(tenant: TenantView) -> str:
    if tenant.cohort is None:
        return ""
    return _counts(tenant.borrowing_limit) or "what is idle"


def decayed_text(share: FairShareView | None) -> str:
    """`gpu=3.25` per kind: the decayed past usage, in accelerators held on average."""
    if share is None:
        return ""
    return ",".join(f"{kind}={value:.4g}" for kind, value in sorted(share.decayed_usage.items()))


def render_tenants(tenants: TenantList, out: TextIO, *, wide: bool = False) -> None:
    table = Table(title=f"tenants: {tenants.count}", title_justify="left")
    for column in (
        "name", "id", "quotas", "borrowing limit", "cohort", "share", "decayed usage",
        "standing", "max running", "max queued", "priorities", "admin",
        *(("created (UTC)",) if wide else ()),
    ):  # fmt: skip
        table.add_column(column)
    for tenant in tenants.items:
        share = tenant.fair_share
        table.add_row(
            tenant.name,
            tenant.id,
            quota_text(tenant),
            borrowing_text(tenant),
            "/".join(share.parent_path) if share is not None else tenant.cohort or "",
            f"{share.dominant_share:.3f}" if share is not None else "",
            decayed_text(share),
            f"{share.rank} of {share.siblings}" if share is not None else "",
            "unlimited" if tenant.max_running is None else str(tenant.max_running),
            "unlimited" if tenant.max_queued is None else str(tenant.max_queued),
            ",".join(tenant.allowed_priorities),
            "yes" if tenant.admin else "",
            *((at_utc(tenant.created_at),) if wide else ()),
        )
    console(out, wide=wide).print(table)


# ---- commands --------------------------------------------------------------------------------


async def submit(
    client: ApiClient,
    spec: TrainingJobSpec | DeploymentSpec,
    *,
    idempotency_key: str | None,
    output: Output,
) -> int:
    training = isinstance(spec, TrainingJobSpec)
    path = "/v1/jobs" if training else "/v1/deployments"
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    view_type: type[JobView | DeploymentView] = JobView if training else DeploymentView
    reply = await client.ask("POST", path, view_type, body=encode_spec(spec), headers=headers)

    def said() -> None:
        work = reply.value
        noun = "job" if training else "deployment"
        verb = "submitted" if reply.status == 201 else "already submitted (same Idempotency-Key)"
        output.out.write(f"{noun} {work.id} {verb}: {work.name}, {work.state}\n")

    emit(output, reply.payload, said)
    return EXIT_OK


def _list_params(
    state: str | None,
    priority: str | None,
    limit: int | None,
    cursor: str | None,
    tenant: str | None = None,
) -> dict[str, str]:
    params = {"state": state, "priority": priority, "cursor": cursor, "tenant": tenant}
    found = {key: value for key, value in params.items() if value}
    if limit is not None:
        found["limit"] = str(limit)
    return found


async def list_work(
    client: ApiClient,
    kind: SpecKind,
    *,
    state: str | None,
    priority: str | None,
    limit: int | None,
    cursor: str | None,
    output: Output,
    tenant: str | None = None,
) -> int:
    """`tenant`: the admin's pick, a tenant's name or `*` for every tenant's."""
    params = _list_params(state, priority, limit, cursor, tenant)
    asked = bool(tenant)
    if kind == "training":
        return await get_and_show(
            client,
            "/v1/jobs",
            JobList,
            lambda jobs: render_jobs(jobs, output.out, tenants=asked, wide=output.wide),
            output=output,
            params=params,
        )
    return await get_and_show(
        client,
        "/v1/deployments",
        DeploymentList,
        lambda listing: render_deployments(listing, output.out, tenants=asked, wide=output.wide),
        output=output,
        params=params,
    )


async def show_work(client: ApiClient, kind: SpecKind, work_id: str, *, output: Output) -> int:
    base = ("/v1/jobs/" if kind == "training" else "/v1/deployments/") + path_segment(work_id)
    view_type: type[JobView | DeploymentView] = JobView if kind == "training" else DeploymentView
    # Both at once; a failure of either cancels the other (run_client says the first).
    async with asyncio.TaskGroup() as requests:
        asked = requests.create_task(client.ask("GET", base, view_type))
        explaining = requests.create_task(_explanation(client, base))
    work, explained = asked.result(), explaining.result()

    def shown() -> None:
        explain = None if explained is None else explained.value
        render_work(work.value, explain, output.out, wide=output.wide)

    # The work as the API answers it, with its explanation under `explain` (a job
    # array has none of its own: each task has its own). Both are JSON objects: decoded
    # into their views above.
    combined = msgspec.json.decode(work.payload)
    combined["explain"] = None if explained is None else msgspec.json.decode(explained.payload)
    emit(output, combined, shown)
    return EXIT_OK


async def _explanation(client: ApiClient, base: str) -> Reply[ExplainView] | None:
    """The work's explanation; None for a job array's id, which names no single job (a
    404 of the work itself is the GET's to report)."""
    try:
        return await client.ask("GET", base + "/explain", ExplainView)
    except CliError as error:
        if error.status == 404:
            return None
        raise


async def scale(client: ApiClient, deployment_id: str, replicas: int, *, output: Output) -> int:
    """`PATCH {"replicas": N}`: more are placed by the next pass, fewer given back."""
    reply = await client.ask(
        "PATCH",
        f"/v1/deployments/{path_segment(deployment_id)}",
        DeploymentView,
        body=msgspec.json.encode({"replicas": replicas}),
    )
    work = reply.value
    emit(
        output,
        reply.payload,
        lambda: output.out.write(f"deployment {work.id} scaled to {work.replicas} replica(s)\n"),
    )
    return EXIT_OK


async def end_rollout(client: ApiClient, deployment_id: str, action: str, *, output: Output) -> int:
    """`promote` or `abort` a deployment's canary rollout."""
    path = f"/v1/deployments/{path_segment(deployment_id)}/rollout/{action}"
    reply = await client.ask("POST", path, DeploymentView)

    def said() -> None:
        work = reply.value
        done = "promoted" if action == "promote" else "rolled back"
        output.out.write(f"deployment {work.id}: rollout {done}, serving {work.model_id}\n")

    emit(output, reply.payload, said)
    return EXIT_OK


async def cancel(
    client: ApiClient, work_id: str, *, output: Output, confirm_bulk: bool = False
) -> int:
    """Cancel a job, or a deployment (the id says which only to the server);
    `confirm_bulk`: an admin's cancellation past the per-minute limit goes ahead."""
    headers = bulk_confirmation(confirm_bulk)
    segment = path_segment(work_id)
    for path in ("/v1/jobs/", "/v1/deployments/"):
        try:
            reply = await client.ask("DELETE", path + segment, _Cancelled, headers=headers)
        except CliError as error:
            if error.status == 404:
                continue  # perhaps a deployment; or neither
            raise
        noun = "job" if path == "/v1/jobs/" else "deployment"
        line = f"{noun} {work_id} {reply.value.state}\n"
        emit(output, reply.payload, functools.partial(output.out.write, line))
        return EXIT_OK
    raise CliError(not_found_text(work_id), status=404)


class _Cancelled(msgspec.Struct, frozen=True):
    """What `cancel` says of the work the API answers with (a job's, an array's or a
    deployment's view)."""

    state: str


# The shortest id prefix the API takes (cloud/work/lookup.py's MIN_PREFIX, not imported:
# it would load the store into every command).
MIN_ID_PREFIX: Final = 4


def not_found_text(reference: str) -> str:
    """What a reference that names neither a job nor a deployment was looked for as."""
    if len(reference) < MIN_ID_PREFIX:
        return (
            f"no job or deployment is named {reference!r}, and an id prefix needs at least "
            f"{MIN_ID_PREFIX} characters"
        )
    return f"no job or deployment has the id, the name or an id starting with {reference!r}"


async def logs(
    client: ApiClient,
    job_id: str,
    *,
    follow: bool,
    tail: int | None,
    attempt: int | None,
    node: str | None,
    out: TextIO | None = None,  # default: sys.stdout as it is then, not at import
) -> int:
    """The job's output; `follow`: then its new output as it comes, until the job has
    ended (exit status 0) or the control plane ends the stream before (a failure).
    `job_id`: the job's own id (its caller resolved the name or prefix once): by the
    time a followed job ends, the name may mean another job."""
    out = out or sys.stdout
    params = {"follow": "true" if follow else "false"}
    if tail is not None:
        params["tail"] = str(tail)
    if attempt is not None:
        params["attempt"] = str(attempt)
    if node is not None:
        params["node"] = node
    # A chunk may end inside a UTF-8 character: the decoder keeps it for the next one.
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    async for chunk in client.stream(f"/v1/jobs/{path_segment(job_id)}/logs", params):
        out.write(decoder.decode(chunk))
        out.flush()
    out.write(decoder.decode(b"", final=True))
    out.flush()
    if follow:
        await _check_followed_job_ended(client, job_id)
    return EXIT_OK


class _JobState(msgspec.Struct, frozen=True):
    """A job's view, read for its id and state."""

    id: str
    state: str


_JOB_ENDED_STATES: Final = frozenset({"succeeded", "failed", "cancelled"})


async def _check_followed_job_ended(client: ApiClient, job_id: str) -> None:
    """After a followed log's stream: the control plane ends it once the job has ended,
    but also when it stops or the token is revoked, and only the first may pass for
    success (`greenfed logs $J -f && next`). With the token revoked, asking is refused:
    that refusal is what is said."""
    job = await client.get(f"/v1/jobs/{path_segment(job_id)}", _JobState)
    if job.state not in _JOB_ENDED_STATES:
        raise CliError(
            "the control plane ended the log stream before the job ended "
            "(stopping, or the token was revoked)"
        )


async def list_models(client: ApiClient, *, limit: int, cursor: str | None, output: Output) -> int:
    params = {"limit": str(limit)} | ({"cursor": cursor} if cursor else {})
    return await get_and_show(
        client,
        "/v1/models",
        ModelList,
        lambda models: render_models(models, output.out, wide=output.wide),
        output=output,
        params=params,
    )


async def upload_model(client: ApiClient, file: Path, name: str, *, output: Output) -> int:
    reply = await client.upload("/v1/models", file, {"name": name}, ModelView)

    def said() -> None:
        model = reply.value
        output.out.write(
            f"model {model.id} uploaded: {model.name}, opset {model.opset}, "
            f"{model.size_bytes} bytes, sha256 {model.sha256[:16]}…\n"
        )

    emit(output, reply.payload, said)
    return EXIT_OK


async def list_tenants(client: ApiClient, *, output: Output) -> int:
    return await get_and_show(
        client,
        "/v1/tenants",
        TenantList,
        lambda tenants: render_tenants(tenants, output.out, wide=output.wide),
        output=output,
    )


# A count is ASCII digits: str.isdigit() also takes "²" (which int() refuses) and "٣"
# (which it reads as 3), neither of which a person means as a quota.
_COUNT: Final = re.compile(r"[0-9]+")


def parse_counts(option: str, values: list[str], *, slices: bool = False) -> dict[str, int]:
    """`gpu=8` (repeatable, or comma-separated) to {"gpu": 8}; with ``slices``, also MIG
    slices per profile (`mig-1g.10gb=7`)."""
    counts: dict[str, int] = {}
    for value in values:
        for item in value.split(","):
            kind, _, number = item.partition("=")
            kind = kind.strip()
            known = kind in ("gpu", "npu", "cpu") or (slices and is_quota_resource(kind))
            number = number.strip()
            if not known or _COUNT.fullmatch(number) is None:
                kinds = (
                    "gpu, npu, cpu or mig-1g.10gb (a MIG profile)" if slices else "gpu, npu or cpu"
                )
                raise CliError(f"{option} {item!r}: expected KIND=COUNT, KIND {kinds}")
            counts[kind] = int(number)
    return counts


async def create_tenant(
    client: ApiClient,
    *,
    name: str,
    quotas: dict[str, int],
    borrowing_limit: dict[str, int],
    cohort: str | None,
    priorities: tuple[str, ...] | None,
    admin: bool,
    output: Output,
    max_running: int | None = None,
    max_queued: int | None = None,
    lending_limit: dict[str, int] | None = None,
) -> int:
    body: dict[str, object] = {
        "name": name,
        "quotas": quotas,
        "borrowing_limit": borrowing_limit,
        "admin": admin,
        "max_running": max_running,
        "max_queued": max_queued,
    }
    if lending_limit:
        body["lending_limit"] = lending_limit
    if cohort:
        body["cohort"] = cohort
    if priorities:
        body["allowed_priorities"] = list(priorities)
    reply = await client.ask("POST", "/v1/tenants", TenantCreated, body=msgspec.json.encode(body))

    def said() -> None:
        created = reply.value
        output.out.write(
            f"tenant {created.name} created ({created.id})\n"
            f"token (shown only now, keep it secret): {created.token}\n"
        )

    emit(output, reply.payload, said)
    return EXIT_OK


async def set_tenant(
    client: ApiClient, name: str, changes: dict[str, object], *, output: Output
) -> int:
    """`PATCH /v1/tenants/{name}` with what was given; the tenant as it is now."""
    reply = await client.ask(
        "PATCH", f"/v1/tenants/{path_segment(name)}", TenantView, body=msgspec.json.encode(changes)
    )
    emit(output, reply.payload, lambda: output.out.write(_changed_line(reply.value)))
    return EXIT_OK


def _changed_line(tenant: TenantView) -> str:
    caps = ", ".join(
        f"{what} {'unlimited' if value is None else value}"
        for what, value in (("max running", tenant.max_running), ("max queued", tenant.max_queued))
    )
    cohort = f", cohort {tenant.cohort}" if tenant.cohort else ""
    if tenant.lending_limit:
        cohort += f", lends at most {_counts(tenant.lending_limit)}"
    return (
        f"tenant {tenant.name} changed: quotas {quota_text(tenant)}{cohort}, {caps}, "
        f"priorities {','.join(tenant.allowed_priorities)}; the scheduler applies it from its "
        "next pass\n"
    )
