"""`greenfed up`'s simulated fleet has a MIG-partitioned A100: a job asking for a
`1g.10gb` slice is placed on it live, by the real agents, and every node carries its
well-known labels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.brokers import BrokerUnderTest, free_port
from tests.support.processes import GreenfedProcess, get_json, greenfed_env
from tests.support.waiting import eventually_async

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

MIG_NODE = "a100-mig-toronto-1"


def _admin_token(data_dir: Path) -> str | None:
    path = data_dir / "admin-token"
    return path.read_text().strip() if path.exists() else None


async def test_up_places_a_mig_slice_job_on_the_mig_node(
    broker: BrokerUnderTest, topic_root: str, tmp_path: Path
) -> None:
    api_port = free_port()
    api = f"http://127.0.0.1:{api_port}"
    data_dir = tmp_path / "data"
    env = greenfed_env(GREENFED_MQTT__TOPIC_ROOT=topic_root, GREENFED_STORE__DATA_DIR=str(data_dir))
    args = ["up", "--sim", "40", "--mqtt-url", broker.url, "--api-port", str(api_port)]
    async with GreenfedProcess(args, tmp_path, env) as up:

        async def mig_node_online() -> bool:
            token = _admin_token(data_dir)
            if token is None:
                return False
            try:
                node = await get_json(f"{api}/v1/nodes/{MIG_NODE}", token)
            except (OSError, aiohttp.ClientResponseError):
                return False
            assert isinstance(node, dict)
            return bool(node["state"] == "online")

        # 40 simulated agents start beside the control plane: on a loaded 2-core machine
        # (CI's xdist workers, the real Mosquitto) that took over 30 s once.
        await eventually_async(mig_node_online, timeout_s=75, message=lambda: up.stderr[-2000:])
        admin = _admin_token(data_dir)
        assert admin is not None
        node = await get_json(f"{api}/v1/nodes/{MIG_NODE}", admin)
        assert isinstance(node, dict)
        assert node["labels"]["zone"] == "CA-ON"
        assert node["labels"]["hostname"] == MIG_NODE
        slices = [a for a in node["accelerators"] if a.get("parent_id") == "gpu0"]
        assert len(slices) == 7

        spec = {
            "name": "tiny",
            "command": ["python", "train.py"],
            "mig_profile": "1g.10gb",
            "estimated_duration_s": 600,
        }
        headers = {"Authorization": f"Bearer {admin}"}
        async with (
            aiohttp.ClientSession(headers=headers) as http,
            http.post(f"{api}/v1/jobs", json=spec) as response,
        ):
            assert response.status == 201, await response.text()
            job_id = (await response.json())["id"]
        seen: dict[str, Any] = {}

        async def running() -> bool:
            body = await get_json(f"{api}/v1/jobs/{job_id}", admin)
            assert isinstance(body, dict)
            seen.update(body)
            return bool(body["state"] == "running")

        await eventually_async(
            running, timeout_s=60, message=lambda: f"{seen.get('state')}: {seen.get('reason')}"
        )
        assert seen["nodes"] == [MIG_NODE]
        (member,) = seen["allocations"]
        (slice_id,) = member["accelerator_ids"]
        assert slice_id.startswith("gpu0-mig")
