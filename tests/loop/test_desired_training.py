"""A training job's entry in its nodes' `desired` documents (issue 24): one rank per gang
member (a 2-worker gang on one node is 2 processes, not 1 with WORLD_SIZE=1), the
spec's limits, image and least isolation, and its secrets by name and sealed to that
node alone, for that job and attempt: never in plaintext."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from structlog.testing import capture_logs

from cloud.fleet.registry import NodeRecord
from cloud.loop.desired import desired_document
from cloud.secrets.at_rest import KEY_BYTES, SecretsAtRest
from cloud.secrets.release import SecretRelease
from cloud.store import AllocationRecord, WorkRecord
from cloud.work.convert import spec_of
from cloud.work.specs import TrainingJobSpec, encode_spec
from shared.messages import DesiredTraining, encode
from shared.sealing import SealedSecrets, SealedSecretsError, open_sealed, public_key_text
from shared.settings import SchedulingSettings
from shared.worker_secrets import open_worker_secrets
from tests.loop.builders import allocation, node, work

SETTINGS = SchedulingSettings()
SECRET = "s3cr3t-value-for-the-job"
PASSWORD = "registry-pass-0451"


def members(*placed: tuple[str, tuple[str, ...]]) -> tuple[AllocationRecord, ...]:
    """The job's members in member order: (node, devices) each."""
    return tuple(
        allocation("job-1", index, node_id, devices)
        for index, (node_id, devices) in enumerate(placed)
    )


def entries(
    record: WorkRecord,
    gang: tuple[AllocationRecord, ...],
    nodes: dict[str, NodeRecord],
    *,
    settings: SchedulingSettings = SETTINGS,
    secrets: SecretRelease | None = None,
) -> dict[str, DesiredTraining]:
    documents = {}
    for node_id in nodes:
        document = desired_document(
            node_id,
            1,
            now=1.0,
            records={record.work_id: record},
            allocations={record.work_id: gang},
            nodes=nodes,
            settings=settings,
            secrets=secrets,
        )
        (entry,) = document.training
        documents[node_id] = entry
    return documents


def test_a_two_worker_gang_on_one_node_runs_two_ranks() -> None:
    gang = members(("a", ("gpu0",)), ("a", ("gpu1",)))
    (entry,) = entries(work("job-1"), gang, {"a": node("a")}).values()
    assert (entry.rank, entry.processes, entry.world_size) == (0, 2, 2)
    assert (entry.node_rank, entry.nodes) == (0, 1)
    assert entry.accelerator_ids == ("gpu0", "gpu1")  # the agent gives each process one


def test_two_workers_on_each_of_two_nodes_are_ranks_0_1_and_2_3() -> None:
    gang = members(("a", ("gpu0",)), ("a", ("gpu1",)), ("b", ("gpu2",)), ("b", ("gpu3",)))
    found = entries(work("job-1"), gang, {"a": node("a"), "b": node("b")})
    assert (found["a"].rank, found["b"].rank) == (0, 2)
    assert found["a"].processes == found["b"].processes == 2
    assert found["a"].world_size == found["b"].world_size == 4
    assert (found["a"].node_rank, found["b"].node_rank) == (0, 1)
    assert found["a"].nodes == found["b"].nodes == 2
    assert found["b"].accelerator_ids == ("gpu2", "gpu3")
    assert found["a"].master_addr == found["b"].master_addr == "a.internal"


def test_cpu_gang_members_on_one_node_are_processes_with_their_cores() -> None:
    cpu_gang = tuple(
        dataclasses.replace(member, accelerator_kind="cpu", accelerators=2)
        for member in members(("a", ("cpu0", "cpu1")), ("a", ("cpu2", "cpu3")))
    )
    (entry,) = entries(work("job-1", accelerator_kind="cpu"), cpu_gang, {"a": node("a")}).values()
    assert (entry.processes, entry.world_size, entry.cpu_cores) == (2, 2, 4)


def test_the_spec_limits_image_and_isolation_reach_the_node() -> None:
    record = work(
        "job-1",
        host_memory_gib=2,
        pids_limit=256,
        launch="per-node",
        image="ghcr.io/acme/trainer:2",
        image_pull_policy="never",
        isolation="user",
    )
    (entry,) = entries(record, members(("a", ("gpu0",))), {"a": node("a")}).values()
    assert entry.tenant == record.tenant_id
    assert (entry.host_memory_bytes, entry.pids_limit, entry.launch) == (2 * 2**30, 256, "per-node")
    assert (entry.image, entry.image_pull_policy) == ("ghcr.io/acme/trainer:2", "never")
    assert entry.min_isolation == "user"
    stricter = SchedulingSettings(min_isolation="sandbox")
    (strict,) = entries(
        record, members(("a", ("gpu0",))), {"a": node("a")}, settings=stricter
    ).values()
    assert strict.min_isolation == "sandbox"
    (short,) = entries(
        work("job-1", image="acme/trainer:2"), members(("a", ("gpu0",))), {"a": node("a")}
    ).values()
    assert short.image == "docker.io/acme/trainer:2"  # never a name a local image can take

    (plain,) = entries(work("job-1"), members(("a", ("gpu0",))), {"a": node("a")}).values()
    assert (plain.host_memory_bytes, plain.pids_limit, plain.image) == (None, None, None)
    assert (plain.min_isolation, plain.launch) == ("none", "per-worker")
    assert (plain.secret_names, plain.sealed_secrets) == ((), None)


# ---- secrets ------------------------------------------------------------------------------


def stored_with_secrets(keys: SecretsAtRest, **spec: Any) -> WorkRecord:
    """A record as the API stores it: the secrets encrypted for its tenant."""
    record = work(
        "job-1",
        attempts=3,
        secret_env={"HF_TOKEN": SECRET, "AWS_KEY": SECRET + "-2"},
        image="ghcr.io/acme/trainer:2",
        registry_auth={"username": "ci", "password": PASSWORD},
        **spec,
    )
    plain = spec_of(record)
    assert isinstance(plain, TrainingJobSpec)
    encrypted = keys.encrypt_spec(plain, tenant_id=record.tenant_id)
    return dataclasses.replace(record, spec=encode_spec(encrypted))


def keyed(node_id: str, key: X25519PrivateKey | None) -> NodeRecord:
    record = node(node_id)
    status = msgspec.structs.replace(
        record.status, sealing_public_key=None if key is None else public_key_text(key)
    )
    return dataclasses.replace(record, status=status)


def test_secrets_are_named_and_sealed_to_each_node_for_this_job_and_attempt() -> None:
    keys = SecretsAtRest(os.urandom(KEY_BYTES))
    record = stored_with_secrets(keys)
    node_keys = {"a": X25519PrivateKey.generate(), "b": X25519PrivateKey.generate()}
    gang = members(("a", ("gpu0",)), ("b", ("gpu0",)))
    nodes = {node_id: keyed(node_id, key) for node_id, key in node_keys.items()}
    found = entries(record, gang, nodes, secrets=SecretRelease(keys))

    for node_id, entry in found.items():
        assert entry.secret_names == ("AWS_KEY", "HF_TOKEN")
        assert entry.sealed_secrets is not None
        opened = open_sealed(
            entry.sealed_secrets, node_keys[node_id], node_id=node_id, job_id="job-1", attempt=3
        )
        assert opened.env == {"HF_TOKEN": SECRET, "AWS_KEY": SECRET + "-2"}
        assert opened.registry is not None
        assert (opened.registry.registry, opened.registry.password) == ("ghcr.io", PASSWORD)
        assert entry.env == {}  # nothing secret among the plain variables
    # Node a's copy is a's alone: b's key does not open it, nor does it open elsewhere.
    a_sealed = found["a"].sealed_secrets
    assert a_sealed is not None
    with pytest.raises(SealedSecretsError):
        open_sealed(a_sealed, node_keys["b"], node_id="b", job_id="job-1", attempt=3)
    with pytest.raises(SealedSecretsError):
        open_sealed(a_sealed, node_keys["a"], node_id="a", job_id="job-1", attempt=4)
    with pytest.raises(SealedSecretsError):
        open_sealed(a_sealed, node_keys["a"], node_id="a", job_id="job-2", attempt=3)


def test_no_plaintext_secret_is_anywhere_in_the_encoded_document() -> None:
    keys = SecretsAtRest(os.urandom(KEY_BYTES))
    record = stored_with_secrets(keys)
    nodes = {"a": keyed("a", X25519PrivateKey.generate())}
    document = desired_document(
        "a",
        1,
        now=1.0,
        records={"job-1": record},
        allocations={"job-1": members(("a", ("gpu0",)))},
        nodes=nodes,
        settings=SETTINGS,
        secrets=SecretRelease(keys),
    )
    encoded = encode(document)
    for plaintext in (SECRET, PASSWORD):
        assert plaintext.encode() not in encoded
    assert b"gfenc1:" not in encoded  # nor the at-rest form


def test_a_node_without_a_usable_key_gets_names_but_no_secrets_and_a_warning() -> None:
    keys = SecretsAtRest(os.urandom(KEY_BYTES))
    record = stored_with_secrets(keys)
    with capture_logs() as logs:
        (entry,) = entries(
            record,
            members(("a", ("gpu0",))),
            {"a": keyed("a", None)},
            secrets=SecretRelease(keys, log_interval_s=0.0),
        ).values()
    assert entry.secret_names == ("AWS_KEY", "HF_TOKEN")
    assert entry.sealed_secrets is None  # the agent refuses to start it, saying why
    (warning,) = logs
    assert warning["event"] == "secrets withheld: the node has no usable sealing key"
    assert (warning["node_id"], warning["job_id"]) == ("a", "job-1")
    assert SECRET not in repr(logs)

    # A loop without the secrets key releases nothing either.
    (unsealed,) = entries(
        record, members(("a", ("gpu0",))), {"a": keyed("a", X25519PrivateKey.generate())}
    ).values()
    assert unsealed.sealed_secrets is None


def registry_only(keys: SecretsAtRest) -> WorkRecord:
    """A job whose one secret is its registry password (no secret_env), as stored."""
    record = work(
        "job-1",
        attempts=3,
        image="ghcr.io/acme/private-trainer:2",
        registry_auth={"username": "ci", "password": PASSWORD},
    )
    plain = spec_of(record)
    assert isinstance(plain, TrainingJobSpec)
    encrypted = keys.encrypt_spec(plain, tenant_id=record.tenant_id)
    return dataclasses.replace(record, spec=encode_spec(encrypted))


@pytest.mark.parametrize("cause", ["secrets key replaced", "node key unknown"])
def test_a_job_whose_only_secret_is_its_registry_password_does_not_start_without_it(
    cause: str,
) -> None:
    """docs/store.md: with its secrets withheld a job's worker refuses to start, saying
    why; a registry password is one of them, though no variable is named."""
    keys = SecretsAtRest(os.urandom(KEY_BYTES))
    record = registry_only(keys)
    node_key = X25519PrivateKey.generate()
    if cause == "secrets key replaced":  # a store restored without its key
        nodes = {"a": keyed("a", node_key)}
        release = SecretRelease(SecretsAtRest(os.urandom(KEY_BYTES)), log_interval_s=0.0)
    else:
        nodes = {"a": keyed("a", None)}
        release = SecretRelease(keys, log_interval_s=0.0)
    with capture_logs():
        (entry,) = entries(record, members(("a", ("gpu0",))), nodes, secrets=release).values()
    assert (entry.secret_names, entry.sealed_secrets) == ((), None)
    assert entry.has_secrets
    with pytest.raises(SealedSecretsError) as refused:
        open_worker_secrets(entry, node_key, "a")
    reason = str(refused.value)
    assert "sealing key" in reason  # the node's, unknown to the control plane
    assert "secrets key" in reason  # the control plane's, replaced
    assert PASSWORD not in reason


def test_the_registry_password_reaches_the_node_that_can_open_it() -> None:
    keys = SecretsAtRest(os.urandom(KEY_BYTES))
    node_key = X25519PrivateKey.generate()
    (entry,) = entries(
        registry_only(keys),
        members(("a", ("gpu0",))),
        {"a": keyed("a", node_key)},
        secrets=SecretRelease(keys),
    ).values()
    assert entry.has_secrets
    opened = open_worker_secrets(entry, node_key, "a")
    assert opened.registry is not None
    assert opened.registry.password == PASSWORD


def test_a_job_without_secrets_starts_with_none() -> None:
    (entry,) = entries(work("job-1"), members(("a", ("gpu0",))), {"a": node("a")}).values()
    assert not entry.has_secrets
    assert open_worker_secrets(entry, None, "a") == SealedSecrets()
    # A document of an older control plane says nothing of secrets: as before, a worker
    # that names none starts with none.
    older = msgspec.json.decode(
        msgspec.json.encode({"job_id": "job-1", "command": ["x"]}), type=DesiredTraining
    )
    assert open_worker_secrets(older, None, "a") == SealedSecrets()
