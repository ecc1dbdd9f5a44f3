"""What a control-plane replica that does not meter spends on each sample, in process:
one it takes itself from the broker (`Ingestor.handle`: decode, checks, registry, the
digest), and one another replica relayed in a digest (`Ingestor.handle_digest`: the
digest decoded by its index, `NodeRegistry.apply_relayed`). Their ratio is what bends
the replicas' scaling: each replica takes 1/N of the fleet's samples and merges the rest
(benchmarks/RESULTS.md, issue 28).

    python benchmarks/digest_merge.py --nodes 10000 --rounds 6
    python benchmarks/digest_merge.py --nodes 1000 --rounds 40

With `--metering` the replica is the leader: its live accountant (cloud/usage/) meters
every node, its own samples and every digest's, each node running one job, under the
interpreter settings the leader schedules with (`cloud.interpreter_tuning`), wired as
cloud/app.py wires it. Energy counters are metered once per flush from a node's latest
sample (a relayed one decoded then): the flushes' metering, every `--samples-per-flush`
rounds, is timed in.

    python benchmarks/digest_merge.py --nodes 10000 --rounds 6 --metering

Prints the medians of `--repeats` runs, in microseconds per sample, as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.ingest import birth, metering, node_ids, telemetry_messages
from benchmarks.metering_cost import handle_us, metered_us, taking
from cloud.fleet.digest import RELAYED_DIGEST_DECODER, DigestBuilder
from cloud.fleet.ingest import Ingestor
from cloud.fleet.registry import NodeRegistry
from cloud.interpreter_tuning import tuned_for_scheduling
from shared.messages import TELEMETRY_DECODER, encode
from shared.topics import Channel, Topics

TOPICS = Topics("greenfed")


def replica(nodes: int) -> Ingestor:
    """A replica sharing telemetry, every node born."""
    ingestor = Ingestor(NodeRegistry(), TOPICS, max_payload_bytes=256 * 1024, shared_group="bench")
    for node_id in node_ids(nodes):
        ingestor.handle(TOPICS.node(node_id, Channel.STATUS), encode(birth(node_id)))
    return ingestor


def digests(nodes: int, rounds: int) -> list[list[bytes]]:
    """Another replica's digests, round by round: every node's sample in each round."""
    other = DigestBuilder("replica-other", max_payload_bytes=256 * 1024)
    samples = telemetry_messages(TOPICS, nodes, rounds, spaced=True)
    messages = []
    for first in range(0, len(samples), nodes):  # a digest a round
        for _, raw in samples[first : first + nodes]:
            other.observe(TELEMETRY_DECODER.decode(raw), raw)
        messages.append(other.take(time.time()))
    return messages


def merge_us(nodes: int, rounds: int, messages: list[list[bytes]]) -> float:
    ingestor = replica(nodes)
    began = time.perf_counter()
    for round_messages in messages:
        for message in round_messages:
            ingestor.handle_digest(message)
    spent = time.perf_counter() - began
    assert ingestor.stats.ingested["digest"] == nodes * rounds, ingestor.stats.ingested
    return spent / (nodes * rounds) * 1e6


def take_us(nodes: int, rounds: int) -> float:
    ingestor = replica(nodes)
    spent_us = handle_us(ingestor, telemetry_messages(TOPICS, nodes, rounds, spaced=True))
    assert ingestor.stats.ingested["telemetry"] == nodes * rounds
    return spent_us


def digest_taking(ingestor: Ingestor, by_round: list[list[bytes]]) -> Callable[[int, int], None]:
    """`take(first, end)` for `metered_us`: the ingestor merges the digests of rounds
    [first, end)."""

    handle_digest = ingestor.handle_digest

    def take(first: int, end: int) -> None:
        for round_messages in by_round[first:end]:
            for message in round_messages:
                handle_digest(message)

    return take


async def leader_us(nodes: int, rounds: int, every: int) -> tuple[float, float]:
    """(merge, take) for the leader, which meters both."""
    merged = await _leader_cost(nodes, rounds, every, relayed=True)
    taken = await _leader_cost(nodes, rounds, every, relayed=False)
    return merged, taken


async def _leader_cost(nodes: int, rounds: int, every: int, *, relayed: bool) -> float:
    ingestor = replica(nodes)
    async with metering(ingestor, ingestor.registry, nodes) as accountant:
        ingestor.digest_listeners.append(accountant.observe)  # as cloud/app.py does
        ingestor.relayed_wanted = accountant.relayed
        # Made once the marks are (metering counts from now: older is a replay).
        take = (
            digest_taking(ingestor, digests(nodes, rounds))
            if relayed
            else taking(ingestor, telemetry_messages(TOPICS, nodes, rounds, spaced=True), nodes)
        )
        spent_us = await metered_us(take, accountant, nodes, rounds, every)
        channel = "digest" if relayed else "telemetry"
        assert ingestor.stats.ingested[channel] == nodes * rounds, ingestor.stats.ingested
        assert accountant.stats.replays == 0
        assert accountant.stats.implausible == 0  # every counter believed: the usual path
    return spent_us


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=6, help="samples per node")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--metering", action="store_true", help="the leader, metering")
    parser.add_argument(
        "--samples-per-flush",
        type=int,
        default=2,
        help="with --metering: rounds between two flushes' metering",
    )
    args = parser.parse_args()
    if args.metering:
        with tuned_for_scheduling():
            runs = [
                asyncio.run(leader_us(args.nodes, args.rounds, args.samples_per_flush))
                for _ in range(args.repeats)
            ]
        merged = statistics.median(run[0] for run in runs)
        taken = statistics.median(run[1] for run in runs)
        _report(args.nodes, args.rounds, merged, taken, None, metering=True)
        return
    messages = digests(args.nodes, args.rounds)
    decode = []
    for _ in range(args.repeats):
        began = time.perf_counter()
        for round_messages in messages:
            for message in round_messages:
                RELAYED_DIGEST_DECODER.decode(message)
        decode.append((time.perf_counter() - began) / (args.nodes * args.rounds) * 1e6)
    merge = [merge_us(args.nodes, args.rounds, messages) for _ in range(args.repeats)]
    take = [take_us(args.nodes, args.rounds) for _ in range(args.repeats)]
    merged, taken = statistics.median(merge), statistics.median(take)
    _report(args.nodes, args.rounds, merged, taken, statistics.median(decode), metering=False)


def _report(
    nodes: int, rounds: int, merged: float, taken: float, decode: float | None, *, metering: bool
) -> None:
    json.dump(
        {
            "nodes": nodes,
            "samples_per_node": rounds,
            "metering": metering,
            "merge_relayed_us": round(merged, 2),
            **({} if decode is None else {"of_which_digest_decode_us": round(decode, 2)}),
            "take_own_us": round(taken, 2),
            "merge_to_take": round(merged / taken, 3),
            # Each replica's CPU per fleet sample is (take + (N - 1) merge) / N when no
            # digest coalesces a node's samples: N replicas' capacity over one replica's.
            "model_capacity_ratio": {
                str(n): round(n * taken / (taken + (n - 1) * merged), 2) for n in (2, 3)
            },
        },
        sys.stdout,
        indent=2,
    )
    print()


if __name__ == "__main__":
    main()
