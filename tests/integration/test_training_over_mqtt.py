"""Training workers assigned through `desired`, reported through `reported` and `events`."""

from __future__ import annotations

import sys
from pathlib import Path

from cloud.fleet.registry import NodeRecord
from shared.messages import DesiredState, DesiredTraining, ReportedTraining
from tests.support.brokers import BrokerUnderTest
from tests.support.fleet import (
    mqtt_settings,
    publish_desired,
    running,
    running_ingestion,
    simulated_agent,
)
from tests.support.launchers import plain_launchers
from tests.support.waiting import eventually


def training_states(record: NodeRecord | None) -> dict[tuple[str, int], str]:
    if record is None or record.reported is None:
        return {}
    return {(t.job_id, t.attempt): t.state for t in record.reported.training}


async def test_a_simulated_cloud_node_runs_a_gang_worker_to_success(
    broker: BrokerUnderTest, topic_root: str
) -> None:
    settings = mqtt_settings(broker.url, topic_root)
    agent = simulated_agent("a100-7", settings, "a100-4x", site="cloud", trains=True)
    async with running_ingestion(settings) as cloud, running(agent):
        await eventually(lambda: cloud.registry.get("a100-7") is not None)
        desired = DesiredState(
            node_id="a100-7",
            generation=1,
            issued_at=1.0,
            training=(
                DesiredTraining(
                    job_id="llm-ft",
                    accelerator_ids=("gpu0", "gpu1"),
                    rank=0,
                    world_size=2,
                    master_addr="a100-7",
                    master_port=29500,
                    reference_duration_s=0.3,
                ),
            ),
        )
        await publish_desired(broker.url, topic_root, desired)
        await eventually(
            lambda: training_states(cloud.registry.get("a100-7")) == {("llm-ft", 0): "running"}
        )
        await eventually(
            lambda: training_states(cloud.registry.get("a100-7")) == {("llm-ft", 0): "succeeded"}
        )
        record = cloud.registry.get("a100-7")
        assert record is not None
        assert record.reported is not None
        assert record.reported.observed_generation == 1
        kinds = [(e.kind, e.subject) for e in cloud.events if e.subject == "llm-ft"]
        assert kinds == [("started", "llm-ft"), ("exited", "llm-ft")]
        await eventually(
            lambda: (
                "finished with exit code 0"
                in "".join(c.text for c in cloud.logs if c.job_id == "llm-ft")
            )
        )


async def test_a_capped_worker_reports_its_power_limit_and_its_gpu_draws_no_more(
    broker: BrokerUnderTest, topic_root: str
) -> None:
    settings = mqtt_settings(broker.url, topic_root)
    agent = simulated_agent("a100-8", settings, "a100-4x", site="cloud", trains=True)
    async with running_ingestion(settings) as cloud, running(agent):
        await eventually(lambda: cloud.registry.get("a100-8") is not None)
        worker = DesiredTraining(
            job_id="capped",
            accelerator_ids=("gpu0",),
            reference_duration_s=60.0,
            power_limit_w=120.0,
        )
        await publish_desired(
            broker.url,
            topic_root,
            DesiredState(node_id="a100-8", generation=1, issued_at=1.0, training=(worker,)),
        )

        def report() -> ReportedTraining | None:
            record = cloud.registry.get("a100-8")
            return record.training_report("capped", 0) if record is not None else None

        await eventually(lambda: (r := report()) is not None and r.power_limit_w == 120.0)
        assert (r := report()) is not None
        assert (r.state, r.power_limit_note) == ("running", "")
        # Telemetry sampled after the limit took hold shows the GPU under it (one round
        # more than the last one here, which may have been under way as it was set).
        record = cloud.registry.get("a100-8")
        assert record is not None
        seen_seq = record.telemetry.seq + 1 if record.telemetry is not None else 0
        gpu0_power_w: list[float] = []

        def sampled() -> bool:
            nonlocal seen_seq
            record = cloud.registry.get("a100-8")
            telemetry = record.telemetry if record is not None else None
            if telemetry is not None and telemetry.seq > seen_seq:
                seen_seq = telemetry.seq
                gpu0_power_w.extend(
                    a.power_w for a in telemetry.accelerators if a.id == "gpu0" and a.power_w
                )
            return len(gpu0_power_w) >= 3

        await eventually(sampled)
        assert max(gpu0_power_w) <= 120.0 + 0.001


async def test_a_real_worker_process_is_stopped_when_the_cloud_withdraws_it(
    broker: BrokerUnderTest, topic_root: str, tmp_path: Path
) -> None:
    settings = mqtt_settings(broker.url, topic_root)
    agent = simulated_agent(
        "v100-3",
        settings,
        "v100-8x",
        site="cloud",
        training_launcher=plain_launchers(tmp_path),
    )
    command = (sys.executable, "-c", "import time; print('epoch 1', flush=True); time.sleep(120)")
    async with running_ingestion(settings) as cloud, running(agent):
        await eventually(lambda: cloud.registry.get("v100-3") is not None)
        worker = DesiredTraining(
            job_id="resnet", command=command, accelerator_ids=("gpu3",), grace_period_s=1.0
        )
        await publish_desired(
            broker.url,
            topic_root,
            DesiredState(node_id="v100-3", generation=1, issued_at=1.0, training=(worker,)),
        )
        await eventually(
            lambda: training_states(cloud.registry.get("v100-3")) == {("resnet", 0): "running"}
        )
        log = tmp_path / "jobs" / "resnet-0.log"
        await eventually(lambda: log.exists() and "epoch 1" in log.read_text())
        # The same output reaches the cloud over the logs channel.
        await eventually(
            lambda: any(c.job_id == "resnet" and "epoch 1" in c.text for c in cloud.logs)
        )
        first = next(c for c in cloud.logs if c.job_id == "resnet")
        assert (first.node_id, first.attempt, first.offset, first.dropped_bytes) == (
            "v100-3",
            0,
            0,
            0,
        )
        # Withdrawn (cancelled): the process is stopped and the node reports nothing running.
        await publish_desired(
            broker.url, topic_root, DesiredState(node_id="v100-3", generation=2, issued_at=2.0)
        )
        await eventually(
            lambda: (
                (r := cloud.registry.get("v100-3")) is not None
                and r.reported is not None
                and r.reported.observed_generation == 2
                and r.reported.training == ()
            )
        )
        await eventually(
            lambda: any(e.subject == "resnet" and e.kind == "exited" for e in cloud.events)
        )
        stopped = [e for e in cloud.events if e.subject == "resnet" and e.kind == "exited"]
        assert stopped[0].detail == "stopped: withdrawn by the cloud"
