"""`greenfed sim --processes N`: one fleet split over processes, every node run exactly once."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from sim_devices.fleet import expand_fleet, load_fleet, scale_fleet
from sim_devices.processes import child_arguments
from sim_devices.runner import Shard, SimulatedFleet
from tests.support.brokers import BrokerUnderTest
from tests.support.fleet import mqtt_settings, running_ingestion
from tests.support.processes import GreenfedProcess, greenfed_env
from tests.support.waiting import eventually

FLEET = scale_fleet(load_fleet(), 23)
SETTINGS = mqtt_settings("mqtt://127.0.0.1:1", "gftest-shards")


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_shards_run_every_node_of_the_fleet_once_in_balanced_parts(count: int) -> None:
    shards = [SimulatedFleet(FLEET, SETTINGS, shard=Shard(i, count)) for i in range(count)]
    run = Counter(agent.identity.node_id for shard in shards for agent in shard.agents)
    assert run == Counter(spec.node_id for spec in expand_fleet(FLEET))
    sizes = [len(shard.agents) for shard in shards]
    assert max(sizes) - min(sizes) <= 1


def test_a_node_is_the_same_whichever_shard_runs_it() -> None:
    whole = {
        agent.identity.node_id: agent.identity for agent in SimulatedFleet(FLEET, SETTINGS).agents
    }
    for index in range(3):
        for agent in SimulatedFleet(FLEET, SETTINGS, shard=Shard(index, 3)).agents:
            assert agent.identity == whole[agent.identity.node_id]


@pytest.mark.parametrize(("index", "count"), [(-1, 2), (2, 2), (0, 0)])
def test_a_shard_lies_within_its_count(index: int, count: int) -> None:
    with pytest.raises(ValueError, match="shard"):
        Shard(index, count)


def test_each_child_gets_its_shard_and_a_share_of_the_connect_rate() -> None:
    argv = ["sim", "--sim", "100", "--processes", "4", "--connect-rate", "400"]
    assert child_arguments(argv, 2, 4, 400.0)[len(argv) :] == [
        "--shard",
        "2/4",
        "--connect-rate",
        "100.0",
    ]


STOPPED = re.compile(r"simulated fleet: (\d+) nodes stopped, (\d+) telemetry messages sent")


@pytest.mark.e2e
async def test_a_fleet_split_over_processes_comes_online_once_and_stops_cleanly(
    broker: BrokerUnderTest, topic_root: str, tmp_path: Path
) -> None:
    # Group names unique per test: node ids name MQTT client ids on the shared broker.
    suffix = topic_root.removeprefix("gftest-")[:8]
    fleet_file = tmp_path / "fleet.toml"
    fleet_file.write_text(
        f'[[group]]\nname = "pi-{suffix}"\nprofile = "raspberry-pi-5"\ncount = 5\n'
        'site = "edge"\nzone = "DE"\nregion = "europe-west3"\n'
        f'[[group]]\nname = "t4-{suffix}"\nprofile = "t4-inference-server"\ncount = 2\n'
        'site = "cloud"\nzone = "DE"\nregion = "europe-west3"\n'
    )
    expected = {spec.node_id for spec in expand_fleet(load_fleet(fleet_file))}
    async with running_ingestion(mqtt_settings(broker.url, topic_root)) as cloud:
        sim = GreenfedProcess(
            [
                "sim",
                "--fleet",
                str(fleet_file),
                "--mqtt-url",
                broker.url,
                "--processes",
                "3",
                "--telemetry-interval",
                "0.2",
                "--log-level",
                "error",
            ],
            tmp_path,
            greenfed_env(GREENFED_MQTT__TOPIC_ROOT=topic_root),
        )
        async with sim:

            def online() -> set[str]:
                return {r.node_id for r in cloud.registry.nodes() if r.state == "online"}

            await eventually(
                lambda: online() == expected and "(3 processes)" in sim.stdout,
                timeout_s=40,
                message=lambda: f"online {sorted(online())}; {sim.stdout}{sim.stderr[-2000:]}",
            )
            # A few telemetry rounds from every node.
            await eventually(
                lambda: all(
                    (r.telemetry.seq if r.telemetry else 0) >= 3 for r in cloud.registry.nodes()
                ),
                timeout_s=20,
            )
            code, _ = await sim.stop(timeout_s=20)
            assert code == 0, sim.stderr[-2000:]

        assert cloud.registry.instance_conflicts == 0  # no node ran in two processes
        stopped = STOPPED.search(sim.stdout)
        assert stopped is not None, sim.stdout
        assert int(stopped[1]) == len(expected)
        # What the shards say they sent is what arrived: the benchmark's loss count.
        await eventually(
            lambda: cloud.ingestor.stats.ingested["telemetry"] == int(stopped[2]),
            timeout_s=10,
            message=lambda: f"{cloud.ingestor.stats.ingested} {cloud.ingestor.stats.invalid}",
        )
        await eventually(
            lambda: all(r.state == "offline" for r in cloud.registry.nodes()), timeout_s=10
        )


@pytest.mark.e2e
async def test_a_fleet_smaller_than_its_processes_runs_one_process_per_node_until_stopped(
    broker: BrokerUnderTest, topic_root: str, tmp_path: Path
) -> None:
    # A process with no node of its own has nothing to run and would end at once, and a
    # child that ends stops the fleet: `--sim 2 --processes 4` used to stop by itself.
    suffix = topic_root.removeprefix("gftest-")[:8]
    fleet_file = tmp_path / "fleet.toml"
    fleet_file.write_text(
        f'[[group]]\nname = "pi-{suffix}"\nprofile = "raspberry-pi-5"\ncount = 2\n'
        'site = "edge"\nzone = "DE"\nregion = "europe-west3"\n'
    )
    expected = {spec.node_id for spec in expand_fleet(load_fleet(fleet_file))}
    async with running_ingestion(mqtt_settings(broker.url, topic_root)) as cloud:
        sim = GreenfedProcess(
            [
                "sim",
                "--fleet",
                str(fleet_file),
                "--mqtt-url",
                broker.url,
                "--processes",
                "4",
                "--telemetry-interval",
                "0.2",
                "--log-level",
                "error",
            ],
            tmp_path,
            greenfed_env(GREENFED_MQTT__TOPIC_ROOT=topic_root),
        )
        async with sim:

            def online() -> set[str]:
                return {r.node_id for r in cloud.registry.nodes() if r.state == "online"}

            assert sim.process is not None
            process = sim.process

            def ended() -> bool:
                return process.returncode is not None

            await eventually(
                lambda: (online() == expected and "(2 processes)" in sim.stdout) or ended(),
                timeout_s=40,
                message=lambda: f"online {sorted(online())}; {sim.stdout}{sim.stderr[-2000:]}",
            )
            # Still running a few telemetry rounds later, until stopped.
            await eventually(
                lambda: (
                    ended()
                    or all(
                        (r.telemetry.seq if r.telemetry else 0) >= 3 for r in cloud.registry.nodes()
                    )
                ),
                timeout_s=20,
            )
            assert not ended(), sim.stdout + sim.stderr[-2000:]
            code, _ = await sim.stop(timeout_s=20)
            assert code == 0, sim.stderr[-2000:]
        stopped = STOPPED.search(sim.stdout)
        assert stopped is not None, sim.stdout
        assert int(stopped[1]) == len(expected)
