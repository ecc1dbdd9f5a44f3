"""What isolating a worker costs at its start: the agent's part of submission to
`running`, at each level a node gives (docs/isolation.md).

    sudo .venv/bin/python benchmarks/sandbox_bench.py --runs 30

For each level (`none`: the command as the agent's user; `user`: `setpriv` and a
cgroup; `sandbox`: bubblewrap too; `container`: podman with the test image, as the
work user in the worker's cgroup), a real node (tests/support/sandboxed_node.py)
runs `--runs` one-second workers, one at a time, each timed from the moment the agent
is handed the worker (`prepare`, as when a `desired` document arrives) to:

- `running`: the worker's status says `running` (the wrapper started its processes,
  the image present): what the agent then reports, so what the isolation adds to
  submission to `running`;
- `command`: the job's command itself ran (its first line reached the log: the
  sandbox or container made, the user switched, the cgroups joined);
- `done`: the worker's run is over and cleaned up (its cgroups, container and work
  directory removed): what it adds to the whole attempt.

Needs root, bubblewrap and (for `container`) podman with busybox-static for the
image. Prints medians and 90th percentiles in ms, and each level's median against
`none`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edge.training.runs import RunStatus
from tests.support.sandboxed_node import build_test_image, make_node

LEVELS = ("none", "user", "sandbox", "container")


def _first_output(path: Path, began: float, found: list[float]) -> None:
    """Poll the log (0.5 ms) until the command's first line is there."""
    deadline = began + 60.0
    while time.perf_counter() < deadline:
        try:
            if b"go" in path.read_bytes():
                found.append(time.perf_counter())
                return
        except FileNotFoundError:
            pass
        time.sleep(0.0005)


async def time_one(node_level: str, runs: int, image: str | None) -> dict[str, object]:
    running_ms: list[float] = []
    command_ms: list[float] = []
    done_ms: list[float] = []
    for node in make_node("sandbox" if node_level == "container" else node_level):
        for _ in range(runs):
            fields = {"image": image, "image_pull_policy": "never"} if image else {}
            spec = node.worker("echo go; sleep 1", **fields)
            log = node.launcher.log_path(spec.job_id, spec.attempt)
            began = time.perf_counter()
            first: list[float] = []
            watcher = threading.Thread(target=_first_output, args=(log, began, first))
            watcher.start()
            run = node.prepare(spec)
            seen: dict[str, float] = {}

            def changed(status: RunStatus, seen: dict[str, float] = seen) -> None:
                seen.setdefault(status.state, time.perf_counter())

            run.status.on_change = changed
            await run.run()
            ended = time.perf_counter()
            watcher.join()
            if run.status.state != "succeeded" or "running" not in seen:
                raise RuntimeError(f"{node_level}: {run.status}")
            running_ms.append((seen["running"] - began) * 1000)
            command_ms.append((first[0] - began) * 1000)
            done_ms.append((ended - began) * 1000 - 1000)  # less the worker's own second
    return {
        "level": node_level,
        "running_ms_p50": round(statistics.median(running_ms), 1),
        "running_ms_p90": round(statistics.quantiles(running_ms, n=10)[-1], 1),
        "command_ms_p50": round(statistics.median(command_ms), 1),
        "command_ms_p90": round(statistics.quantiles(command_ms, n=10)[-1], 1),
        "done_less_1s_ms_p50": round(statistics.median(done_ms), 1),
        "done_less_1s_ms_p90": round(statistics.quantiles(done_ms, n=10)[-1], 1),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--levels", default=",".join(LEVELS))
    args = parser.parse_args()
    levels = args.levels.split(",")
    image = None
    if "container" in levels:
        with tempfile.TemporaryDirectory() as work:
            image = build_test_image(Path(work))
    results = []
    for level in levels:
        results.append(await time_one(level, args.runs, image if level == "container" else None))
    baseline = next((r for r in results if r["level"] == "none"), None)
    for result in results:
        if baseline is not None:
            for key in ("running_ms_p50", "command_ms_p50", "done_less_1s_ms_p50"):
                result[f"{key}_vs_none"] = round(
                    float(result[key]) - float(baseline[key]),  # type: ignore[arg-type]
                    1,
                )
    json.dump({"runs": args.runs, "levels": results}, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    asyncio.run(main())
