"""One edge agent's idle footprint: resident memory and CPU at a 1 s telemetry interval.

Runs `greenfed edge run` as its own process against a broker, lets it settle,
then samples RSS and CPU time over a window. That process becomes the upgrade
supervisor (edge/upgrade/supervisor.py), which runs the agent as its child: both are
measured, each on its own (`agent`, `supervisor`), and the node's total beside them.

    python benchmarks/agent_footprint.py --greenfed .venv/bin/greenfed --window 60

Pass the `greenfed` of a venv that installed only the `edge` extra to measure an
agent as deployed on a device (`pip install '.[edge]'`). `--enrolled` gives the agent a
control-plane key and a signed retained `desired` document without work, which it
verifies: an enrolled node with nothing to run. Without it the node is not enrolled.
`--training` makes it a training node (`site = "cloud"`): it probes how it isolates
work (as root: users, cgroups, a trial sandbox, the container runtime), keeps its
sealing key and announces both (docs/isolation.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # shared/, for --enrolled
NODE_ID = "footprint"


def publish_retained(mqtt_url: str, topic: str, payload: bytes) -> None:
    """Publish `payload` retained on `topic` (empty: clear what is retained there)."""
    import asyncio

    import aiomqtt

    from shared.settings import parse_mqtt_url

    endpoint = parse_mqtt_url(mqtt_url)

    async def publish() -> None:
        async with aiomqtt.Client(endpoint.host, endpoint.port) as client:
            await client.publish(topic, payload, qos=1, retain=True)

    asyncio.run(publish())


def signed_empty_desired() -> tuple[bytes, str]:
    """A signed `desired` document without work for the benchmark's node, and the public
    key (base64) the agent is configured with to verify it."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from shared.desired_signature import public_key_base64, sign_desired
    from shared.messages import DesiredState

    key = Ed25519PrivateKey.generate()
    document = DesiredState(
        node_id=NODE_ID, generation=1, issued_at=time.time(), cluster_id="footprint"
    )
    return sign_desired(document, key), public_key_base64(key)


def measure(
    greenfed: str,
    mqtt_url: str,
    interval_s: float,
    settle_s: float,
    window_s: float,
    *,
    enrolled: bool = False,
    training: bool = False,
) -> dict[str, Any]:
    topic_root = f"gfbench-{uuid.uuid4().hex[:8]}"
    key = ""
    if enrolled:
        from shared.topics import Channel, Topics

        desired_topic = Topics(topic_root).node(NODE_ID, Channel.DESIRED)
        document, key = signed_empty_desired()
        publish_retained(mqtt_url, desired_topic, document)
    try:
        return _measure(
            greenfed, mqtt_url, topic_root, key, interval_s, settle_s, window_s, training
        )
    finally:
        if enrolled:
            publish_retained(mqtt_url, desired_topic, b"")


def _measure(
    greenfed: str,
    mqtt_url: str,
    topic_root: str,
    key: str,
    interval_s: float,
    settle_s: float,
    window_s: float,
    training: bool,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as workdir:
        config = Path(workdir) / "agent.toml"
        config.write_text(
            f'[mqtt]\nurl = "{mqtt_url}"\ntopic_root = "{topic_root}"\n'
            f'[agent]\nnode_id = "{NODE_ID}"\ntelemetry_interval_s = {interval_s}\n'
            f'control_plane_public_key = "{key}"\n'
            # Its own state directory (spool, desired and reported state), like a device's.
            f'data_dir = "{workdir}/data"\n'
            + (f'site = "cloud"\ncgroup_root = "greenfed-bench-{topic_root}"\n' if training else "")
            + '[log]\nlevel = "warning"\n'
        )
        process = subprocess.Popen(
            [greenfed, "edge", "run", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            time.sleep(settle_s)
            if process.poll() is not None:
                raise RuntimeError(
                    f"agent exited: {process.stderr.read().decode() if process.stderr else ''}"
                )
            # An enrolled agent keeps the document it verified and applied.
            if key and not (Path(workdir) / "data" / "state" / "desired.json").exists():
                raise RuntimeError("the agent did not apply the signed desired document")
            supervisor = psutil.Process(process.pid)
            agent = _agent_child(supervisor)
            processes = {"agent": agent, "supervisor": supervisor}
            cpu_before = {name: _cpu_s(p) for name, p in processes.items()}
            started = time.monotonic()
            rss_samples: dict[str, list[int]] = {name: [] for name in processes}
            while time.monotonic() - started < window_s:
                for name, each in processes.items():
                    rss_samples[name].append(each.memory_info().rss)
                time.sleep(1.0)
            elapsed = time.monotonic() - started
            figures = {
                name: {
                    "rss_mb_median": round(statistics.median(rss_samples[name]) / 1e6, 1),
                    "rss_mb_max": round(max(rss_samples[name]) / 1e6, 1),
                    "uss_mb": round(each.memory_full_info().uss / 1e6, 1),
                    "cpu_pct_of_one_core": round(
                        100 * (_cpu_s(each) - cpu_before[name]) / elapsed, 3
                    ),
                    "threads": each.num_threads(),
                }
                for name, each in processes.items()
            }
            return {
                **figures,
                "total_rss_mb": round(
                    figures["agent"]["rss_mb_median"] + figures["supervisor"]["rss_mb_median"], 1
                ),
            }
        finally:
            process.terminate()
            process.wait(10)
            if training:
                _remove_cgroup_root(f"greenfed-bench-{topic_root}")


def _agent_child(supervisor: psutil.Process) -> psutil.Process:
    """The agent the supervisor runs (`--no-supervisor` would run none)."""
    children = supervisor.children()
    if len(children) != 1:
        raise RuntimeError(f"expected the supervisor to run one agent, found {children}")
    return children[0]


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _remove_cgroup_root(name: str) -> None:
    """The workers' root groups a training agent made (empty: it ran no work)."""
    from edge.sandbox.cgroup_files import remove_groups
    from edge.sandbox.cgroups import discover_layout

    layout = discover_layout()
    if layout is not None:
        remove_groups([str(mount / name) for mount in layout.every_mount()])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--greenfed", default=shutil.which("greenfed") or "greenfed")
    parser.add_argument("--mqtt-url", default="mqtt://127.0.0.1:1883")
    parser.add_argument("--interval", type=float, default=1.0, help="telemetry interval, s")
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--enrolled",
        action="store_true",
        help="a control-plane key and a signed desired document without work",
    )
    parser.add_argument(
        "--training", action="store_true", help="a training node (isolation, sealing key)"
    )
    args = parser.parse_args()
    runs = [
        measure(
            args.greenfed,
            args.mqtt_url,
            args.interval,
            args.settle,
            args.window,
            enrolled=args.enrolled,
            training=args.training,
        )
        for _ in range(args.runs)
    ]
    summary = {
        "greenfed": args.greenfed,
        "telemetry_interval_s": args.interval,
        "enrolled": args.enrolled,
        "training": args.training,
        "runs": runs,
        **{
            f"median_{name}_{figure}": statistics.median(r[name][key] for r in runs)
            for name in ("agent", "supervisor")
            for figure, key in (
                ("rss_mb", "rss_mb_median"),
                ("uss_mb", "uss_mb"),
                ("cpu_pct_of_one_core", "cpu_pct_of_one_core"),
            )
        },
        "median_total_rss_mb": statistics.median(r["total_rss_mb"] for r in runs),
    }
    json.dump(summary, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
