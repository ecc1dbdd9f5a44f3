"""The tenant's CLI as people run it: separate processes against a running `greenfed cloud`."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from greenfed.broker import EmbeddedBroker
from tests.support.brokers import free_port
from tests.support.onnx_models import mlp
from tests.support.processes import GreenfedProcess, greenfed_env, run_greenfed
from tests.support.waiting import eventually_async

pytestmark = pytest.mark.e2e


@dataclass
class Cloud:
    api: str
    env: dict[str, str]  # the data directory of the cloud: the admin token is found there
    data_dir: Path
    process: GreenfedProcess

    async def run(self, *args: str, token: str | None = None) -> tuple[int, str, str]:
        extra = ["--token", token] if token else []
        return await run_greenfed([*args, "--api", self.api, *extra], env=self.env)


async def _healthy(api: str, data_dir: Path) -> bool:
    if not (data_dir / "admin-token").exists():
        return False
    try:
        async with aiohttp.ClientSession() as http, http.get(f"{api}/healthz") as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


@pytest.fixture
async def cloud(tmp_path: Path) -> AsyncIterator[Cloud]:
    port = free_port()
    data_dir = tmp_path / "data"
    async with EmbeddedBroker(port=0) as broker:
        env = greenfed_env(
            GREENFED_STORE__DATA_DIR=str(data_dir),
            GREENFED_CLOUD__API_PORT=str(port),
            GREENFED_MQTT__URL=broker.url,
            GREENFED_MQTT__TOPIC_ROOT="clitest",
        )
        api = f"http://127.0.0.1:{port}"
        async with GreenfedProcess(["cloud"], tmp_path, env) as process:
            await eventually_async(
                lambda: _healthy(api, data_dir),
                timeout_s=30,
                message=lambda: process.stderr[-2000:],
            )
            yield Cloud(api, env, data_dir, process)
            code, _ = await process.stop(signal.SIGTERM)
            assert code == 0, process.stderr
            assert "Traceback" not in process.stderr


async def test_a_tenant_submits_follows_and_cancels_work(cloud: Cloud, tmp_path: Path) -> None:
    # The admin token is found in the data directory; the new tenant's is printed once.
    code, out, err = await cloud.run(
        "tenants", "create", "acme", "--quota", "gpu=8", "--cohort", "lab", "--priorities", "p1,p2"
    )
    assert code == 0, err
    match = re.search(r"token \(shown only now, keep it secret\): (\S+)", out)
    assert match is not None, out
    token = match.group(1)
    job_file = tmp_path / "job.toml"
    job_file.write_text(
        'kind = "training"\nname = "resnet"\ncommand = ["python", "train.py"]\n'
        'workers = 2\npriority = "p1"\n'
    )
    code, out, err = await cloud.run(
        "submit", str(job_file), "--idempotency-key", "run-1", token=token
    )
    assert code == 0, err
    submitted = re.match(r"job (\S+) submitted: resnet, pending", out)
    assert submitted is not None, out
    job_id = submitted.group(1)

    model_file = tmp_path / "detector.onnx"
    model_file.write_bytes(mlp())
    code, out, err = await cloud.run("models", "upload", str(model_file), token=token)
    assert code == 0, err
    uploaded = re.match(r"model (\S+) uploaded: detector, opset 17", out)
    assert uploaded is not None, out
    model_id = uploaded.group(1)
    code, out, err = await cloud.run("models", token=token)
    assert code == 0, err
    assert model_id in out
    assert "x float32" in out
    code, out, err = await cloud.run("models", "--json", token=token)
    assert code == 0, err
    (listed,) = json.loads(out)["items"]
    assert listed["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["batch", 4]}]
    bad_file = tmp_path / "bad.onnx"
    bad_file.write_bytes(b"garbage")
    code, _, err = await cloud.run("models", "upload", str(bad_file), token=token)
    assert code == 1
    assert "Not a valid ONNX model (422): not an ONNX model" in err
    assert err.count("\n") == 1
    serve = tmp_path / "serve.yaml"
    serve.write_text(f"kind: deployment\nname: detector\nmodel_id: {model_id}\nreplicas: 2\n")
    serve_p1 = tmp_path / "serve-p1.json"
    serve_p1.write_text(f'{{"name": "detector", "model_id": "{model_id}", "priority": "p1"}}')
    (retried, forbidden, created, jobs, jobs_json, shown, logs, tenants) = await asyncio.gather(
        cloud.run("submit", str(job_file), "--idempotency-key", "run-1", token=token),
        # The deployment default p0 is not allowed for acme: refused, naming the field.
        cloud.run("submit", str(serve), token=token),
        cloud.run("submit", str(serve_p1), "--kind", "deployment", "--json", token=token),
        cloud.run("jobs", token=token),
        cloud.run("jobs", "--json", "--state", "pending", token=token),
        cloud.run("job", job_id, token=token),
        cloud.run("logs", job_id, "--tail", "5", token=token),
        cloud.run("tenants"),
    )
    assert retried[0] == 0, retried[2]
    assert f"job {job_id} already submitted" in retried[1]
    assert forbidden[0] == 3
    assert "$.priority" in forbidden[2]
    assert forbidden[2].count("\n") == 1
    assert created[0] == 0, created[2]
    deployment = json.loads(created[1])
    assert (deployment["kind"], deployment["replicas"]) == ("deployment", 1)
    assert jobs[0] == 0, jobs[2]
    assert job_id in jobs[1]
    assert "pending" in jobs[1]
    assert [item["id"] for item in json.loads(jobs_json[1])["items"]] == [job_id]
    assert shown[0] == 0, shown[2]
    assert "state: pending" in shown[1]
    # This cloud has no fleet: the scheduler either has not looked yet or says so.
    assert (
        "why: The scheduler has not looked at it yet" in shown[1]
        or "why: No node can run it: 0/0 nodes fit." in shown[1]
    ), shown[1]
    assert logs == (0, "", "")
    assert tenants[0] == 0, tenants[2]
    assert "acme" in tenants[1]
    assert "gpu=8" in tenants[1]

    listed, detail, *cancelled = await asyncio.gather(
        cloud.run("deployments", token=token),
        cloud.run("deployment", deployment["id"], "--json", token=token),
        cloud.run("cancel", job_id, token=token),
        cloud.run("cancel", deployment["id"], token=token),
    )
    assert listed[0] == 0, listed[2]
    assert deployment["id"] in listed[1]
    assert detail[0] == 0, detail[2]
    explanation = json.loads(detail[1])["explain"]["explanation"]
    assert explanation is None or explanation["outcome"] == "pending", explanation
    for (code, out, err), (work_id, noun) in zip(
        cancelled, ((job_id, "job"), (deployment["id"], "deployment")), strict=True
    ):
        assert (code, out) == (0, f"{noun} {work_id} cancelled\n"), err
    code, _, err = await cloud.run("cancel", job_id, token=token)
    assert code == 1
    assert "already finished" in err
    assert "Traceback" not in err


async def test_mistakes_are_one_line_and_a_non_zero_exit(cloud: Cloud, tmp_path: Path) -> None:
    bad_types = tmp_path / "bad.json"
    bad_types.write_text('{"kind": "training", "name": "x", "command": ["a"], "workers": "two"}')
    typo = tmp_path / "typo.yaml"
    typo.write_text("kind: training\nname: x\ncommand: [a]\nwokers: 2\n")
    unreachable = f"http://127.0.0.1:{free_port()}"
    results = await asyncio.gather(
        run_greenfed(["submit", str(bad_types), "--api", cloud.api], env=cloud.env),
        run_greenfed(["submit", str(typo), "--api", cloud.api], env=cloud.env),
        run_greenfed(["jobs", "--api", cloud.api, "--token", "gf_0123456789abcdef_nope"]),
        run_greenfed(["jobs", "--api", unreachable], env=cloud.env),
        run_greenfed(["logs", "01ARZ3NDEKTSV4RRFFQ69G5FAV", "--api", cloud.api], env=cloud.env),
        run_greenfed(["nodes", "--api", cloud.api], env=cloud.env),
        run_greenfed(
            ["jobs", "--api", cloud.api],
            env=greenfed_env(GREENFED_STORE__DATA_DIR=str(tmp_path / "elsewhere")),
        ),
    )
    (types, unknown, bad_token, no_api, missing, nodes, no_token) = results
    assert types[0] == 2
    assert "$.workers" in types[2]
    assert unknown[0] == 2
    assert "$.wokers: unknown field" in unknown[2]
    assert bad_token[0] == 3
    assert "refused the token from --token" in bad_token[2]
    assert no_api[0] == 1
    assert f"cannot reach the greenfed API at {unreachable}" in no_api[2]
    assert missing[0] == 1
    assert "not found" in missing[2].lower()
    assert nodes[0] == 0, nodes[2]  # the admin token from the data directory
    assert no_token[0] == 3  # no token anywhere (another data directory)
    for code, _, err in results:
        assert "Traceback" not in err
        if code:
            assert err.startswith("greenfed: ")
            assert err.count("\n") == 1, err
