"""What a node, a cluster or a tenant wrote reaches an admin's terminal as printable
text (shared/printable.py), never as Rich markup: `[/]` in a GPU model or a failure
reason cannot break `greenfed nodes`/`jobs`/`job` (MarkupError), `[link=...]` makes no
hidden link, and ESC, CSI (`\\x9b`), OSC 52/8 and CR never reach the terminal raw (they
would move the cursor, erase or rewrite lines, or write the clipboard)."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import msgspec
import pytest

from cloud.clusters.views import ClusterList, ClusterSpec, ClusterView
from cloud.fleet.views import NodeDetail, NodeList, node_summary
from cloud.upgrades.views import RolloutList, RolloutRequest, RolloutView
from cloud.work.array_views import ArrayTaskView, JobArrayView
from cloud.work.specs import TrainingJobSpec, describe_error
from cloud.work.views import DeploymentList, EventView, JobList, ReplicaView
from greenfed.api_client import Reply
from greenfed.clusters_cli import render_clusters
from greenfed.declarative_commands import _event_line
from greenfed.nodes_cli import render_table, set_node
from greenfed.output import Output
from greenfed.replica_logs import event_line, replica_line
from greenfed.upgrade_commands import render_rollout, render_rollouts
from greenfed.work_commands import render_deployments, render_jobs, render_work, runs_line
from shared.messages import NodeTaint
from shared.printable import has_control
from tests.cli.test_deployment_output import _deployment
from tests.cli.test_power_limit_output import _job
from tests.loop.builders import device, node

# Markup that breaks Rich (a closing tag with no opening one) or hides a link, then
# erase-line, CR, CSI, OSC 52 (clipboard), OSC 8 (link), BEL, NUL, DEL.
MARKUP = "[/] [/bold] [link=https://evil.example/login]docs[/link]"
ESCAPES = "\x1b[2K\r\x9b1A\x1b]52;c;ZWNobw==\x07\x1b]8;;https://evil.example/\x07x\x00\x7f"
EVIL = f"{MARKUP}{ESCAPES}"


def _safe(text: str) -> None:
    """Every line printable, the markup shown as written (so it made nothing)."""
    for line in text.split("\n"):
        assert not has_control(line), repr(line)
    assert "[link=https://evil.example/login]" in text, text


def _safe_on_a_terminal(text: str) -> None:
    """With colours on, Rich's own SGR sequences only: no OSC (link, clipboard), no CSI
    that moves the cursor or erases, no CR."""
    assert "\x1b]" not in text, repr(text)
    assert "\x9b" not in text
    assert "\x1b[2K" not in text
    assert "\r" not in text


@pytest.fixture(params=["file", "terminal"])
def terminal(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Into a file (no colours), or as onto a colour terminal."""
    monkeypatch.setenv("COLUMNS", "2000")
    if request.param == "terminal":
        monkeypatch.setenv("FORCE_COLOR", "1")
        monkeypatch.setenv("TERM", "xterm-256color")
        return True
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    return False


def _check(text: str, terminal: bool) -> None:
    if terminal:
        _safe_on_a_terminal(text)
    else:
        _safe(text)


def _nodes() -> NodeList:
    record = node("evil-1", devices=(device("cpu", 0), device("gpu", 0, model=f"H100 {EVIL}")))
    status = msgspec.structs.replace(
        record.status,
        instance_id=f"i-{EVIL}",
        agent_version=f"1.0{EVIL}",
        isolation="user",
        container_runtimes=(f"podman{EVIL}",),
    )
    record.status = status
    summary = msgspec.structs.replace(
        node_summary(record),
        taints=(f"gpu/{EVIL}=x:NoSchedule",),
        cordoned=True,
        draining=True,
        drain_waiting=(f"waiting: {EVIL}",),
        approval="pending-approval",
        approval_differences=(f"gpu/{EVIL}: 1, enrolled 0",),
    )
    honest = node_summary(node("gpu-1"))
    return NodeList(items=(honest, summary), count=2, total=2, next_cursor=None)


@pytest.mark.parametrize("wide", [False, True])
def test_greenfed_nodes_prints_a_nodes_words_as_text(terminal: bool, wide: bool) -> None:
    out = io.StringIO()
    render_table(_nodes(), out, wide=wide)
    text = out.getvalue()
    _check(text, terminal)
    assert "gpu-1" in text
    assert "evil-1" in text


@pytest.mark.parametrize("wide", [False, True])
def test_greenfed_jobs_and_deployments_print_reasons_as_text(terminal: bool, wide: bool) -> None:
    job = msgspec.structs.replace(_job(), state="failed", reason=f"worker failed: {EVIL}")
    out = io.StringIO()
    render_jobs(JobList(items=(job,), count=1, next_cursor=None), out, wide=wide)
    deployment = msgspec.structs.replace(_deployment(), state="failed", reason=f"crash {EVIL}")
    render_deployments(
        DeploymentList(items=(deployment,), count=1, next_cursor=None), out, wide=wide
    )
    _check(out.getvalue(), terminal)
    assert "worker failed" in out.getvalue()


@pytest.mark.parametrize("wide", [False, True])
def test_greenfed_job_prints_its_reason_and_power_note_as_text(terminal: bool, wide: bool) -> None:
    job = msgspec.structs.replace(
        _job(power_limit_reported=True, power_limit_note=f"no permission {EVIL}"),
        state="failed",
        reason=f"worker on h100-la-0 failed: {EVIL}",
    )
    out = io.StringIO()
    render_work(job, None, out, wide=wide)
    text = out.getvalue()
    _check(text, terminal)
    assert "reason: worker on h100-la-0 failed" in text
    assert "no permission" in text


@pytest.mark.parametrize("wide", [False, True])
def test_greenfed_deployment_prints_its_replicas_words_as_text(terminal: bool, wide: bool) -> None:
    shown = _deployment()
    replicas = tuple(
        msgspec.structs.replace(
            replica,
            provider=f"CUDA{EVIL}",
            reason=f"loading {EVIL}",
            endpoint=None if replica.endpoint is None else f"{replica.endpoint}{EVIL}",
            model_sha256=f"ab{EVIL}",
        )
        for replica in shown.replica_states
    )
    deployment = msgspec.structs.replace(shown, replica_states=replicas, reason=f"x {EVIL}")
    out = io.StringIO()
    render_work(deployment, None, out, wide=wide)
    text = out.getvalue()
    _check(text, terminal)
    assert "loading" in text


def test_greenfed_logs_of_a_deployment_prints_a_replicas_words_on_one_line() -> None:
    replica = ReplicaView(
        replica=0,
        node_id="gpu-1",
        state="starting",
        provider="CUDA\x1b]8;;https://evil.example\x1b\\",
        endpoint=None,
        reason=f"loading\x1b[2K\x1b[1Aok [/]{ESCAPES}",
        model_sha256=None,
    )
    line = replica_line(replica, datetime(2026, 1, 1, tzinfo=UTC))
    assert line.endswith("\n")
    assert line.count("\n") == 1
    assert not has_control(line[:-1]), repr(line)
    assert line.startswith("2026-01-01T00:00:00Z  [gpu-1] replica 0: starting on CUDA")


def _state_event(reason: str) -> EventView:
    payload = {"state": "failed", "previous_state": "running", "reason": reason}
    return EventView(
        seq=3,
        kind="work.state",
        work_id="01JJOB0000000000000000000X",
        at=datetime(2026, 12, 7, 4, 0, tzinfo=UTC),
        payload=msgspec.Raw(msgspec.json.encode(payload)),
        tenant="acme",
    )


def test_greenfed_events_prints_a_reason_on_its_own_line() -> None:
    # A CR would send the cursor back: what follows would overwrite the whole line.
    forged = "\r2026-12-07T04:00:00Z  3  acme  work.state  X  scheduled -> running: ok"
    for line in (
        _event_line(_state_event(f"exit code 1{forged}{ESCAPES}")),
        event_line(_state_event(f"exit code 1{forged}")),
    ):
        assert line.endswith("\n")
        assert line.count("\n") == 1
        assert not has_control(line[:-1]), repr(line)
        assert "running -> failed: exit code 1\ufffd2026-12-07" in line

    other = EventView(
        seq=4,
        kind="work.scaled",
        work_id=None,
        at=datetime(2026, 12, 7, tzinfo=UTC),
        # JSON escapes C0 characters, not DEL or C1.
        payload=msgspec.Raw('{"reason":"x\x9b2K\x7f"}'.encode()),
    )
    assert not has_control(_event_line(other)[:-1])


def test_greenfed_clusters_prints_a_clusters_last_error_as_text(terminal: bool) -> None:
    cluster = ClusterView(
        spec=ClusterSpec(name="lab", zone="CA-ON", region="na-northeast2"),
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        created_by=f"admin{EVIL}",
        reachable=False,
        last_contact_at=None,
        last_error=f"sinfo: {EVIL}",
        nodes=1,
        accelerators={},
        unknown_accelerator_types={f"gpu:{EVIL}": 2},
        skipped_machines=(),
        pending_jobs=0,
        greenfed_jobs_running=0,
        interface=f"slurmrestd {EVIL}",
    )
    for wide in (False, True):
        out = io.StringIO()
        render_clusters(ClusterList(items=(cluster,), count=1), out, wide=wide)
        _check(out.getvalue(), terminal)
        assert "unreachable" in out.getvalue()


def test_greenfed_nodes_rollouts_print_a_nodes_upgrade_detail_as_text(terminal: bool) -> None:
    rollout = msgspec.convert(
        {
            "rollout_id": "r1",
            "version": "1.2.0",
            "phase": "halted",
            "detail": f"too many failed: {EVIL}",
            "created_at": 1.0,
            "created_by": "admin",
            "finished_at": None,
            "current_wave": 0,
            "waves": [],
            "counts": {"failed": 1},
            "nodes": {
                "gpu-1": {"wave": 0, "state": "failed", "detail": f"sha256 {EVIL}", "changed_at": 1}
            },
            "rules": msgspec.to_builtins(RolloutRequest(version="1.2.0")),
        },
        RolloutView,
    )
    out = io.StringIO()
    render_rollout(rollout, out, wide=True)
    render_rollouts(RolloutList(items=(rollout,), count=1), out, wide=True)
    text = out.getvalue()
    _check(text, terminal)
    assert "sha256" in text


def test_an_array_tasks_reason_is_printed_as_text() -> None:
    array = JobArrayView(
        id="01JARRAY000000000000000000",
        array="0-1",
        count=1,
        throttle=None,
        state="failed",
        states={"failed": 1},
        tasks=(
            ArrayTaskView(
                index=0,
                id="01JTASK0000000000000000000",
                state="failed",
                reason=f"worker failed: {EVIL}",
                attempts=1,
            ),
        ),
    )
    out = io.StringIO()
    render_work(msgspec.structs.replace(_job(), array=array), None, out, wide=True)
    _safe(out.getvalue())
    assert "worker failed" in out.getvalue()


@pytest.mark.parametrize(
    "username", ["bot\x1b[8m\x1b]52;c;Y3VybCBldmlsfHNo\x1b\\", "ci\x00", "ci\n", "a\x9bb", "\x7f"]
)
def test_a_registry_username_with_control_characters_is_refused_naming_it(
    username: str,
) -> None:
    job = {
        "name": "img",
        "command": ["python", "train.py"],
        "image": "ghcr.io/acme/trainer:2",
        "registry_auth": {"username": username, "password": "p"},
    }
    with pytest.raises(msgspec.ValidationError) as error:
        msgspec.convert(job, TrainingJobSpec)
    assert describe_error(error.value)[0] == "$.registry_auth.username"


def test_a_registry_username_is_printed_printable_and_a_plain_one_as_it_is() -> None:
    spec = msgspec.convert(
        {
            "name": "img",
            "command": ["python", "train.py"],
            "image": "ghcr.io/acme/trainer:2",
            "registry_auth": {"username": "ci-bot@acme [x]", "password": "p"},
        },
        TrainingJobSpec,
    )
    assert "registry login ci-bot@acme [x]@ghcr.io" in runs_line(spec)
    # A view stored before the rule (or from elsewhere) still prints printable.
    auth = msgspec.structs.replace(spec.registry_auth, username="bot\x1b]52;c;eA==\x07")  # type: ignore[type-var]
    line = runs_line(msgspec.structs.replace(spec, registry_auth=auth))
    assert not has_control(line)
    assert "registry login bot\ufffd]52;c;eA==\ufffd@ghcr.io" in line


async def test_greenfed_nodes_set_prints_taints_as_printable_text() -> None:
    detail = msgspec.to_builtins(_nodes().items[1]) | {
        "host": msgspec.to_builtins(node("x").status.host),
        "telemetry_interval_s": 5.0,
        "telemetry": None,
    }

    class Client:
        async def ask(self, *_: object, **__: object) -> Reply[NodeDetail]:
            payload = msgspec.json.encode(detail)
            return Reply(200, payload, msgspec.json.decode(payload, type=NodeDetail))

    out = io.StringIO()
    await set_node(Client(), "evil-1", "set", body={}, output=Output(out=out))  # type: ignore[arg-type]
    line = out.getvalue()
    assert line.count("\n") == 1
    assert not has_control(line[:-1]), repr(line)
    assert f"taints: gpu/{MARKUP}" in line


def test_a_taint_key_from_a_birth_is_shown_as_written() -> None:
    record = node("gpu-2")
    record.status = msgspec.structs.replace(
        record.status, taints=(NodeTaint(key="gpu/[/]", value="x"),)
    )
    summary = node_summary(record)
    out = io.StringIO()
    render_table(NodeList(items=(summary,), count=1, total=1, next_cursor=None), out)
    assert "gpu/[/]=x:NoSchedule" in out.getvalue()
