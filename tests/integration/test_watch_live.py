"""`greenfed apply`, `greenfed job NAME --watch` and `greenfed events -f` against a live
control plane whose job a real agent runs (simulated GPUs, the real Mosquitto): the
watch ends by itself when the agent reports the job succeeded, and the event stream
printed every step (SQLite and PostgreSQL)."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import fleet
from tests.support.processes import GreenfedProcess, greenfed_env, run_greenfed
from tests.support.waiting import eventually


async def test_a_watch_ends_when_a_real_agent_finishes_the_job(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str], tmp_path: Path
) -> None:
    async with fleet(database, mosquitto_root, cloud_nodes=1) as running:
        token = await running.api.tenant("acme")
        api = str(running.api.client.make_url("/")).rstrip("/")
        spec = tmp_path / "short.toml"
        spec.write_text(
            'kind = "training"\nname = "short"\ncommand = ["python", "train.py"]\n'
            "accelerators_per_worker = 1\nestimated_duration_s = 2.0\n"
        )
        client = ["--api", api, "--token", token]
        env = greenfed_env()
        events = GreenfedProcess(["events", "-f", "--since", "1h", *client], tmp_path, env)
        watch = GreenfedProcess(["job", "short", "--watch", *client], tmp_path, env)
        code, out, err = await run_greenfed(["apply", "-f", str(spec), *client], env=env)
        assert code == 0, err
        assert out.startswith("job short created: ")
        async with events, watch:
            # Placed, run by the agent and ended: the watch drew it succeeded, then ended.
            assert await watch.wait(timeout_s=90) == 0, watch.stderr
            assert "succeeded" in watch.stdout
            await eventually(
                lambda: "running -> succeeded" in events.stdout,
                timeout_s=30,
                message=lambda: events.stdout + events.stderr,
            )
            assert "pending -> scheduled" in events.stdout
            code, _ = await events.stop(signal.SIGINT)
            assert code == 130
            assert "Traceback" not in events.stderr + watch.stderr


async def test_the_log_of_a_deployment_shows_its_replicas_as_real_agents_report_them(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str], tmp_path: Path
) -> None:
    async with fleet(database, mosquitto_root, edge_nodes=1) as running:
        api = running.api
        token = await api.tenant("vision")
        model_id = await api.model(token)
        spec = tmp_path / "serve.toml"
        spec.write_text(
            f'kind = "deployment"\nname = "detector"\nmodel_id = "{model_id}"\nreplicas = 1\n'
        )
        client = ["--api", str(api.client.make_url("/")).rstrip("/"), "--token", token]
        env = greenfed_env()
        follow = GreenfedProcess(["logs", "detector", "-f", *client], tmp_path, env)
        code, _, err = await run_greenfed(["apply", "-f", str(spec), *client], env=env)
        assert code == 0, err
        async with follow:
            # The agent loads the model and reports the replica ready: the followed log
            # prints it, after the deployment's own events.
            await eventually(
                lambda: "[orin-0] replica 0: ready on " in follow.stdout,
                timeout_s=60,
                message=lambda: follow.stdout + follow.stderr,
            )
            assert "work.state  submitted -> pending" in follow.stdout
            code, out, err = await run_greenfed(
                ["logs", "detector", "--replica", "0", *client], env=env
            )
            assert code == 0, err
            assert out.count("\n") == 1
            assert "[orin-0] replica 0: ready on " in out
            # Cancelled: the followed log prints the end and stops by itself.
            code, _, err = await run_greenfed(["cancel", "detector", *client], env=env)
            assert code == 0, err
            assert await follow.wait(timeout_s=30) == 0, follow.stderr
            assert "-> cancelled: cancelled by the tenant" in follow.stdout
