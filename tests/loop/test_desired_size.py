"""A node's `desired` document always fits the broker's packets (cloud/loop/desired.py):
greenfed's brokers drop a connection over a packet above 1 MiB, so a document that
outgrew it would reach its node never, and would break the publisher's session for
every other node. The work the node does not run yet gives way, newest first: its
secrets are withheld (the worker refuses to start, saying why), then, where that is not
enough, it is left out. Work the node runs is kept as it is."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from structlog.testing import capture_logs

from cloud.fleet.registry import NodeRecord
from cloud.loop.desired import DESIRED_MAX_BYTES, SIGNING_ROOM_BYTES, desired_document
from cloud.secrets.at_rest import KEY_BYTES, SecretsAtRest
from cloud.secrets.release import SecretRelease
from cloud.store import WorkRecord
from cloud.work.convert import spec_of
from cloud.work.specs import TrainingJobSpec, encode_spec
from shared.messages import DesiredState, ReportedTraining, encode
from shared.sealing import SealedSecretsError, public_key_text
from shared.settings import SchedulingSettings
from shared.worker_secrets import open_worker_secrets
from tests.loop.builders import allocation, node, work

KEYS = SecretsAtRest(os.urandom(KEY_BYTES))
NODE_KEY = X25519PrivateKey.generate()


def stored(work_id: str, submitted_at: float, **spec: Any) -> WorkRecord:
    record = dataclasses.replace(work(work_id, **spec), submitted_at=submitted_at)
    plain = spec_of(record)
    assert isinstance(plain, TrainingJobSpec)
    encrypted = KEYS.encrypt_spec(plain, tenant_id=record.tenant_id)
    return dataclasses.replace(record, spec=encode_spec(encrypted))


def secret_jobs(**spec: Any) -> dict[str, WorkRecord]:
    # Listed out of submission order: "newest" is the submission time, not the job id.
    order = {"job-3": 3.0, "job-1": 1.0, "job-4": 4.0, "job-2": 2.0}
    return {job: stored(job, at, **spec) for job, at in order.items()}


def node_a(*running: str) -> NodeRecord:
    record = node(
        "a",
        gpus=4,
        training=tuple(ReportedTraining(job_id=job, attempt=1, state="running") for job in running),
    )
    status = msgspec.structs.replace(record.status, sealing_public_key=public_key_text(NODE_KEY))
    return dataclasses.replace(record, status=status)


def document(
    records: dict[str, WorkRecord],
    node_record: NodeRecord,
    max_bytes: int = DESIRED_MAX_BYTES - SIGNING_ROOM_BYTES,
) -> DesiredState:
    return desired_document(
        "a",
        7,
        now=1.0,
        records=records,
        allocations={
            job: (allocation(job, 0, "a", (f"gpu{index}",)),)
            for index, job in enumerate(sorted(records))
        },
        nodes={"a": node_record},
        settings=SchedulingSettings(),
        secrets=SecretRelease(KEYS),
        max_bytes=max_bytes,
    )


def size(built: DesiredState) -> int:
    return len(encode(built))


def test_the_limit_leaves_room_for_the_broker_s_packet_and_the_signature() -> None:
    """greenfed's brokers take packets up to max_packet_size 1048576 (deploy/)."""
    assert DESIRED_MAX_BYTES <= 1024 * 1024 - 1024
    assert SIGNING_ROOM_BYTES >= 90 + 64  # the signature, and an agent instance id


def test_a_document_within_its_limit_is_sent_as_built() -> None:
    records = secret_jobs(secret_env={"TOKEN": "t" * 10_000})
    built = document(records, node_a())
    assert [entry.sealed_secrets is not None for entry in built.training] == [True] * 4
    assert size(built) <= DESIRED_MAX_BYTES - SIGNING_ROOM_BYTES


def test_the_newest_jobs_secrets_are_withheld_until_the_document_fits() -> None:
    records = secret_jobs(secret_env={"TOKEN": "t" * 10_000})
    whole = document(records, node_a())
    sealed_bytes = max(len(entry.sealed_secrets or "") for entry in whole.training)
    limit = size(whole) - sealed_bytes * 3 // 2  # room for all but about two jobs' secrets
    with capture_logs() as logs:
        built = document(records, node_a(), max_bytes=limit)
    assert size(built) <= limit
    sealed = {entry.job_id: entry.sealed_secrets is not None for entry in built.training}
    assert sealed == {"job-1": True, "job-2": True, "job-3": False, "job-4": False}
    # Each job still has its worker on the node, which refuses to start it, saying why.
    for entry in built.training:
        if entry.job_id in ("job-3", "job-4"):
            with pytest.raises(SealedSecretsError, match="did not fit"):
                open_worker_secrets(entry, NODE_KEY, "a")
        else:
            assert open_worker_secrets(entry, NODE_KEY, "a").env == {"TOKEN": "t" * 10_000}
    (warning,) = [log for log in logs if log["event"].startswith("secrets withheld")]
    assert warning["node_id"] == "a"
    assert warning["job_ids"] == ["job-4", "job-3"]
    assert "t" * 100 not in repr(logs)


def test_a_job_the_node_runs_keeps_its_secrets() -> None:
    """The newest job is running already: the next newest give way."""
    records = secret_jobs(secret_env={"TOKEN": "t" * 10_000})
    whole = document(records, node_a("job-4"))
    sealed_bytes = max(len(entry.sealed_secrets or "") for entry in whole.training)
    with capture_logs():
        built = document(records, node_a("job-4"), max_bytes=size(whole) - sealed_bytes * 3 // 2)
    sealed = {entry.job_id: entry.sealed_secrets is not None for entry in built.training}
    assert sealed == {"job-1": True, "job-2": False, "job-3": False, "job-4": True}


def test_jobs_that_still_do_not_fit_are_left_out_newest_first() -> None:
    """No secrets to withhold: big commands. The jobs left out are requeued as any
    assignment their node never acknowledged (cloud/loop/unacknowledged.py)."""
    records = secret_jobs(command=["python", "-c", "x" * 20_000])
    whole = document(records, node_a("job-4"))
    limit = size(whole) - 30_000
    with capture_logs() as logs:
        built = document(records, node_a("job-4"), max_bytes=limit)
    assert size(built) <= limit
    assert sorted(entry.job_id for entry in built.training) == ["job-1", "job-4"]
    (warning,) = [log for log in logs if log["log_level"] == "warning"]
    assert warning["job_ids"] == ["job-3", "job-2"]
    assert "left out" in warning["event"]
