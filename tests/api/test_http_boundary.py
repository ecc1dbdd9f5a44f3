"""Bad bytes at the HTTP boundary are a 4xx naming what is wrong, never a 500 (issue 12):
download signatures, query values, Idempotency-Key; and work that could only wait for
ever (a past deadline, training where no agent trains) is refused on submission."""

from __future__ import annotations

import socket
import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

import cloud.api.work
from cloud.app_keys import REGISTRY
from shared.messages import Accelerator, HostInfo, NodeStatus, Site
from tests.api.support import Api, job_spec, problem


def node_status(
    node_id: str,
    site: Site,
    *,
    runs_training: bool | None,
    accelerators: tuple[Accelerator, ...] = (),
) -> NodeStatus:
    return NodeStatus(
        node_id=node_id,
        state="online",
        instance_id="i",
        agent_version="t",
        site=site,
        zone="DE",
        region="r",
        host=HostInfo(
            hostname=node_id, os="linux", arch="x86_64", cpu_logical_cores=8, memory_total_bytes=1
        ),
        accelerators=accelerators,
        telemetry_interval_s=5.0,
        started_at=1.0,
        sent_at=1.0,
        runs_training=runs_training,
    )


# ---- signed model downloads ---------------------------------------------------------


@pytest.mark.parametrize(
    "sig",
    ["%FF", "%C3%A9" * 32, "", "0" * 64, "zz", "%00", "A" * 64, "f" * 1000],
)
async def test_every_bad_signature_is_the_same_403_whether_or_not_the_model_exists(
    api: Api, sig: str
) -> None:
    token = await api.tenant("vision")
    model_id = await api.model(token)
    answers = []
    for target in (model_id, "01HZZZZZZZZZZZZZZZZZZZZZZZ", "nope", "%FF"):
        response = await api.client.get(f"/v1/models/{target}/blob?sig={sig}")  # anonymous
        body = await problem(response, 403)
        answers.append((body["type"], body["title"], body["detail"]))
    assert len(set(answers)) == 1, answers


async def test_the_signed_url_still_downloads_and_an_undecodable_id_is_a_404_to_its_tenant(
    api: Api,
) -> None:
    token = await api.tenant("vision")
    model_id = await api.model(token)
    listed = await (await api.get(token, f"/v1/models/{model_id}")).json()
    assert listed["id"] == model_id
    for bad in ("%FF", "%00", "x" * 300):
        await problem(await api.get(token, f"/v1/models/{bad}"), 404)
        await problem(await api.get(token, f"/v1/models/{bad}/blob"), 404)


# ---- query values -------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/models?cursor=%FF", "/v1/jobs?cursor=%00", "/v1/jobs?%FF=1"])
async def test_undecodable_or_control_bytes_in_a_query_are_a_400_naming_the_parameter(
    api: Api, path: str
) -> None:
    token = await api.tenant("vision")
    body = await problem(await api.get(token, path), 400)
    (param,) = body["invalid_params"]
    assert param["reason"].startswith("not UTF-8 text")
    assert param["name"] in ("cursor", "\\ufffd")


# ---- Idempotency-Key ---------------------------------------------------------------


def raw_post(port: int, key: bytes, token: str) -> bytes:
    """A submission whose Idempotency-Key carries bytes no HTTP client library would send."""
    body = b'{"name": "t", "command": ["true"]}'
    request = (
        b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\n"
        + f"Authorization: Bearer {token}\r\nContent-Length: {len(body)}\r\n".encode()
        + b"Idempotency-Key: "
        + key
        + b"\r\n\r\n"
        + body
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("key", [b"\xff\xfe", "caf\u00e9".encode(), b"a\xc2\xa0b", b"k" * 256])
async def test_an_idempotency_key_that_is_not_printable_ascii_is_a_400_naming_the_header(
    api: Api, key: bytes
) -> None:
    token = await api.tenant("vision")
    port = api.client.port
    assert port is not None
    import asyncio

    answer = await asyncio.to_thread(raw_post, port, key, token)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), answer[:500]
    assert b"application/problem+json" in head
    assert b'"name":"Idempotency-Key"' in body
    assert b"printable ASCII" in body
    # ... and the submission path still works with a good key afterwards.
    created = await api.submit(token, job_spec(), key="retry-1 ~ok")
    assert created.status == 201, await created.text()


# ---- submissions that could only wait for ever -------------------------------------


async def test_a_deadline_in_the_past_is_refused_but_a_retry_of_an_accepted_one_replays(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = await api.tenant("vision")
    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    body = await problem(await api.submit(token, job_spec(deadline=past)), 422)
    assert [p["name"] for p in body["invalid_params"]] == ["$.deadline"]
    assert "has passed" in body["invalid_params"][0]["reason"]
    refused_again = await api.submit(token, job_spec(deadline=past), key="never-accepted")
    await problem(refused_again, 422)

    # Accepted while its deadline lay ahead: a minute, still ahead when the server checks
    # it however busy the machine is.
    ahead = datetime.now(UTC) + timedelta(minutes=1)
    spec = job_spec(deadline=ahead.isoformat())
    work_id = await api.submitted(token, spec, key="k-1")
    # The deadline passes (the submission handler's clock moves on two minutes rather than
    # the test waiting); the client retries.
    later = SimpleNamespace(time=lambda: time.time() + 120.0)
    monkeypatch.setattr(cloud.api.work, "time", later)
    as_new_work = await problem(await api.submit(token, spec), 422)  # passed, for the server
    assert [p["name"] for p in as_new_work["invalid_params"]] == ["$.deadline"]
    retried = await api.submit(token, spec, key="k-1")
    assert retried.status == 200, await retried.text()
    assert (await retried.json())["id"] == work_id
    other = await api.submit(token, job_spec(name="other", deadline=ahead.isoformat()), key="k-1")
    await problem(other, 409)


async def test_a_deadline_no_registered_gpu_can_meet_is_refused(api: Api) -> None:
    token = await api.tenant("vision")
    in_an_hour = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    four_hours = job_spec(deadline=in_an_hour, estimated_duration_s=4 * 3600.0)
    # No node known yet: nothing to judge by, so it is accepted (one may register).
    assert (await api.submit(token, four_hours)).status == 201
    h100 = Accelerator(
        id="gpu0", kind="gpu", vendor="nvidia", model="H100", memory_bytes=1, compute_units=1,
        relative_speed=2.5,
    )  # fmt: skip
    api.app[REGISTRY].apply_status(
        node_status("h100-1", "cloud", runs_training=True, accelerators=(h100,))
    )
    body = await problem(await api.submit(token, four_hours), 422)
    assert [p["name"] for p in body["invalid_params"]] == ["$.deadline"]
    assert "needs 5,760 s on the fastest registered gpu" in body["invalid_params"][0]["reason"]
    two_hours = job_spec(deadline=in_an_hour, estimated_duration_s=2 * 3600.0)
    assert (await api.submit(token, two_hours)).status == 201  # 2,880 s on the H100: it fits


async def test_training_at_the_edge_needs_an_edge_agent_that_runs_training(api: Api) -> None:
    token = await api.tenant("vision")
    registry = api.app[REGISTRY]
    registry.apply_status(node_status("edge-1", "edge", runs_training=False))
    registry.apply_status(node_status("old-edge", "edge", runs_training=None))  # pre-1.3 agent
    body = await problem(await api.submit(token, job_spec(sites=["edge"])), 422)
    assert [p["name"] for p in body["invalid_params"]] == ["$.sites"]
    assert "runs training" in body["invalid_params"][0]["reason"]
    # cloud may always be named: its agents train unless told otherwise
    assert (await api.submit(token, job_spec(sites=["edge", "cloud"]))).status == 201

    orin = Accelerator(
        id="gpu0", kind="gpu", vendor="nvidia", model="Orin", memory_bytes=1, compute_units=1
    )
    registry.apply_status(node_status("edge-2", "edge", runs_training=True, accelerators=(orin,)))
    assert (await api.submit(token, job_spec(name="at-edge", sites=["edge"]))).status == 201


# ---- bodies and path ids no store can hold ----------------------------------------------


async def test_a_body_nested_too_deep_is_a_400_not_a_crash(api: Api) -> None:
    token = await api.tenant("vision")
    for body in (b"[" * 3000 + b"]" * 3000, b'{"name": ' + b"[" * 950 + b"]" * 950 + b"}"):
        response = await api.client.post(
            "/v1/jobs",
            data=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        assert (await problem(response, 400))["type"].endswith("/malformed-json")


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (job_spec(env={"X": "a\u0000b"}), "$.env.X"),
        (job_spec(command=["python", "\u0000"]), "$.command[1]"),
        (job_spec(labels={"\u0000": "x"}), "$.labels"),
    ],
)
async def test_a_nul_character_in_a_body_is_refused_naming_the_field(
    api: Api, spec: dict[str, object], field: str
) -> None:
    token = await api.tenant("vision")
    body = await problem(await api.submit(token, spec), 422)
    assert body["invalid_params"][0]["name"] == field
    # Nothing was stored that would break the tenant's (or the admin's) lookups by name.
    assert (await api.get(token, "/v1/jobs/train-resnet")).status == 404
    assert (await api.get(api.admin_token, "/v1/jobs/train-resnet")).status == 404


async def test_a_path_id_with_a_nul_or_control_character_is_a_404(api: Api) -> None:
    token = await api.tenant("vision")
    await api.submitted(token, job_spec())
    for path in ("/v1/jobs/%00", "/v1/jobs/a%01b/explain", "/v1/deployments/%00"):
        body = await problem(await api.get(token, path), 404)
        assert body["invalid_params"][0]["reason"]
    assert (await api.get(token, "/v1/jobs/train-resnet")).status == 200
