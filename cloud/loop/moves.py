"""Moving running training to cleaner capacity in the live loop: which runs may move.

The decision is `cloud.green.migration.Migrator`'s, made in the pass that
`cloud.green.pass_rule.schedule_then_move` runs (the evaluation runs the same);
this module gives it what the control plane knows of the running jobs, and plans.py
turns its moves into the pass's plan (an eviction and a placement of the same job
in one transaction, so the old workers are stopped and new ones started with
`GREENFED_ATTEMPT` one higher; they resume from their newest checkpoint).

What the control plane knows of a run: when it was placed (its allocations'
`started_at`) and on which nodes, not how far earlier runs got. A run is assumed
to have the job's whole `estimated_duration_s` to do. For a job that moved or was
preempted before, that overestimates what is left: the deadline check gets
stricter, and both sides of the comparison grow alike, so the restart and the
lost work weigh a little less than they should.

Moves are skipped:
- in a pass that preempted anything (the pass rule's; the next pass looks again);
- for jobs not yet reported `running` (their workers may still be starting);
- for a job whose next attempt would be its last (`store.max_attempts`, which its own
  failures and a person's requeues do not use up): a move must never be what fails a
  job. A move does use one of its attempts, so a moved job has one fewer left for
  later evictions (node loss, preemption).
"""

from __future__ import annotations

from cloud.green.migration import RunningJob
from cloud.loop.inputs import PassInputs
from cloud.loop.nodes import pool_model
from cloud.scheduler import TrainingJob
from cloud.scheduler.snapshot import pool_speed


def running_jobs(inputs: PassInputs, max_attempts: int) -> list[RunningJob]:
    """The running training jobs that could move (`TrainingJob.movable`), have attempts to
    spare and run only on nodes the registry knows."""
    table = inputs.snapshot.nodes
    result = []
    for work_id, members in sorted(inputs.allocations.items()):
        record = inputs.records.get(work_id)
        work = inputs.works.get(work_id)
        if (
            record is None
            or record.state != "running"
            or not isinstance(work, TrainingJob)
            or not work.movable
            or record.attempts - record.failures - record.requeues + 1 >= max_attempts
            or not members
            or any(member.node_id not in table.index for member in members)
        ):
            continue
        speed = min(
            pool_speed(
                table,
                m.node_id,
                m.accelerator_kind,
                pool_model(inputs.nodes[m.node_id], m.accelerator_ids),
                power_limit_w=m.power_limit_w,
            )
            for m in members
        )
        result.append(
            RunningJob(job=work, started_s=max(m.started_at for m in members), speed=speed)
        )
    return result
