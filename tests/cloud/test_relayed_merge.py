"""A digest merged by its index (`NodeRegistry.apply_relayed`, which settles the usual
sample inline) leaves the registry as the full rules would, sample by sample
(`apply_telemetry`): on random histories of births, wills, samples, relayed samples and
time, the same nodes in the same states, at the same sequence numbers, seen at the same
times, with the same refusals and state changes."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud.fleet.registry import NodeRegistry, NodeStateChange, Rejection
from shared.messages import TELEMETRY_DECODER, Telemetry, encode
from tests.cloud.test_ingest_unit import FakeClock, birth, sample, will

NODES = ("n1", "n2", "n3")
INSTANCES = ("i1", "i2")


def opened(node_id: str, raw: bytes, received_s: float, instance_id: str, seq: int) -> Telemetry:
    """A relayed sample, decoded (each is what its index entry says: checked by ingestion)."""
    return TELEMETRY_DECODER.decode(raw)


births = st.tuples(st.just("birth"), st.sampled_from(NODES), st.sampled_from(INSTANCES))
wills = st.tuples(st.just("will"), st.sampled_from(NODES), st.sampled_from(INSTANCES))
# Sequence numbers near each other (in order, repeated, behind) and far ahead (a jump).
seqs = st.one_of(st.integers(0, 12), st.integers(10**6, 10**6 + 2))
entries = st.tuples(st.sampled_from(NODES), st.sampled_from(INSTANCES), seqs)
samples = st.tuples(st.just("sample"), entries)
digests = st.tuples(st.just("digest"), st.lists(entries, max_size=6))
waits = st.tuples(st.just("wait"), st.sampled_from((0.0, 1.0, 30.0, 4000.0)))
histories = st.lists(st.one_of(births, wills, samples, digests, waits), max_size=40)


@settings(max_examples=300, deadline=None)
@given(histories)
def test_merging_by_index_is_the_full_rules_sample_by_sample(
    history: list[tuple[Any, ...]],
) -> None:
    clock = FakeClock()
    by_index = NodeRegistry(monotonic=clock.monotonic, wall_clock=clock.wall)
    one_by_one = NodeRegistry(monotonic=clock.monotonic, wall_clock=clock.wall)
    for step in history:
        kind = step[0]
        if kind == "wait":
            clock.now_s += step[1]
        elif kind in ("birth", "will"):
            status = (birth if kind == "birth" else will)(step[1], step[2])
            assert by_index.apply_status(status) == one_by_one.apply_status(status)
        elif kind == "sample":
            node_id, instance_id, seq = step[1]
            telemetry = sample(node_id, instance_id, seq)
            assert by_index.apply_telemetry(telemetry) == one_by_one.apply_telemetry(telemetry)
        else:
            now = (clock.monotonic(), clock.wall())
            batch = [
                (node_id, instance_id, seq, msgspec.Raw(encode(sample(node_id, instance_id, seq))))
                for node_id, instance_id, seq in step[1]
            ]
            merged = by_index.apply_relayed(batch, opened, now)
            applied = stale = 0
            outcomes: list[tuple[str, Rejection | NodeStateChange]] = []
            for node_id, instance_id, seq, _ in batch:
                outcome = one_by_one.apply_telemetry(sample(node_id, instance_id, seq))
                if outcome is Rejection.OUT_OF_ORDER:
                    stale += 1
                    continue
                applied += not isinstance(outcome, Rejection)
                if outcome is not None:
                    outcomes.append((node_id, outcome))
            assert (merged.applied, merged.stale, merged.outcomes) == (applied, stale, outcomes)
        assert by_index.version == one_by_one.version
        for node_id in NODES:
            ours, theirs = by_index.get(node_id), one_by_one.get(node_id)
            assert (ours is None) == (theirs is None)
            if ours is None or theirs is None:
                continue
            assert (
                ours.state,
                ours.offline_reason,
                ours.status.instance_id,
                ours.telemetry_seq,
                ours.last_seen_monotonic,
                ours.last_seen_at,
                ours.telemetry_received_monotonic,
                by_index.holds_node(ours),
            ) == (
                theirs.state,
                theirs.offline_reason,
                theirs.status.instance_id,
                theirs.telemetry_seq,
                theirs.last_seen_monotonic,
                theirs.last_seen_at,
                theirs.telemetry_received_monotonic,
                one_by_one.holds_node(theirs),
            )
