"""Dynamic batching keeps each client's request to itself: a request stacked with others
gets its own rows and nothing else, and what goes wrong with one batch (a model whose
outputs cannot be split, shapes that cannot be stacked, a failure while answering)
fails that batch's requests at most, never the batcher (a task in the agent's task
group: its end would stop the agent) and never the event loop (a large run on it
stalls every deployment, the endpoint and the agent's MQTT traffic)."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

import numpy as np
import pytest
from structlog.testing import capture_logs

from edge.inference import batching
from edge.inference.batching import Batcher, OutputsNotBatched
from edge.inference.session import LoadedModel, check_feeds
from edge.inference.stats import ServingStats
from tests.inference.onnx_shapes import gram, identity, total

pytestmark = pytest.mark.timeout(30)

ANSWER_S = 5.0  # bound on any one wait below: a batcher that stopped must not hang a test


def loaded(tmp_path: Path, body: bytes) -> LoadedModel:
    path = tmp_path / "m.onnx"
    path.write_bytes(body)
    return LoadedModel(path, hashlib.sha256(body).hexdigest(), None)


@pytest.fixture
async def start() -> AsyncIterator[Callable[[Batcher], Batcher]]:
    """Runs a batcher until the test ends."""
    tasks: list[asyncio.Task[None]] = []

    def started(batcher: Batcher) -> Batcher:
        tasks.append(asyncio.create_task(batcher.run()))
        return batcher

    yield started
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def answered(
    batcher: Batcher, *requests: Mapping[str, np.ndarray]
) -> list[tuple[LoadedModel, list[np.ndarray]] | BaseException]:
    """Every request sent at once (so that they can share a run), answered or failed."""
    sent = (batcher.infer(feeds, check_feeds(batcher.model, feeds)) for feeds in requests)
    return await asyncio.wait_for(asyncio.gather(*sent, return_exceptions=True), ANSWER_S)


async def test_outputs_without_a_batch_axis_fail_their_batch_and_the_batcher_goes_on(
    tmp_path: Path,
) -> None:
    """A model that sums its whole input answers a scalar: two requests run together
    cannot be split back. Where its shapes do not say so at load (forced below), they
    fail with a reason; the batcher, in the agent's task group, keeps serving."""
    model = loaded(tmp_path, total())
    model.batchable = True  # as a model whose declared shapes mislead
    stats = ServingStats("d")
    # Two rows fill the batch at once: no waiting on the (long) delay.
    batcher = Batcher(model, stats, max_batch_size=2, max_queue_delay_s=30)
    x = np.ones((1, 4), np.float32)
    async with asyncio.TaskGroup() as agent:  # as the agent's own `work` group
        runner = agent.create_task(batcher.run())
        both = await answered(batcher, {"x": x}, {"x": 2 * x})
        for failed in both:
            assert isinstance(failed, OutputsNotBatched), failed
            assert "output 'y' has shape []" in str(failed)
            assert '"max_batch_size": 1' in str(failed)
        assert stats.errors_total == 2
        assert not runner.done()

        batcher.configure(max_batch_size=1, max_queue_delay_s=0.0)
        (alone,) = await answered(batcher, {"x": 2 * x})
        assert not isinstance(alone, BaseException)
        assert alone[1][0] == 8.0
        runner.cancel()


async def test_an_unexpected_failure_answering_a_batch_fails_that_batch_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stats = ServingStats("d")
    batcher = Batcher(loaded(tmp_path, identity()), stats, max_batch_size=2, max_queue_delay_s=30)
    broken = [RuntimeError("the figures broke")]
    observe = stats.observe

    def observe_once_broken(latency_s: float) -> None:
        if broken:
            raise broken.pop()
        observe(latency_s)

    monkeypatch.setattr(stats, "observe", observe_once_broken)
    x = np.ones((1, 4), np.float32)
    with capture_logs() as logs:
        async with asyncio.TaskGroup() as agent:
            runner = agent.create_task(batcher.run())
            both = await answered(batcher, {"x": x}, {"x": 2 * x})
            assert [str(failed) for failed in both] == ["the figures broke"] * 2
            assert not runner.done()
            after = await answered(batcher, {"x": 3 * x}, {"x": 4 * x})
            for sent, answer in zip((3 * x, 4 * x), after, strict=True):
                assert not isinstance(answer, BaseException), answer
                np.testing.assert_array_equal(answer[1][0], sent)
            runner.cancel()
    failures = [line for line in logs if line["event"] == "inference batch failed"]
    assert len(failures) == 1
    assert (failures[0]["deployment_id"], failures[0]["requests"]) == ("d", 2)


async def test_a_request_with_no_rows_is_refused_and_takes_no_other_clients_rows(
    tmp_path: Path, start: Callable[[Batcher], Batcher]
) -> None:
    """Counted as one row, an empty request stacked with another client's was handed
    that client's first row."""
    model = loaded(tmp_path, identity())
    empty = {"x": np.zeros((0, 4), np.float32)}
    with pytest.raises(ValueError, match=r"x: shape \[0, 4\] has no rows"):
        check_feeds(model, empty)
    batcher = start(Batcher(model, ServingStats("d"), max_batch_size=8, max_queue_delay_s=30))
    with pytest.raises(ValueError, match="at least one row"):
        await asyncio.wait_for(batcher.infer(empty, 0), ANSWER_S)
    assert batcher.queued == 0


async def test_requests_of_other_shapes_wait_for_their_own_batch(
    tmp_path: Path, start: Callable[[Batcher], Batcher]
) -> None:
    """x[batch, seq] with a free seq: requests of another seq cannot be stacked with the
    first one's, so they run in a batch of their own instead of failing it."""
    stats = ServingStats("d")
    # The two seq-3 requests (3 rows) fill a batch at once; the seq-5 one runs once the
    # 50 ms delay has passed.
    batcher = start(
        Batcher(
            loaded(tmp_path, identity(("batch", "seq"))),
            stats,
            max_batch_size=3,
            max_queue_delay_s=0.05,
        )
    )
    short = np.ones((1, 3), np.float32)
    long = np.full((1, 5), 2.0, np.float32)
    short_too = np.full((2, 3), 3.0, np.float32)
    answers = await answered(batcher, {"x": short}, {"x": long}, {"x": short_too})
    for sent, answer in zip((short, long, short_too), answers, strict=True):
        assert not isinstance(answer, BaseException), answer
        np.testing.assert_array_equal(answer[1][0], sent)
    assert dict(stats.batches_by_size) == {2: 1, 1: 1}
    assert stats.errors_total == 0


async def test_a_request_larger_than_the_runs_measured_fast_leaves_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start: Callable[[Batcher], Batcher]
) -> None:
    """Tiny requests make runs look fast enough to run on the event loop; a large one
    (64 MB at most) would stall it for seconds, so it goes to a thread."""
    # A threshold every run here meets on any machine: what is tested is the size check.
    monkeypatch.setattr(batching, "INLINE_RUN_S", 0.5)
    model = loaded(tmp_path, gram())
    runs: list[tuple[int, bool]] = []  # rows, whether on the event loop's thread
    loop_thread = threading.get_ident()
    run = model.run

    def recorded_run(feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        runs.append((len(feeds["x"]), threading.get_ident() == loop_thread))
        return run(feeds)

    monkeypatch.setattr(model, "run", recorded_run)
    batcher = start(Batcher(model, ServingStats("d")))
    tiny = {"x": np.ones((1, 1), np.float32)}
    large = {"x": np.ones((256, 256), np.float32)}
    for feeds in (tiny, tiny, large, tiny):
        (answer,) = await answered(batcher, feeds)
        assert not isinstance(answer, BaseException), answer
    # The first run is measured in a thread; then tiny runs stay on the loop, a larger
    # one does not.
    assert runs == [(1, False), (1, True), (256, False), (1, True)]


@pytest.mark.parametrize(
    ("body", "why"),
    [(total(), "a scalar output"), (gram(), "the batch dimension on a later axis")],
)
async def test_a_model_whose_outputs_mix_requests_rows_runs_one_request_at_a_time(
    tmp_path: Path, start: Callable[[Batcher], Batcher], body: bytes, why: str
) -> None:
    """x @ x^T is [batch, batch]: stacked, each client got dot products with the other
    clients' rows (their data); a sum over the batch cannot be split at all. Their
    shapes say so at load: such a model is never batched."""
    model = loaded(tmp_path, body)
    assert not model.batchable, why
    batcher = start(Batcher(model, ServingStats("d"), max_batch_size=8, max_queue_delay_s=30))
    mine = np.array([[1, 2, 3, 4]], np.float32)
    theirs = np.array([[5, 6, 7, 8], [9, 10, 11, 12]], np.float32)
    for sent, answer in zip(
        (mine, theirs), await answered(batcher, {"x": mine}, {"x": theirs}), strict=True
    ):
        assert not isinstance(answer, BaseException), answer
        expected = sent @ sent.T if body == gram() else sent.sum()
        np.testing.assert_array_equal(answer[1][0], expected)
