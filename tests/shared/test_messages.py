"""The v1 wire payloads: round trips, schema evolution in both directions, and validation."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.messages import (
    DESIRED_DECODER,
    EVENT_DECODER,
    LOG_DECODER,
    REPORTED_DECODER,
    SCHEMA_VERSION,
    STATUS_DECODER,
    TELEMETRY_DECODER,
    Accelerator,
    AcceleratorSample,
    DeploymentSample,
    DesiredDeployment,
    DesiredState,
    DesiredTraining,
    HostInfo,
    JobLogChunk,
    NodeEvent,
    NodeStatus,
    ReplicaSample,
    ReportedState,
    Telemetry,
    WireStruct,
    encode,
)

GIB = 1024**3


def full_status() -> NodeStatus:
    """A birth message with every optional field set, so a round trip covers them all."""
    return NodeStatus(
        node_id="orin-nano-toronto-1",
        state="online",
        offline_reason=None,
        instance_id="0b6f1f1c",
        agent_version="0.1.0",
        site="edge",
        zone="CA-ON",
        region="northamerica-northeast2",
        labels={"city": "toronto", "camera": "yes"},
        host=HostInfo(
            hostname="orin-1",
            os="Linux",
            arch="aarch64",
            cpu_logical_cores=6,
            memory_total_bytes=8 * GIB,
        ),
        accelerators=(
            Accelerator(
                id="gpu0",
                kind="gpu",
                vendor="nvidia",
                model="A100",
                memory_bytes=80 * GIB,
                compute_units=108,
                idle_power_w=50.0,
                max_power_w=400.0,
                relative_speed=1.0,
                onnx_providers=("CUDAExecutionProvider",),
                uuid="GPU-1234",
                index=0,
                pci_bus_id="00000000:3B:00.0",
            ),
            Accelerator(
                id="gpu0-mig1",
                kind="gpu",
                vendor="nvidia",
                model="A100 MIG 3g.40gb",
                memory_bytes=40 * GIB,
                compute_units=42,
                parent_id="gpu0",
                features=("mig",),
                pci_bus_id="00000000:3B:00.0",
            ),
            Accelerator(
                id="cpu0",
                kind="cpu",
                vendor="arm",
                model="Cortex-A78AE",
                memory_bytes=8 * GIB,
                compute_units=6,
                features=("asimd",),
            ),
        ),
        telemetry_interval_s=5.0,
        started_at=1_700_000_000.0,
        sent_at=1_700_000_001.5,
    )


def full_telemetry() -> Telemetry:
    return Telemetry(
        node_id="orin-nano-toronto-1",
        instance_id="0b6f1f1c",
        seq=42,
        sampled_at=1_700_000_010.0,
        interval_s=5.0,
        cpu_utilization_pct=12.5,
        memory_used_bytes=3 * GIB,
        memory_total_bytes=8 * GIB,
        accelerators=(
            AcceleratorSample(
                id="gpu0",
                utilization_pct=100.0,
                memory_used_bytes=GIB,
                power_w=14.2,
                temperature_c=-5.0,
                energy_j=1234.5,
            ),
            AcceleratorSample(id="cpu0", utilization_pct=0.0, memory_used_bytes=0),
        ),
        deployments=(
            DeploymentSample(
                deployment_id="resnet50",
                requests=12,
                errors=1,
                rejected=2,
                requests_per_s=2.4,
                latency_p50_ms=3.0,
                latency_p95_ms=9.5,
                latency_p99_ms=11.0,
                mean_batch_size=1.5,
                replicas=(
                    ReplicaSample(
                        replica=0,
                        requests=4,
                        errors=1,
                        rejected=2,
                        requests_per_s=0.8,
                        latency_p95_ms=11.0,
                    ),
                    ReplicaSample(replica=1, requests=8, errors=0, rejected=0, requests_per_s=1.6),
                ),
            ),
        ),
    )


def full_desired() -> DesiredState:
    return DesiredState(
        node_id="t4-frankfurt-2",
        generation=7,
        deployments=(DesiredDeployment(deployment_id="resnet50"),),
        training=(DesiredTraining(job_id="job-1"), DesiredTraining(job_id="job-2")),
        issued_at=1_700_000_000.0,
    )


def full_reported() -> ReportedState:
    return ReportedState(
        node_id="t4-frankfurt-2",
        instance_id="aa11",
        observed_generation=7,
        reported_at=1_700_000_002.0,
    )


def full_event() -> NodeEvent:
    return NodeEvent(
        node_id="t4-frankfurt-2",
        event_id="evt-0001",
        kind="preempted",
        subject="job-1",
        detail="a higher-priority job needed the GPU",
        occurred_at=1_700_000_003.0,
    )


def full_log() -> JobLogChunk:
    return JobLogChunk(
        node_id="h100-losangeles-1",
        job_id="llm-ft",
        attempt=2,
        offset=65536,
        text="step 1200 loss 1.83\nstep 1300 loss 1.79\n",
        dropped_bytes=128,
        sent_at=1_700_000_004.0,
    )


ROUND_TRIPS: list[tuple[WireStruct, msgspec.json.Decoder[Any]]] = [
    (full_status(), STATUS_DECODER),
    (full_telemetry(), TELEMETRY_DECODER),
    (full_desired(), DESIRED_DECODER),
    (full_reported(), REPORTED_DECODER),
    (full_event(), EVENT_DECODER),
    (full_log(), LOG_DECODER),
]
ROUND_TRIP_IDS = ["status", "telemetry", "desired", "reported", "events", "logs"]
MESSAGES = [message for message, _ in ROUND_TRIPS]


def as_json(message: WireStruct) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(encode(message))
    return decoded


@pytest.mark.parametrize(("message", "decoder"), ROUND_TRIPS, ids=ROUND_TRIP_IDS)
def test_every_payload_survives_an_encode_decode_round_trip(
    message: WireStruct, decoder: msgspec.json.Decoder[Any]
) -> None:
    assert decoder.decode(encode(message)) == message


@pytest.mark.parametrize(("message", "decoder"), ROUND_TRIPS, ids=ROUND_TRIP_IDS)
def test_decoders_ignore_fields_added_by_a_newer_agent(
    message: WireStruct, decoder: msgspec.json.Decoder[Any]
) -> None:
    payload = as_json(message)
    payload["added_in_v1_9"] = {"nested": [1, 2, 3]}
    payload["schema_version"] = "1.9"

    decoded = decoder.decode(json.dumps(payload).encode())

    assert decoded == msgspec.structs.replace(message, schema_version="1.9")


def test_unknown_fields_inside_nested_structs_are_ignored_too() -> None:
    status = as_json(full_status())
    status["host"]["numa_nodes"] = 2
    status["accelerators"][0]["nvlink_peers"] = ["gpu1"]
    telemetry = as_json(full_telemetry())
    telemetry["accelerators"][0]["fan_speed_pct"] = 40
    desired = as_json(full_desired())
    desired["deployments"][0]["replicas"] = 3

    assert STATUS_DECODER.decode(json.dumps(status).encode()) == full_status()
    assert TELEMETRY_DECODER.decode(json.dumps(telemetry).encode()) == full_telemetry()
    assert DESIRED_DECODER.decode(json.dumps(desired).encode()) == full_desired()


def test_a_serving_sample_from_an_agent_before_1_13_has_no_replica_figures() -> None:
    """Such an agent samples each deployment as a whole (cloud/loop/rollout.py judges
    its node as one)."""
    payload = as_json(full_telemetry())
    del payload["deployments"][0]["replicas"]
    payload["schema_version"] = "1.12"

    decoded = TELEMETRY_DECODER.decode(json.dumps(payload).encode())

    assert decoded.deployments[0].replicas == ()
    assert decoded.deployments[0].requests == 12


def test_a_status_from_an_agent_that_predates_the_defaulted_fields_still_decodes() -> None:
    payload = as_json(full_status())
    for defaulted in ("schema_version", "offline_reason", "labels"):
        del payload[defaulted]
    for accelerator in payload["accelerators"]:
        for defaulted in (
            "idle_power_w",
            "max_power_w",
            "relative_speed",
            "onnx_providers",
            "uuid",
            "index",
            "parent_id",
            "features",
            "pci_bus_id",
        ):
            del accelerator[defaulted]

    decoded = STATUS_DECODER.decode(json.dumps(payload).encode())

    assert decoded.schema_version == SCHEMA_VERSION
    assert decoded.labels == {}
    assert decoded.offline_reason is None
    first = decoded.accelerators[0]
    assert first.relative_speed is None
    assert first.onnx_providers == ()
    assert first.features == ()
    assert first.parent_id is None
    assert first.pci_bus_id == ""


def test_telemetry_without_accelerator_samples_or_optional_readings_still_decodes() -> None:
    payload = as_json(full_telemetry())
    del payload["accelerators"]
    assert TELEMETRY_DECODER.decode(json.dumps(payload).encode()).accelerators == ()

    payload = as_json(full_telemetry())
    for sample in payload["accelerators"]:
        for defaulted in ("power_w", "temperature_c", "energy_j"):
            sample.pop(defaulted)
    sample_decoded = TELEMETRY_DECODER.decode(json.dumps(payload).encode()).accelerators[0]
    assert (sample_decoded.power_w, sample_decoded.temperature_c, sample_decoded.energy_j) == (
        None,
        None,
        None,
    )


def test_events_and_desired_state_without_optional_fields_still_decode() -> None:
    event = as_json(full_event())
    del event["subject"], event["detail"]
    decoded_event = EVENT_DECODER.decode(json.dumps(event).encode())
    assert (decoded_event.subject, decoded_event.detail) == (None, "")

    desired = as_json(full_desired())
    del desired["deployments"], desired["training"]
    decoded_desired = DESIRED_DECODER.decode(json.dumps(desired).encode())
    assert (decoded_desired.deployments, decoded_desired.training) == ((), ())


@pytest.mark.parametrize("node_id", ["", "a/b", "node+1", "node#", "+", "#", "-leading", "a b"])
def test_a_node_id_that_is_not_one_topic_level_is_rejected_in_every_payload(node_id: str) -> None:
    for message, decoder in ROUND_TRIPS:
        payload = as_json(message)
        payload["node_id"] = node_id
        with pytest.raises(msgspec.ValidationError, match="node_id"):
            decoder.decode(json.dumps(payload).encode())


def test_a_node_id_longer_than_128_characters_is_rejected() -> None:
    payload = as_json(full_telemetry())
    payload["node_id"] = "n" * 128
    TELEMETRY_DECODER.decode(json.dumps(payload).encode())  # the longest allowed
    payload["node_id"] = "n" * 129
    with pytest.raises(msgspec.ValidationError, match="node_id"):
        TELEMETRY_DECODER.decode(json.dumps(payload).encode())


def test_a_node_id_with_a_trailing_newline_is_rejected() -> None:
    payload = as_json(full_telemetry())
    payload["node_id"] = "node-1\n"
    with pytest.raises(msgspec.ValidationError, match="node_id"):
        TELEMETRY_DECODER.decode(json.dumps(payload).encode())


@pytest.mark.parametrize("utilization_pct", [-0.01, 100.01, 250.0])
def test_utilisation_outside_0_to_100_percent_is_rejected(utilization_pct: float) -> None:
    host = as_json(full_telemetry())
    host["cpu_utilization_pct"] = utilization_pct
    with pytest.raises(msgspec.ValidationError, match="cpu_utilization_pct"):
        TELEMETRY_DECODER.decode(json.dumps(host).encode())

    device = as_json(full_telemetry())
    device["accelerators"][0]["utilization_pct"] = utilization_pct
    with pytest.raises(msgspec.ValidationError, match="utilization_pct"):
        TELEMETRY_DECODER.decode(json.dumps(device).encode())


@pytest.mark.parametrize("utilization_pct", [0.0, 100.0])
def test_utilisation_at_the_bounds_is_accepted(utilization_pct: float) -> None:
    payload = as_json(full_telemetry())
    payload["cpu_utilization_pct"] = utilization_pct
    decoded = TELEMETRY_DECODER.decode(json.dumps(payload).encode())
    assert decoded.cpu_utilization_pct == utilization_pct


def test_a_telemetry_seq_beyond_2_to_the_53_is_rejected() -> None:
    """The control plane stores how far each node's samples were counted: a number past
    its column failed every node's usage flush (cloud/store/usage.py)."""
    payload = as_json(full_telemetry())
    payload["seq"] = 2**53
    assert TELEMETRY_DECODER.decode(json.dumps(payload).encode()).seq == 2**53
    for seq in (2**53 + 1, 2**63, 2**64 - 1):
        payload["seq"] = seq
        with pytest.raises(msgspec.ValidationError, match="seq"):
            TELEMETRY_DECODER.decode(json.dumps(payload).encode())


def test_negative_memory_is_rejected_wherever_memory_is_reported() -> None:
    telemetry = as_json(full_telemetry())
    telemetry["memory_used_bytes"] = -1
    with pytest.raises(msgspec.ValidationError, match="memory_used_bytes"):
        TELEMETRY_DECODER.decode(json.dumps(telemetry).encode())

    sample = as_json(full_telemetry())
    sample["accelerators"][0]["memory_used_bytes"] = -1
    with pytest.raises(msgspec.ValidationError, match="memory_used_bytes"):
        TELEMETRY_DECODER.decode(json.dumps(sample).encode())

    accelerator = as_json(full_status())
    accelerator["accelerators"][0]["memory_bytes"] = -GIB
    with pytest.raises(msgspec.ValidationError, match="memory_bytes"):
        STATUS_DECODER.decode(json.dumps(accelerator).encode())

    host = as_json(full_status())
    host["host"]["memory_total_bytes"] = -1
    with pytest.raises(msgspec.ValidationError, match="memory_total_bytes"):
        STATUS_DECODER.decode(json.dumps(host).encode())


@pytest.mark.parametrize("schema_version", ["2.0", "0.9", "1", "1.", "v1.0", "10.0", "1.0.0"])
def test_a_schema_version_of_another_major_or_malformed_is_rejected(schema_version: str) -> None:
    for message, decoder in ROUND_TRIPS:
        payload = as_json(message)
        payload["schema_version"] = schema_version
        with pytest.raises(msgspec.ValidationError, match="schema_version"):
            decoder.decode(json.dumps(payload).encode())


def test_a_later_minor_schema_version_is_accepted() -> None:
    payload = as_json(full_telemetry())
    payload["schema_version"] = "1.17"
    assert TELEMETRY_DECODER.decode(json.dumps(payload).encode()).schema_version == "1.17"


@pytest.mark.parametrize(
    ("field", "value"),
    [("state", "sleeping"), ("site", "fog"), ("offline_reason", "bored")],
)
def test_status_enumerations_reject_values_outside_the_contract(field: str, value: str) -> None:
    payload = as_json(full_status())
    payload[field] = value
    with pytest.raises(msgspec.ValidationError, match=field):
        STATUS_DECODER.decode(json.dumps(payload).encode())


def test_an_accelerator_kind_outside_gpu_npu_cpu_is_rejected() -> None:
    payload = as_json(full_status())
    payload["accelerators"][0]["kind"] = "tpu"
    with pytest.raises(msgspec.ValidationError, match="kind"):
        STATUS_DECODER.decode(json.dumps(payload).encode())


def test_a_telemetry_interval_of_zero_is_rejected() -> None:
    payload = as_json(full_status())
    payload["telemetry_interval_s"] = 0
    with pytest.raises(msgspec.ValidationError, match="telemetry_interval_s"):
        STATUS_DECODER.decode(json.dumps(payload).encode())


@pytest.mark.parametrize("message", MESSAGES, ids=ROUND_TRIP_IDS)
def test_payload_structs_are_frozen(message: WireStruct) -> None:
    with pytest.raises(AttributeError):
        message.node_id = "someone-else"  # type: ignore[attr-defined]


def test_nested_structs_are_frozen() -> None:
    with pytest.raises(AttributeError):
        full_status().host.hostname = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        full_telemetry().accelerators[0].power_w = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("message", MESSAGES, ids=ROUND_TRIP_IDS)
def test_schema_version_is_always_encoded_even_when_left_at_its_default(
    message: WireStruct,
) -> None:
    assert as_json(message)["schema_version"] == SCHEMA_VERSION == "1.13"


def test_fields_left_at_their_defaults_are_still_written_on_the_wire() -> None:
    minimal = Telemetry(
        node_id="n1",
        instance_id="i1",
        seq=0,
        sampled_at=0.0,
        interval_s=1.0,
        cpu_utilization_pct=0.0,
        memory_used_bytes=0,
        memory_total_bytes=0,
        accelerators=(AcceleratorSample(id="gpu0", utilization_pct=1.0, memory_used_bytes=0),),
    )
    payload = as_json(minimal)
    assert payload["accelerators"][0] == {
        "id": "gpu0",
        "utilization_pct": 1.0,
        "memory_used_bytes": 0,
        "power_w": None,
        "temperature_c": None,
        "energy_j": None,
    }


@given(
    seq=st.integers(min_value=0, max_value=2**53),
    cpu_pct=st.floats(min_value=0, max_value=100),
    accelerator_pct=st.floats(min_value=0, max_value=100),
    memory_used=st.integers(min_value=0, max_value=2**60),
    energy_j=st.none() | st.floats(min_value=0, max_value=1e15),
    temperature_c=st.none() | st.floats(min_value=-50, max_value=150),
)
def test_any_valid_telemetry_sample_round_trips_unchanged(
    seq: int,
    cpu_pct: float,
    accelerator_pct: float,
    memory_used: int,
    energy_j: float | None,
    temperature_c: float | None,
) -> None:
    telemetry = Telemetry(
        node_id="n1",
        instance_id="i1",
        seq=seq,
        sampled_at=1_700_000_000.25,
        interval_s=0.5,
        cpu_utilization_pct=cpu_pct,
        memory_used_bytes=memory_used,
        memory_total_bytes=memory_used,
        accelerators=(
            AcceleratorSample(
                id="gpu0",
                utilization_pct=accelerator_pct,
                memory_used_bytes=memory_used,
                energy_j=energy_j,
                temperature_c=temperature_c,
            ),
        ),
    )
    assert TELEMETRY_DECODER.decode(encode(telemetry)) == telemetry
