"""`reported` entries and log chunks about work the assignment index does not know are
judged only by an index updated since they came (cloud/fleet/assignments.py
`HeldForConfirmation`): a replica that does not lead reloads the index from the store
every 2 s, so its "not assigned" for work the leader placed a moment ago means "not
yet", and counting it would raise `greenfed_mqtt_messages_invalid_total` (and its alert)
on a healthy cluster."""

from __future__ import annotations

from collections import Counter

import pytest

from cloud.fleet.assignments import AssignmentIndex, AssignmentKey
from cloud.fleet.ingest import Ingestor
from cloud.fleet.registry import NodeRegistry
from shared.messages import JobLogChunk, ReportedDeployment, ReportedState, encode
from shared.topics import Channel
from tests.cloud.test_ingest_unit import (
    TOPICS,
    Clock,
    FakeClock,
    birth,
    log_chunk,
    reported,
    run,
    topic,
)

pytestmark = pytest.mark.timeout(10)

# Room for a report that names a few hundred runs.
MAX_PAYLOAD_BYTES = 64 * 1024

RUNNING_JOB: AssignmentKey = ("training", "n1", "job-a", 2)
PLACED_BY_THE_LEADER: AssignmentKey = ("training", "n1", "job-new", 1)


@pytest.fixture
def hold_clock() -> Clock:
    return Clock()


@pytest.fixture
def index(hold_clock: Clock) -> AssignmentIndex:
    """What a replica that does not lead knows: n1 runs attempt 2 of job-a."""
    assignments = AssignmentIndex(monotonic=hold_clock, linger_s=60.0)
    assignments.replace({RUNNING_JOB})
    return assignments


@pytest.fixture
def follower(index: AssignmentIndex) -> tuple[Ingestor, list[JobLogChunk]]:
    clock = FakeClock()
    registry = NodeRegistry(monotonic=clock.monotonic, wall_clock=clock.wall)
    kept: list[JobLogChunk] = []
    ingestor = Ingestor(
        registry, TOPICS, max_payload_bytes=MAX_PAYLOAD_BYTES, on_log=kept.append, assignments=index
    )
    ingestor.handle(topic("n1", Channel.STATUS), encode(birth()))
    return ingestor, kept


def report(document: ReportedState, ingestor: Ingestor) -> None:
    ingestor.handle(topic("n1", Channel.REPORTED), encode(document))
    record = ingestor.registry.get("n1")
    assert record is not None
    assert record.reported == document  # applied as sent, whatever is counted


def test_a_report_of_work_placed_a_moment_ago_is_not_counted_before_the_index_learns_it(
    follower: tuple[Ingestor, list[JobLogChunk]], index: AssignmentIndex, hold_clock: Clock
) -> None:
    ingestor, _ = follower
    # The leader placed job-new and the agent started it; this replica's index is older.
    report(reported(run("job-a", 2, "running"), run("job-new", 1, "starting")), ingestor)
    hold_clock.now_s = 1.0
    report(reported(run("job-a", 2, "running"), run("job-new", 1, "running")), ingestor)
    assert ingestor.stats.invalid_total == 0

    hold_clock.now_s = 2.0  # the refresh from the store
    index.replace({RUNNING_JOB, PLACED_BY_THE_LEADER})
    hold_clock.now_s = 60.0
    index.replace({RUNNING_JOB, PLACED_BY_THE_LEADER})

    assert ingestor.stats.invalid_total == 0


def test_an_entry_still_unknown_after_the_hold_is_counted_once_per_report(
    follower: tuple[Ingestor, list[JobLogChunk]], index: AssignmentIndex, hold_clock: Clock
) -> None:
    ingestor, _ = follower
    lie = reported(
        run("job-a", 2, "running"),
        run("job-a", 1, "succeeded"),  # an earlier attempt
        run("someone-elses-job", 1, "succeeded"),
    )
    replica = ReportedDeployment(deployment_id="dep-x", replica=0, state="ready")
    report(lie, ingestor)
    report(
        ReportedState(
            node_id="n1",
            instance_id="i1",
            observed_generation=1,
            reported_at=1_700_000_000.0,
            training=lie.training,
            deployments=(replica,),
        ),
        ingestor,
    )
    hold_clock.now_s = 2.0
    index.replace({RUNNING_JOB})
    assert ingestor.stats.invalid_total == 0  # the hold (5 s) is not over

    hold_clock.now_s = 5.5
    index.replace({RUNNING_JOB})
    hold_clock.now_s = 60.0
    index.replace({RUNNING_JOB})

    assert ingestor.stats.invalid == Counter(
        {("reported", "wrong_attempt"): 2, ("reported", "not_assigned"): 3}
    )


def test_nothing_is_judged_while_the_index_is_not_updated(
    follower: tuple[Ingestor, list[JobLogChunk]], index: AssignmentIndex, hold_clock: Clock
) -> None:
    """The store is away: the index keeps what it last knew, which says nothing of what
    was placed since. Neither a report nor a log chunk is refused on its word."""
    ingestor, kept = follower
    chunk = log_chunk("n1", "job-new", 1, "epoch 1\n")
    ingestor.handle(topic("n1", Channel.LOGS), encode(chunk))
    report(reported(run("job-new", 1, "running")), ingestor)
    hold_clock.now_s = 30.0  # long past the hold; the same node says more
    later = log_chunk("n1", "job-new", 1, "epoch 2\n")
    ingestor.handle(topic("n1", Channel.LOGS), encode(later))
    report(reported(run("job-new", 1, "running")), ingestor)
    assert ingestor.stats.invalid_total == 0
    assert kept == []

    hold_clock.now_s = 31.0  # the store is back
    index.replace({RUNNING_JOB, PLACED_BY_THE_LEADER})

    assert kept == [chunk, later]
    assert ingestor.stats.invalid_total == 0


def test_a_report_full_of_unknown_entries_leaves_room_for_the_nodes_log_chunks(
    follower: tuple[Ingestor, list[JobLogChunk]], index: AssignmentIndex, hold_clock: Clock
) -> None:
    ingestor, kept = follower
    report(reported(*(run(f"old-{number}", 1, "succeeded") for number in range(300))), ingestor)
    # 256 wait for the index; the rest are judged (and counted) at once.
    assert ingestor.stats.invalid[("reported", "not_assigned")] == 300 - 256
    fresh = log_chunk("n1", "job-new", 1, "first line\n")
    ingestor.handle(topic("n1", Channel.LOGS), encode(fresh))

    hold_clock.now_s = 1.0
    index.replace({RUNNING_JOB, PLACED_BY_THE_LEADER})
    assert kept == [fresh]
    hold_clock.now_s = 6.0
    index.replace({RUNNING_JOB, PLACED_BY_THE_LEADER})
    assert ingestor.stats.invalid == Counter({("reported", "not_assigned"): 300})
