"""Inference request counters across control-plane replicas, as `greenfed cloud` wires
them (cloud/app.py): summed over the replicas' /metrics, as the dashboards'
`sum by (deployment) (rate(greenfed_inference_requests_total))` does, every request
counts once. Without a shared group every replica takes every sample, so only the
scheduling leader counts and exports them, through a failover and a fail-back; with one,
each replica counts the share it took (docs/monitoring.md "Several replicas",
docs/mqtt.md)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterable
from typing import cast

import msgspec
from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cloud.app import create_app
from cloud.app_keys import INGESTOR, METRICS, SCHEDULER
from cloud.loop.loop import SchedulingLoop
from shared.messages import DeploymentSample, encode
from shared.settings import MqttSettings, Settings
from shared.topics import Channel
from tests.cloud.test_ingest_unit import birth, sample

REQUESTS_PER_SAMPLE = 100
REQUESTS = "greenfed_inference_requests_total"
RATE = "greenfed_inference_requests_per_second"


class Leadership:
    """What the counters ask of the scheduling loop (`SchedulingLoop.leading`)."""

    def __init__(self) -> None:
        self.leading = asyncio.Event()


def replica(shared_group: str = "") -> web.Application:
    """A control plane's app, as created before it starts: its metrics and ingestion."""
    app = create_app(Settings(mqtt=MqttSettings(shared_group=shared_group)))
    assignments = app[INGESTOR].assignments
    assert assignments is not None
    assignments.replace([("replica", "n1", "d1", 0)])  # n1 serves d1
    app[INGESTOR].handle(app[INGESTOR].topics.node("n1", Channel.STATUS), encode(birth("n1")))
    return app


def scheduling(app: web.Application) -> Leadership:
    leadership = Leadership()
    app[SCHEDULER] = cast(SchedulingLoop, leadership)
    return leadership


def serve(seqs: Iterable[int], *apps: web.Application) -> None:
    """Node n1's samples of `seqs`, each with 100 requests of d1, taken by every app."""
    for seq in seqs:
        telemetry = msgspec.structs.replace(
            sample("n1", seq=seq),
            sampled_at=time.time(),  # as the ingestor's clock judges it
            deployments=(
                DeploymentSample(
                    deployment_id="d1",
                    requests=REQUESTS_PER_SAMPLE,
                    errors=0,
                    rejected=0,
                    requests_per_s=10.0,
                ),
            ),
        )
        for app in apps:
            ingestor = app[INGESTOR]
            ingestor.handle(ingestor.topics.node("n1", Channel.TELEMETRY), encode(telemetry))


def scraped(app: web.Application, name: str) -> float | None:
    """d1's value of `name` on the app's /metrics (tenants' series); None: no sample."""
    text = generate_latest(app[METRICS].tenants).decode()
    values = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and sample.labels.get("deployment") == "d1"
    ]
    assert len(values) <= 1, values
    return values[0] if values else None


class Increase:
    """What `sum(increase())` over both replicas' series adds up: each series' rises
    between consecutive scrapes that export it (a series that appears, or reappears,
    adds nothing at its first scrape; one that falls was reset)."""

    def __init__(self, *apps: web.Application) -> None:
        self._apps = apps
        self._last: dict[int, float | None] = {}
        self.total = 0.0

    def scrape(self) -> None:
        for number, app in enumerate(self._apps):
            value = scraped(app, REQUESTS)
            last = self._last.get(number)
            if value is not None and last is not None:
                self.total += value - last if value >= last else value
            self._last[number] = value


def test_without_a_shared_group_only_the_leader_counts_the_requests() -> None:
    leader, follower = replica(), replica()
    scheduling(leader).leading.set()
    scheduling(follower)  # its loop runs, but another replica holds the lease
    serve(range(1, 11), leader, follower)

    assert scraped(leader, REQUESTS) == 10 * REQUESTS_PER_SAMPLE
    assert scraped(follower, REQUESTS) is None  # not summed in a second time
    # The rate the agents report is read from every replica's registry, as before.
    assert scraped(leader, RATE) == scraped(follower, RATE) == 10.0


def test_an_api_only_replica_exports_no_request_counters_without_a_shared_group() -> None:
    api_only = replica()  # scheduling.enabled = false: it never leads
    serve(range(1, 4), api_only)
    assert scraped(api_only, REQUESTS) is None


def test_summed_across_a_failover_and_a_fail_back_each_request_counts_once() -> None:
    first, second = replica(), replica()
    first_leads, second_leads = scheduling(first).leading, scheduling(second).leading
    increase = Increase(first, second)
    seqs = itertools.count(1)
    served = 0

    def term(leader: asyncio.Event, samples: int) -> None:
        """`leader` leads for `samples` samples, every replica taking each, scraped after
        each."""
        nonlocal served
        first_leads.clear()
        second_leads.clear()
        leader.set()
        increase.scrape()  # the term's first scrape: its series (re)appear here
        for _ in range(samples):
            serve([next(seqs)], first, second)
            served += REQUESTS_PER_SAMPLE
            increase.scrape()

    first_leads.set()
    # d1's first requests: its series appears with them (increase() counts from there).
    serve([next(seqs)], first, second)
    increase.scrape()
    term(first_leads, 5)
    term(second_leads, 4)  # failover
    term(first_leads, 3)  # and back: on from where it stood, not by the second's term

    assert increase.total == served == 12 * REQUESTS_PER_SAMPLE
    assert scraped(first, REQUESTS) == 9 * REQUESTS_PER_SAMPLE  # its own terms only
    assert scraped(second, REQUESTS) is None  # dropped when it lost leadership


def test_with_a_shared_group_each_replica_counts_its_share_leader_or_not() -> None:
    first, second = replica("greenfed-cloud"), replica("greenfed-cloud")
    scheduling(first).leading.set()
    # The broker hands each sample to one member of the group.
    serve(range(1, 7), first)
    serve(range(7, 11), second)

    assert scraped(first, REQUESTS) == 6 * REQUESTS_PER_SAMPLE
    assert scraped(second, REQUESTS) == 4 * REQUESTS_PER_SAMPLE
