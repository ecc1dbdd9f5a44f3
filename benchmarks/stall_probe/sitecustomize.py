"""What holds a `greenfed cloud` process's event loop (issue 28): a probe for
measurement, never imported by greenfed itself.

Python imports `sitecustomize` at start-up from the first directory on its path that
has one, so a control plane started with this directory on PYTHONPATH and
STALL_PROBE_OUT set records, in `$STALL_PROBE_OUT.<pid>.jsonl`:

- every event-loop callback that ran longer than STALL_PROBE_THRESH_S (0.04 s): its
  wall and thread CPU seconds, what it ran (a task's name and coroutine), and the event
  loop thread's stack sampled every 5 ms while it ran (the stacks show which step of a
  task held the loop, which a task's name alone does not);
- every overrun of a watchdog thread's 5 ms sleep by more than the threshold: who held
  the GIL or the CPU, with every thread's stack and the process's CPU seconds over it
  (close to the wall time: a thread of this process ran; far below: the machine's other
  processes did);
- every garbage collection over 10 ms, with its generation.

Only a process whose first argument is `cloud` is probed (`python -m greenfed.cli cloud`;
`greenfed sim` and the benchmark itself are not). Wrapping each callback costs about a
microsecond. `benchmarks/loop_stalls.py` summarises the files, e.g. over
benchmarks/fleet_scale.py's window:

    STALL_PROBE_OUT=/tmp/probe PYTHONPATH=$PWD/benchmarks/stall_probe:$PWD \\
      python benchmarks/fleet_scale.py --nodes 10000 --processes 4 --jobs 10000 \\
      --window 60 --online-timeout 150 --backend postgresql > /tmp/run.json
    python benchmarks/loop_stalls.py /tmp/probe.*.jsonl --run /tmp/run.json
"""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any

THRESHOLD_S = float(os.environ.get("STALL_PROBE_THRESH_S", "0.04"))
SAMPLE_EVERY_S = 0.005


def _install(path: str) -> None:
    import asyncio.events
    import gc
    import json
    import threading
    import time

    out = open(path, "a", buffering=1)  # noqa: SIM115 (open while the process lives)
    lock = threading.Lock()
    loop_thread = threading.get_ident()
    # (started, stack samples) of the callback running now
    running: list[tuple[float, list[str]] | None] = [None]

    def emit(record: dict[str, Any]) -> None:
        with lock:
            if not out.closed:
                out.write(json.dumps(record) + "\n")

    def stack_of(frame: FrameType | None, depth: int = 40) -> str:
        parts: list[str] = []
        while frame is not None and len(parts) < depth:
            code = frame.f_code
            parts.append(f"{code.co_filename}:{code.co_name}:{frame.f_lineno}")
            frame = frame.f_back
        return ";".join(reversed(parts))

    def describe(handle: asyncio.events.Handle) -> str:
        callback = getattr(handle, "_callback", None)
        owner = getattr(callback, "__self__", None)
        if isinstance(owner, asyncio.Task):
            coro = owner.get_coro()
            return f"task {owner.get_name()} {getattr(coro, '__qualname__', coro)!s}"
        return repr(callback)[:200]

    run_handle = asyncio.events.Handle._run

    def timed_run(self: asyncio.events.Handle) -> None:
        started, cpu = time.perf_counter(), time.thread_time()
        samples: list[str] = []
        running[0] = (started, samples)
        try:
            run_handle(self)
        finally:
            running[0] = None
            wall = time.perf_counter() - started
            if wall > THRESHOLD_S:
                counts: dict[str, int] = {}
                for stack in samples:
                    counts[stack] = counts.get(stack, 0) + 1
                emit(
                    {
                        "kind": "callback",
                        "t": time.time(),
                        "wall_s": round(wall, 4),
                        "cpu_s": round(time.thread_time() - cpu, 4),
                        "what": describe(self),
                        "stacks": sorted(counts.items(), key=lambda item: -item[1])[:8],
                    }
                )

    asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]

    def watchdog() -> None:
        while True:
            asked, cpu = time.perf_counter(), time.process_time()
            time.sleep(SAMPLE_EVERY_S)
            now = time.perf_counter()
            overrun = now - asked - SAMPLE_EVERY_S
            callback = running[0]
            if callback is not None and now - callback[0] > 4 * SAMPLE_EVERY_S:
                frame = sys._current_frames().get(loop_thread)
                if frame is not None:
                    callback[1].append(stack_of(frame))
            if overrun > THRESHOLD_S:
                names = {thread.ident: thread.name for thread in threading.enumerate()}
                emit(
                    {
                        "kind": "overrun",
                        "t": time.time(),
                        "wall_s": round(overrun, 4),
                        "process_cpu_s": round(time.process_time() - cpu, 4),
                        "in_callback": callback is not None,
                        "threads": {
                            names.get(ident, str(ident)): stack_of(frame, 25)
                            for ident, frame in sys._current_frames().items()
                            if ident != threading.get_ident()
                        },
                    }
                )

    collection_started: list[float] = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collection_started[0] = time.perf_counter()
            return
        wall = time.perf_counter() - collection_started[0]
        if wall > 0.01:
            emit(
                {
                    "kind": "gc",
                    "t": time.time(),
                    "wall_s": round(wall, 4),
                    "generation": info.get("generation"),
                    "collected": info.get("collected"),
                }
            )

    gc.callbacks.append(on_gc)
    threading.Thread(target=watchdog, name="stall-probe", daemon=True).start()
    emit({"kind": "start", "t": time.time(), "pid": os.getpid(), "argv": sys.argv})


if os.environ.get("STALL_PROBE_OUT") and len(sys.argv) > 1 and sys.argv[1] == "cloud":
    _install(f"{os.environ['STALL_PROBE_OUT']}.{os.getpid()}.jsonl")
