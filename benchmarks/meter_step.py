"""What usage metering spends on one step of one node, alone (`cloud.usage.meter.meter`):
the node of benchmarks/ingest.py (a CPU and a GPU, one job on the GPU), two samples of
its energy counters 2.5 s apart, as the leader's flush meters a held sample.

    python benchmarks/meter_step.py --calls 200000 --repeats 5

Prints the best of `--repeats` runs, in microseconds per step, as JSON. A tree from
before `meter.profile_of` (48a09d7) is timed as it was then (no profile).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cloud.usage.meter as metering
from benchmarks.ingest import birth, telemetry
from shared.messages import TELEMETRY_DECODER


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    status = birth("bench-00001")
    now = time.time()
    first = TELEMETRY_DECODER.decode(telemetry("bench-00001", 1, now))
    second = TELEMETRY_DECODER.decode(telemetry("bench-00001", 3, now + 2.5))
    mark = metering.mark_of(first)
    job = metering.MeteredAllocation(
        "job", 0, "tenant", "bench-00001", "gpu", 1, ("gpu0",), "training", now - 100.0
    )
    options: dict[str, object] = {"host_overhead_ratio": 0.1, "implausible": []}
    if hasattr(metering, "profile_of"):  # kept per node by the accountant
        options["profile"] = metering.profile_of(status)

    def step() -> None:
        metering.meter(status, second, mark, (job,), **options)  # type: ignore[arg-type]

    runs = timeit.repeat(step, number=args.calls, repeat=args.repeats)
    json.dump({"calls": args.calls, "meter_step_us": round(min(runs) / args.calls * 1e6, 2)},
              sys.stdout)  # fmt: skip
    print()


if __name__ == "__main__":
    main()
