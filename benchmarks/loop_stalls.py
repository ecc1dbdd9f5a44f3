"""What held a control plane's event loop (issue 28): a summary of what
benchmarks/stall_probe recorded (how to record: its sitecustomize.py).

    python benchmarks/loop_stalls.py /tmp/probe.*.jsonl --run /tmp/run.json

`--run`: benchmarks/fleet_scale.py's result, whose `window_utc_s` limits the summary
to its measured window (else everything recorded). Printed as JSON:

- `callbacks`: the loop's callbacks over the probe's threshold, by what they ran (a
  task's coroutine, with the task's number dropped), with their count, wall and thread
  CPU seconds (sum and max), worst first by CPU: the CPU is the step's own cost, the
  wall adds what it waited for (the GIL, the machine's other processes);
- `frames`: where in the repository those callbacks were when sampled (every 5 ms),
  the innermost three frames of this repository, most sampled first;
- `collections`: garbage collections over 10 ms by generation (count, seconds);
- `overruns`: how often the probe's own 5 ms sleep overran the threshold, and the CPU
  this process used meanwhile (near the wall time: one of its threads held the GIL).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

REPOSITORY_PARTS = ("cloud/", "shared/", "edge/", "greenfed/")
TASK_NUMBER = re.compile(r"^task Task-\d+ ")
CALLBACK_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def records(paths: list[Path], window: tuple[float, float] | None) -> list[dict[str, Any]]:
    found = []
    for path in paths:
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # the last line of a process killed mid-write
                continue
            if window is None or window[0] <= record["t"] <= window[1]:
                found.append(record)
    return found


def repository_frame(frame: str) -> str | None:
    for part in REPOSITORY_PARTS:
        at = frame.find("/" + part)
        if at >= 0:
            return frame[at + 1 :]
    return None


def what(record: dict[str, Any]) -> str:
    return CALLBACK_ADDRESS.sub("", TASK_NUMBER.sub("task ", record["what"]))


def summary(found: list[dict[str, Any]], top: int) -> dict[str, Any]:
    by_what: dict[str, list[dict[str, Any]]] = defaultdict(list)
    frames: Counter[str] = Counter()
    for record in found:
        if record["kind"] != "callback":
            continue
        by_what[what(record)].append(record)
        for stack, samples in record["stacks"]:
            mine = [f for f in map(repository_frame, stack.split(";")) if f is not None]
            if mine:
                frames[f"{what(record)[:48]}: {' > '.join(mine[-3:])}"] += samples
    callbacks = [
        {
            "what": name,
            "count": len(group),
            "cpu_s_sum": round(sum(r["cpu_s"] for r in group), 3),
            "cpu_s_max": round(max(r["cpu_s"] for r in group), 3),
            "wall_s_sum": round(sum(r["wall_s"] for r in group), 3),
            "wall_s_max": round(max(r["wall_s"] for r in group), 3),
        }
        for name, group in by_what.items()
    ]
    callbacks.sort(key=lambda row: -row["cpu_s_sum"])
    collections: dict[str, list[float]] = defaultdict(list)
    for record in found:
        if record["kind"] == "gc":
            collections[str(record["generation"])].append(record["wall_s"])
    overruns = [record for record in found if record["kind"] == "overrun"]
    return {
        "callbacks": callbacks[:top],
        "frames": [{"samples": n, "where": where} for where, n in frames.most_common(top)],
        "collections": {
            generation: {"count": len(walls), "wall_s_sum": round(sum(walls), 3)}
            for generation, walls in sorted(collections.items())
        },
        "overruns": {
            "count": len(overruns),
            "wall_s_sum": round(sum(r["wall_s"] for r in overruns), 3),
            "process_cpu_s_sum": round(sum(r["process_cpu_s"] for r in overruns), 3),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("probes", nargs="+", type=Path, help="the probe's .jsonl files")
    parser.add_argument("--run", type=Path, help="fleet_scale.py's result (its window)")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    window = None
    if args.run is not None:
        output = args.run.read_text()  # its progress lines, then the result
        start, end = json.loads(output[output.index("\n{") + 1 :])["window_utc_s"]
        window = (float(start), float(end))
    print(json.dumps(summary(records(args.probes, window), args.top), indent=2))


if __name__ == "__main__":
    main()
