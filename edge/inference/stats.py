"""Serving figures per deployment and per replica: counters for the agent's `/metrics`,
and a window of recent latencies and batch sizes for each telemetry sample.

Each replica on a node keeps its own figures, which also count in its deployment's
there: telemetry carries the deployment's (every request once, whichever replica
answered) with each replica's beside them, so that a canary rollout tells a canary
replica from a replica of the current model on the same node."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from shared.messages import DeploymentSample, ReplicaSample

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
_WINDOW = 8192  # latencies kept between two samples, at most


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True, slots=True)
class _Window:
    """What one telemetry sample says, of a deployment or of one of its replicas."""

    requests: int
    errors: int
    rejected: int
    requests_per_s: float
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None
    mean_batch_size: float | None


class ServingStats:
    def __init__(
        self,
        deployment_id: str,
        clock: Callable[[], float] = time.monotonic,
        *,
        counts_in: ServingStats | None = None,
    ) -> None:
        """`counts_in`: the deployment's figures on this node, for a replica's: whatever
        the replica records is recorded there too (and stays there once the replica is
        withdrawn: a counter never goes back)."""
        self.deployment_id = deployment_id
        self._clock = clock
        self._counts_in = counts_in
        # Totals since the deployment started here (the agent's /metrics).
        self.requests_total = 0
        self.errors_total = 0
        self.rejected_total = 0
        self.batches_by_size: Counter[int] = Counter()
        self.latency_sum_s = 0.0
        # Since the previous telemetry sample.
        self._latencies_ms: deque[float] = deque(maxlen=_WINDOW)
        self._batch_sizes: list[int] = []
        self._window = (0, 0, 0)  # requests, errors, rejected at the window's start
        self._window_started = clock()

    def observe(self, latency_s: float) -> None:
        self.requests_total += 1
        self.latency_sum_s += latency_s
        self._latencies_ms.append(latency_s * 1000.0)
        if self._counts_in is not None:
            self._counts_in.observe(latency_s)

    def error(self) -> None:
        self.requests_total += 1
        self.errors_total += 1
        if self._counts_in is not None:
            self._counts_in.error()

    def rejected(self) -> None:
        self.rejected_total += 1
        if self._counts_in is not None:
            self._counts_in.rejected()

    def batch(self, size: int) -> None:
        self.batches_by_size[size] += 1
        self._batch_sizes.append(size)
        if self._counts_in is not None:
            self._counts_in.batch(size)

    def sample(
        self, latency_scale: float = 1.0, replicas: tuple[ReplicaSample, ...] = ()
    ) -> DeploymentSample:
        """What happened since the previous sample, with `replicas`' own figures (taken
        at the same moment); starts the next window."""
        figures = self._next_window(latency_scale)
        return DeploymentSample(
            deployment_id=self.deployment_id, replicas=replicas, **dataclasses.asdict(figures)
        )

    def replica_sample(self, replica: int, latency_scale: float = 1.0) -> ReplicaSample:
        """A replica's figures since the previous sample; starts the next window."""
        figures = self._next_window(latency_scale)
        return ReplicaSample(replica=replica, **dataclasses.asdict(figures))

    def _next_window(self, latency_scale: float) -> _Window:
        """The figures since the previous sample; starts the next window."""
        now = self._clock()
        elapsed = max(now - self._window_started, 1e-9)
        requests0, errors0, rejected0 = self._window
        requests = self.requests_total - requests0
        ordered = sorted(v * latency_scale for v in self._latencies_ms)
        batches = self._batch_sizes
        window = _Window(
            requests=requests,
            errors=self.errors_total - errors0,
            rejected=self.rejected_total - rejected0,
            requests_per_s=requests / elapsed,
            latency_p50_ms=_quantile(ordered, 0.5) if ordered else None,
            latency_p95_ms=_quantile(ordered, 0.95) if ordered else None,
            latency_p99_ms=_quantile(ordered, 0.99) if ordered else None,
            mean_batch_size=sum(batches) / len(batches) if batches else None,
        )
        self._window = (self.requests_total, self.errors_total, self.rejected_total)
        self._window_started = now
        self._latencies_ms.clear()
        self._batch_sizes = []
        return window

    def recent_latencies_ms(self) -> list[float]:
        return sorted(self._latencies_ms)


def render_prometheus(stats: list[ServingStats]) -> str:
    """The agent's `/metrics` in the Prometheus text format (no client library needed)."""
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")

    for name, help_text, attribute in (
        ("greenfed_inference_requests_total", "Inference requests answered", "requests_total"),
        ("greenfed_inference_errors_total", "Inference requests that failed", "errors_total"),
        ("greenfed_inference_rejected_total", "Requests refused: queue full", "rejected_total"),
    ):
        family(name, "counter", help_text)
        for s in stats:
            lines.append(f'{name}{{deployment="{s.deployment_id}"}} {getattr(s, attribute)}')
    family("greenfed_inference_latency_seconds", "summary", "Request latency (recent window)")
    for s in stats:
        ordered = s.recent_latencies_ms()
        label = f'deployment="{s.deployment_id}"'
        for q in (0.5, 0.95, 0.99):
            value = _quantile(ordered, q) / 1000.0 if ordered else float("nan")
            lines.append(f'greenfed_inference_latency_seconds{{{label},quantile="{q}"}} {value}')
        lines.append(f"greenfed_inference_latency_seconds_sum{{{label}}} {s.latency_sum_s}")
        lines.append(
            f"greenfed_inference_latency_seconds_count{{{label}}} "
            f"{s.requests_total - s.errors_total}"
        )
    family("greenfed_inference_batch_size", "histogram", "Requests per model run")
    for s in stats:
        label = f'deployment="{s.deployment_id}"'
        cumulative = 0
        for bound in BATCH_BUCKETS:
            cumulative = sum(n for size, n in s.batches_by_size.items() if size <= bound)
            lines.append(
                f'greenfed_inference_batch_size_bucket{{{label},le="{bound}"}} {cumulative}'
            )
        total = sum(s.batches_by_size.values())
        lines.append(f'greenfed_inference_batch_size_bucket{{{label},le="+Inf"}} {total}')
        weighted = sum(size * n for size, n in s.batches_by_size.items())
        lines.append(f"greenfed_inference_batch_size_sum{{{label}}} {weighted}")
        lines.append(f"greenfed_inference_batch_size_count{{{label}}} {total}")
    return "\n".join(lines) + "\n"
