"""API-only `greenfed cloud` replicas beside a scheduling leader, for the benchmarks
that measure that topology (submit_load.py, fleet_scale.py).

Each replica runs on the leader's store (a PostgreSQL schema: one SQLite file has one
writer process) and broker with `scheduling.enabled = false` and a port of its own: it
serves the API, and PostgreSQL NOTIFY wakes the leader on its commits. Without
`mqtt.shared_group` it ingests all telemetry, so its node registry is whole.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from benchmarks.lifecycle_bench import greenfed
from tests.support.brokers import free_port


@dataclass(frozen=True, slots=True)
class ApiReplica:
    api: str  # its base URL
    process: psutil.Process


def cloud_process(port: int) -> psutil.Process:
    """The `greenfed cloud` process listening on `port`."""
    for connection in psutil.net_connections("tcp"):
        if connection.laddr and connection.laddr.port == port and connection.status == "LISTEN":
            return psutil.Process(connection.pid)
    raise RuntimeError(f"nothing listens on {port}")


@contextlib.asynccontextmanager
async def api_replicas(
    leader_env: dict[str, str], count: int, data_dir: Path
) -> AsyncIterator[list[ApiReplica]]:
    """`count` API-only replicas of the leader started with `leader_env` (its
    `GREENFED_*` settings, the store's and the broker's included), each up and serving
    until the block ends. Start them after the leader: they read the admin token it
    wrote to `data_dir`."""
    async with contextlib.AsyncExitStack() as stack:
        replicas = []
        for _ in range(count):
            port = free_port()
            api = f"http://127.0.0.1:{port}"
            env = leader_env | {
                "GREENFED_CLOUD__API_PORT": str(port),
                "GREENFED_SCHEDULING__ENABLED": "false",
            }
            await stack.enter_async_context(greenfed(["cloud"], env, api, data_dir))
            replicas.append(ApiReplica(api, cloud_process(port)))
        yield replicas
