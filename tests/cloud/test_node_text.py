"""A node's free text is made printable as it is ingested (cloud/fleet/node_text.py):
control characters (NUL, ESC, CSI, CR, DEL, C1) in births, reports and events are
replaced by U+FFFD once, where they come in; ids holding them are refused instead."""

from __future__ import annotations

import msgspec
import pytest

from cloud.fleet.ingest import Ingestor, InvalidReason
from cloud.fleet.node_text import printable_event, printable_reported, printable_status
from cloud.fleet.plausibility import Implausible, PlausibilityLimits, check_status
from cloud.fleet.registry import NodeRegistry
from cloud.loop.reports import MAX_REASON_CHARS, _reason
from shared.messages import (
    AgentUpgradeReport,
    NodeEvent,
    NodeTaint,
    ReportedDeployment,
    ReportedState,
    ReportedTraining,
    encode,
)
from shared.printable import has_control, printable
from shared.topics import Channel
from tests.cloud.test_ingest_unit import TOPICS, FakeClock, birth, topic

HOSTILE = "x\x00\x1b[2K\r\x9b2K\x1b]52;c;ZWNobw==\x07\x7f\n\ty"
CLEAN = "x\ufffd\ufffd[2K\ufffd\ufffd2K\ufffd]52;c;ZWNobw==\ufffd\ufffd\ufffd\ufffdy"


def test_printable_replaces_c0_del_and_c1_and_nothing_else() -> None:
    assert printable(HOSTILE) == CLEAN
    assert all(printable(chr(code)) == "\ufffd" for code in (*range(0x20), *range(0x7F, 0xA0)))
    # Text that reorders what follows it (a right-to-left override: "exe.txt" shown as
    # "txt.exe") or breaks the line it is on.
    reorders = (*range(0x2028, 0x202F), *range(0x2066, 0x206A))
    assert all(printable(chr(code)) == "\ufffd" for code in reorders)
    kept = "H100 [/] [link=https://x]é—€\u00a0 ☃ 𝄞"
    assert printable(kept) is kept
    assert not has_control(kept)
    assert has_control("a\x00")


@pytest.fixture
def ingestor() -> Ingestor:
    clock = FakeClock()
    registry = NodeRegistry(monotonic=clock.monotonic, wall_clock=clock.wall)
    return Ingestor(registry, TOPICS, max_payload_bytes=65536)


def _no_control(value: object) -> bool:
    """No control character in any string of `value`, as JSON decodes them."""
    found = msgspec.json.decode(encode(value))  # type: ignore[arg-type]

    def strings(node: object) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, dict):
            return [s for item in node.values() for s in strings(item)]
        if isinstance(node, list):
            return [s for item in node for s in strings(item)]
        return []

    return not any(has_control(text) for text in strings(found))


def test_a_births_free_text_is_printable_once_ingested(ingestor: Ingestor) -> None:
    gpu = msgspec.structs.replace(
        birth().accelerators[0],
        vendor=f"nv{HOSTILE}",
        model=f"A100{HOSTILE}",
        uuid=f"GPU-{HOSTILE}",
        health=f"xid 79{HOSTILE}",
        healthy=False,
        onnx_providers=(f"CUDA{HOSTILE}",),
        features=("avx2", f"f{HOSTILE}"),
    )
    status = msgspec.structs.replace(
        birth(),
        agent_version=f"1.0{HOSTILE}",
        host=msgspec.structs.replace(birth().host, hostname=f"h{HOSTILE}", os=f"L{HOSTILE}"),
        accelerators=(gpu,),
        taints=(NodeTaint(key=f"gpu/[/]{HOSTILE}", value=f"v{HOSTILE}"),),
        isolation_note=f"no bwrap{HOSTILE}",
        container_runtimes=(f"podman{HOSTILE}",),
        agent_upgrade=AgentUpgradeReport(
            version="2.0", outcome="failed", detail=f"sha256 mismatch{HOSTILE}", at=1.0
        ),
    )
    ingestor.handle(topic("n1", Channel.STATUS), encode(status))

    assert ingestor.stats.invalid_total == 0
    record = ingestor.registry.get("n1")
    assert record is not None
    kept = record.status
    assert _no_control(kept)
    device = kept.accelerators[0]
    assert (device.id, device.model, device.health) == ("gpu0", f"A100{CLEAN}", f"xid 79{CLEAN}")
    assert device.features == ("avx2", f"f{CLEAN}")
    assert kept.taints == (NodeTaint(key=f"gpu/[/]{CLEAN}", value=f"v{CLEAN}"),)
    assert kept.isolation_note == f"no bwrap{CLEAN}"
    assert kept.agent_upgrade is not None
    assert kept.agent_upgrade.detail == f"sha256 mismatch{CLEAN}"
    assert (kept.instance_id, kept.zone, kept.labels) == ("i1", "DE", {"city": "frankfurt"})


def test_a_reports_reasons_notes_providers_and_endpoints_are_printable_once_ingested(
    ingestor: Ingestor,
) -> None:
    ingestor.handle(topic("n1", Channel.STATUS), encode(birth()))
    reported = ReportedState(
        node_id="n1",
        instance_id="i1",
        observed_generation=1,
        reported_at=1.0,
        training=(
            ReportedTraining(
                job_id="j1",
                attempt=1,
                state="failed",
                reason=f"oom{HOSTILE}",
                power_limit_note=f"no nvml{HOSTILE}",
            ),
        ),
        deployments=(
            ReportedDeployment(
                deployment_id="d1",
                state="failed",
                provider=f"CUDA\x1b]8;;https://evil.example\x1b\\{HOSTILE}",
                reason=f"crash{HOSTILE}",
                endpoint=f"http://n1:9000{HOSTILE}",
                model_sha256=f"ab{HOSTILE}",
            ),
        ),
    )
    ingestor.handle(topic("n1", Channel.REPORTED), encode(reported))

    assert ingestor.stats.invalid_total == 0
    record = ingestor.registry.get("n1")
    assert record is not None
    assert record.reported is not None
    kept = record.reported
    assert _no_control(kept)
    assert kept.training[0].reason == f"oom{CLEAN}"
    assert kept.training[0].power_limit_note == f"no nvml{CLEAN}"
    assert kept.deployments[0].reason == f"crash{CLEAN}"
    assert kept.deployments[0].provider == f"CUDA\ufffd]8;;https://evil.example\ufffd\\{CLEAN}"
    assert kept.deployments[0].endpoint == f"http://n1:9000{CLEAN}"
    assert (kept.training[0].job_id, kept.deployments[0].deployment_id) == ("j1", "d1")


def test_an_events_subject_and_detail_are_printable_once_ingested() -> None:
    clock = FakeClock()
    registry = NodeRegistry(monotonic=clock.monotonic, wall_clock=clock.wall)
    heard: list[NodeEvent] = []
    ingestor = Ingestor(registry, TOPICS, max_payload_bytes=65536, on_event=heard.append)
    event = NodeEvent(
        node_id="n1",
        event_id="e-1",
        kind="failed",
        subject=f"resnet{HOSTILE}",
        detail=f"exit 1{HOSTILE}",
        occurred_at=1.0,
    )
    ingestor.handle(topic("n1", Channel.EVENTS), encode(event))

    assert [(e.subject, e.detail) for e in heard] == [(f"resnet{CLEAN}", f"exit 1{CLEAN}")]


def test_a_message_with_nothing_to_replace_is_kept_as_it_is() -> None:
    status = birth()
    reported = ReportedState(
        node_id="n1",
        instance_id="i1",
        observed_generation=1,
        reported_at=1.0,
        training=(ReportedTraining(job_id="j1", state="failed", reason="oom [/] é"),),
    )
    event = NodeEvent(node_id="n1", event_id="e", kind="ready", detail="ok", occurred_at=1.0)
    assert printable_status(status) is status
    assert printable_reported(reported) is reported
    assert printable_event(event) is event


@pytest.mark.parametrize(
    ("field", "changed"),
    [
        ("$.instance_id", lambda s: msgspec.structs.replace(s, instance_id="i\x001")),
        (
            "$.accelerators[0].id",
            lambda s: msgspec.structs.replace(
                s, accelerators=(msgspec.structs.replace(s.accelerators[0], id="gpu\x1b0"),)
            ),
        ),
        (
            "$.accelerators[0].parent_id",
            lambda s: msgspec.structs.replace(
                s,
                accelerators=(msgspec.structs.replace(s.accelerators[0], parent_id="gpu\r0"),),
            ),
        ),
    ],
)
def test_a_birth_whose_ids_hold_control_characters_is_refused(
    ingestor: Ingestor, field: str, changed: object
) -> None:
    status = changed(birth())  # type: ignore[operator]
    violation = check_status(status, PlausibilityLimits(), 1_700_000_100.0)
    assert violation is not None
    assert (violation.reason, violation.field) == (Implausible.INVALID_NAME, field)

    ingestor.handle(topic("n1", Channel.STATUS), encode(status))
    assert ingestor.registry.get("n1") is None
    assert ingestor.stats.invalid[("status", InvalidReason.INVALID_NAME.value)] == 1


def test_a_reason_stored_for_work_is_printable_and_bounded() -> None:
    assert _reason("oom\x00") == "oom\ufffd"
    assert _reason(HOSTILE) == CLEAN
    long = _reason("\x1b" * (MAX_REASON_CHARS + 10))
    assert len(long) == MAX_REASON_CHARS
    assert long.endswith("\ufffd…")
