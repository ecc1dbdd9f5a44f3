"""The published JSON Schemas: valid Draft 2020-12, in step with the Structs and the contract."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from shared.messages import (
    SCHEMA_VERSION,
    Accelerator,
    AcceleratorSample,
    DesiredDeployment,
    DesiredState,
    HostInfo,
    JobLogChunk,
    NodeEvent,
    NodeStatus,
    ReportedState,
    Telemetry,
    WireStruct,
    encode,
)
from shared.schemas import all_payload_schemas, payload_schema, schema_catalog
from shared.topics import CHANNEL_SPECS, Channel, Topics

# The contract table of ARCHITECTURE.md, "MQTT contract (v1)": what third parties build on.
CONTRACT_TABLE: dict[str, tuple[int, bool, str]] = {
    # topic: (QoS, retained, direction)
    "status": (1, True, "agent to cloud"),
    "telemetry": (0, False, "agent to cloud"),
    "desired": (1, True, "cloud to agent"),
    "reported": (1, True, "agent to cloud"),
    "events": (1, False, "agent to cloud"),
    # Added in schema 1.1 (docs/mqtt.md): training workers' output. QoS 1 (was 0) once
    # agents spool chunks on disk and resend them until acknowledged.
    "logs": (1, False, "agent to cloud"),
}

_MAJOR, _MINOR = SCHEMA_VERSION.split(".")
NEWER_MINOR_VERSION = f"{_MAJOR}.{int(_MINOR) + 1}"

SAMPLE_PAYLOADS: dict[Channel, WireStruct] = {
    Channel.STATUS: NodeStatus(
        node_id="t4-frankfurt-1",
        state="offline",
        offline_reason="connection-lost",
        instance_id="i-1",
        agent_version="0.1.0",
        site="edge",
        zone="DE",
        region="europe-west3",
        labels={"city": "frankfurt"},
        host=HostInfo(
            hostname="t4-1", os="Linux", arch="x86_64", cpu_logical_cores=32, memory_total_bytes=1
        ),
        accelerators=(
            Accelerator(
                id="gpu0",
                kind="gpu",
                vendor="nvidia",
                model="Tesla T4",
                memory_bytes=16 * 1024**3,
                compute_units=40,
                uuid="GPU-4c1d0f2e-0000-1111-2222-333344445555",
                index=0,
                pci_bus_id="00000000:3B:00.0",
            ),
        ),
        telemetry_interval_s=5.0,
        started_at=1_700_000_000.0,
        sent_at=1_700_000_000.0,
    ),
    Channel.TELEMETRY: Telemetry(
        node_id="t4-frankfurt-1",
        instance_id="i-1",
        seq=3,
        sampled_at=1_700_000_015.0,
        interval_s=5.0,
        cpu_utilization_pct=55.5,
        memory_used_bytes=10,
        memory_total_bytes=100,
        accelerators=(
            AcceleratorSample(id="gpu0", utilization_pct=99.9, memory_used_bytes=5, power_w=65.0),
        ),
    ),
    Channel.DESIRED: DesiredState(
        node_id="t4-frankfurt-1",
        generation=2,
        deployments=(DesiredDeployment(deployment_id="d1"),),
        issued_at=1_700_000_000.0,
    ),
    Channel.REPORTED: ReportedState(
        node_id="t4-frankfurt-1", instance_id="i-1", observed_generation=2, reported_at=1.0
    ),
    Channel.EVENTS: NodeEvent(
        node_id="t4-frankfurt-1", event_id="e1", kind="ready", subject="d1", occurred_at=2.0
    ),
    Channel.LOGS: JobLogChunk(
        node_id="t4-frankfurt-1",
        job_id="j1",
        attempt=1,
        offset=4096,
        text="epoch 3\n",
        dropped_bytes=10,
        sent_at=3.0,
    ),
}


def validator(channel: Channel) -> Draft202012Validator:
    return Draft202012Validator(payload_schema(channel))


def sample_json(channel: Channel) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(encode(SAMPLE_PAYLOADS[channel]))
    return payload


@pytest.mark.parametrize("channel", list(Channel))
def test_every_generated_schema_is_a_valid_draft_2020_12_schema(channel: Channel) -> None:
    schema = payload_schema(channel)
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_every_schema_has_its_own_id() -> None:
    ids = [schema["$id"] for schema in all_payload_schemas().values()]
    assert len(set(ids)) == len(ids) == len(Channel)


@pytest.mark.parametrize("channel", list(Channel))
def test_payloads_encoded_from_real_structs_satisfy_their_schema(channel: Channel) -> None:
    errors = list(validator(channel).iter_errors(sample_json(channel)))
    assert errors == []


@pytest.mark.parametrize("channel", list(Channel))
def test_schemas_accept_fields_added_by_a_newer_minor_version(channel: Channel) -> None:
    payload = sample_json(channel)
    payload["schema_version"] = NEWER_MINOR_VERSION
    payload["added_later"] = {"anything": True}
    assert list(validator(channel).iter_errors(payload)) == []


@pytest.mark.parametrize("channel", list(Channel))
def test_schemas_reject_a_payload_without_a_required_field(channel: Channel) -> None:
    payload = sample_json(channel)
    del payload["node_id"]
    assert not validator(channel).is_valid(payload)


@pytest.mark.parametrize("channel", list(Channel))
def test_schemas_reject_another_major_schema_version(channel: Channel) -> None:
    payload = sample_json(channel)
    payload["schema_version"] = "2.0"
    assert not validator(channel).is_valid(payload)


@pytest.mark.parametrize("node_id", ["a/b", "+", "#", ""])
def test_schemas_reject_node_ids_that_are_not_one_topic_level(node_id: str) -> None:
    payload = sample_json(Channel.TELEMETRY)
    payload["node_id"] = node_id
    assert not validator(Channel.TELEMETRY).is_valid(payload)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("seq",), "3"),
        (("cpu_utilization_pct",), 100.5),
        (("cpu_utilization_pct",), -1),
        (("accelerators", 0, "utilization_pct"), 101),
        (("memory_used_bytes",), -1),
        (("interval_s",), 0),
        (("accelerators",), {"gpu0": {}}),
    ],
)
def test_the_telemetry_schema_rejects_type_and_range_violations(
    path: tuple[str | int, ...], value: object
) -> None:
    payload = sample_json(Channel.TELEMETRY)
    container: Any = payload
    for step in path[:-1]:
        container = container[step]
    container[path[-1]] = value
    assert not validator(Channel.TELEMETRY).is_valid(payload)


def test_the_status_schema_rejects_values_outside_its_enumerations() -> None:
    status_validator = validator(Channel.STATUS)
    for field, value in [("state", "sleeping"), ("site", "fog"), ("offline_reason", "bored")]:
        payload = sample_json(Channel.STATUS)
        payload[field] = value
        assert not status_validator.is_valid(payload), field


@pytest.mark.parametrize(
    ("pci_bus_id", "valid"),
    [
        ("00000000:3B:00.0", True),  # NVML's busId
        ("0000:3b:00.0", True),  # lspci -D
        ("", True),  # unknown
        ("3B:00.0", False),
        ("00000000:3B:00.0 ", False),
        ('0000:3b:00.0"}', False),
    ],
)
def test_the_status_schema_holds_pci_bus_ids_to_the_pci_address_form(
    pci_bus_id: str, valid: bool
) -> None:
    payload = sample_json(Channel.STATUS)
    payload["accelerators"][0]["pci_bus_id"] = pci_bus_id
    assert validator(Channel.STATUS).is_valid(payload) is valid


def test_the_catalog_lists_every_channel_with_the_contracts_qos_and_retain_flags() -> None:
    catalog = schema_catalog(Topics())

    assert set(catalog) == set(CONTRACT_TABLE)
    for name, (qos, retained, direction) in CONTRACT_TABLE.items():
        entry = catalog[name]
        assert (entry["qos"], entry["retained"], entry["direction"]) == (qos, retained, direction)
        spec = CHANNEL_SPECS[Channel(name)]
        assert (spec.qos, spec.retained, spec.direction) == (qos, retained, direction)


def test_the_catalog_names_each_channels_topic_under_the_configured_root() -> None:
    default = schema_catalog(Topics())
    custom = schema_catalog(Topics("plant-7"))

    for name in CONTRACT_TABLE:
        assert default[name]["topic"] == f"greenfed/v1/nodes/{{node_id}}/{name}"
        assert custom[name]["topic"] == f"plant-7/v1/nodes/{{node_id}}/{name}"


def test_the_catalog_carries_the_same_schema_as_payload_schema() -> None:
    catalog = schema_catalog(Topics())
    for channel in Channel:
        assert catalog[channel.value]["schema"] == payload_schema(channel)
