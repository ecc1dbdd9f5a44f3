"""What the leader's usage metering costs per telemetry sample, in process: the live
accountant (cloud/usage/accountant.py) observing samples of nodes that each run one job,
against ingestion's own cost of taking the same samples (`Ingestor.handle`). With
accounting on, metering is most of what the leader spends on a sample
(benchmarks/RESULTS.md, issue 28).

    python benchmarks/metering_cost.py --nodes 10000 --rounds 6

It runs under the interpreter settings the leader schedules with
(`cloud.interpreter_tuning.tuned_for_scheduling`: the oldest generation of the garbage
collector collected 100 times less often), as the accountant does; `--python-gc` keeps
Python's defaults.

Prints the medians of `--repeats` runs, in microseconds per sample, as JSON:
`observe_us` (the accountant alone, on decoded samples), `handle_us` (ingestion without
metering) and `handle_metered_us` (ingestion with the accountant listening). The
accountant meters a node's energy counters once per flush, from its latest sample
(cloud/usage/accountant.py): the timed loops meter what is held every
`--samples-per-flush` rounds, as flushes would (2: agents' 5 s interval, the 10 s
`usage.flush_interval_s`); the store writes are not timed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from cloud.fleet.ingest import Ingestor
from cloud.fleet.registry import NodeRegistry
from cloud.interpreter_tuning import tuned_for_scheduling
from cloud.usage.accountant import Accountant
from shared.messages import TELEMETRY_DECODER, encode
from shared.topics import Channel, Topics

TOPICS = Topics("greenfed")


def ingestor_of(nodes: int) -> tuple[Ingestor, NodeRegistry]:
    registry = NodeRegistry()
    ingestor = Ingestor(registry, TOPICS, max_payload_bytes=256 * 1024)
    for node_id in node_ids(nodes):
        ingestor.handle(TOPICS.node(node_id, Channel.STATUS), encode(birth(node_id)))
    return ingestor, registry


def samples(nodes: int, rounds: int) -> list[tuple[str, bytes]]:
    return telemetry_messages(TOPICS, nodes, rounds, spaced=True)


def handle_us(ingestor: Ingestor, messages: list[tuple[str, bytes]]) -> float:
    handle = ingestor.handle
    began = time.perf_counter()
    for topic, payload in messages:
        handle(topic, payload)
    return (time.perf_counter() - began) / len(messages) * 1e6


def flushes(rounds: int, samples_per_flush: int) -> range:
    """The rounds after which a flush meters what is held (and after the last)."""
    return range(samples_per_flush, rounds + samples_per_flush, samples_per_flush)


def taking(
    ingestor: Ingestor, messages: list[tuple[str, bytes]], nodes: int
) -> Callable[[int, int], None]:
    """`take(first, end)` for `metered_us`: the ingestor handles the messages of rounds
    [first, end), a round being every node's sample."""

    handle = ingestor.handle

    def take(first: int, end: int) -> None:
        for topic, payload in messages[first * nodes : end * nodes]:
            handle(topic, payload)

    return take


async def metered_us(
    take: Callable[[int, int], None], accountant: Accountant, nodes: int, rounds: int, every: int
) -> float:
    """Per sample: `take(first, end)` of the samples of rounds [first, end), and the
    flushes' metering of what is held after every `every` rounds."""
    began, start = time.perf_counter(), 0
    for end in flushes(rounds, every):
        take(start, min(end, rounds))
        await accountant.meter_held()
        start = end
    return (time.perf_counter() - began) / (rounds * nodes) * 1e6


async def one_run(nodes: int, rounds: int, every: int) -> dict[str, float]:
    # Each run's samples are made once its marks are (`metering` counts from now): an
    # older sample would be a replay, which metering skips.
    plain, _ = ingestor_of(nodes)
    result = {"handle_us": handle_us(plain, samples(nodes, rounds))}
    metered, registry = ingestor_of(nodes)
    async with metering(metered, registry, nodes) as accountant:
        take = taking(metered, samples(nodes, rounds), nodes)
        result["handle_metered_us"] = await metered_us(take, accountant, nodes, rounds, every)
    observed, registry = ingestor_of(nodes)
    async with metering(observed, registry, nodes) as accountant:
        observed.telemetry_listeners.remove(accountant.observe)
        decoded = [TELEMETRY_DECODER.decode(payload) for _, payload in samples(nodes, rounds)]
        observe = accountant.observe
        replays = accountant.stats.replays

        for sample in decoded:  # the registry as ingestion leaves it, then metering alone
            registry.apply_telemetry(sample)

        def take_decoded(first: int, end: int) -> None:
            for sample in decoded[first * nodes : end * nodes]:
                observe(sample)

        result["observe_us"] = await metered_us(take_decoded, accountant, nodes, rounds, every)
        assert accountant.stats.replays == replays, "samples older than the marks"
        # The usual path: every counter believed (its samples come as fast as they are
        # made here, never faster than the devices' power allows).
        assert accountant.stats.implausible == 0, accountant.stats.implausible
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=6, help="samples per node")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--samples-per-flush",
        type=int,
        default=2,
        help="rounds between two flushes' metering (usage.flush_interval_s / the agents' interval)",
    )
    parser.add_argument(
        "--python-gc", action="store_true", help="Python's collector thresholds, not the leader's"
    )
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    settings = contextlib.nullcontext() if args.python_gc else tuned_for_scheduling()
    with settings:
        runs = [
            asyncio.run(one_run(args.nodes, args.rounds, args.samples_per_flush))
            for _ in range(args.repeats)
        ]
    medians = {key: round(statistics.median(run[key] for run in runs), 2) for key in runs[0]}
    medians["metering_us"] = round(medians["handle_metered_us"] - medians["handle_us"], 2)
    print(
        json.dumps(
            {
                "nodes": args.nodes,
                "rounds": args.rounds,
                "samples_per_flush": args.samples_per_flush,
                "python_gc": args.python_gc,
                **medians,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
