"""Running `greenfed` as a separate process, as a person or a service manager would."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import aiohttp


def greenfed_env(**variables: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GREENFED_")}
    env.update(variables)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _sigint_as_default() -> None:
    """In the child, before it runs: SIGINT back to its default. A suite started in the
    background (`bash .ci/run &` from a script, as sh does for any `&` job) passes
    SIGINT on as ignored, Python then leaves it ignored, and the Ctrl-C a test sends to
    a command that relies on Python's own (`greenfed events -f`) would never arrive: the
    test would hang. (`greenfed up` and the agents install their handlers themselves.)"""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class GreenfedProcess:
    def __init__(self, args: list[str], workdir: Path, env: dict[str, str] | None = None) -> None:
        self.args = [sys.executable, "-m", "greenfed.cli", *args]
        self.env = env or greenfed_env()
        self.stdout_path = workdir / f"greenfed-{args[0]}-{id(self)}.out"
        self.stderr_path = workdir / f"greenfed-{args[0]}-{id(self)}.err"
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> GreenfedProcess:
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.process = await asyncio.create_subprocess_exec(
                *self.args, stdout=out, stderr=err, env=self.env, preexec_fn=_sigint_as_default
            )
        return self

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    async def stop(
        self, signum: int = signal.SIGTERM, timeout_s: float = 10.0
    ) -> tuple[int, float]:
        """Send `signum`; return (exit code, seconds until exit)."""
        assert self.process is not None
        started = time.monotonic()
        if self.process.returncode is None:
            self.process.send_signal(signum)
        try:
            returncode = await asyncio.wait_for(self.process.wait(), timeout_s)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
            raise AssertionError(f"{self.args} did not exit within {timeout_s} s") from None
        return returncode, time.monotonic() - started

    async def wait(self, timeout_s: float = 60.0) -> int:
        assert self.process is not None
        return await asyncio.wait_for(self.process.wait(), timeout_s)

    async def __aenter__(self) -> GreenfedProcess:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


async def run_greenfed(
    args: list[str], env: dict[str, str] | None = None, timeout_s: float = 60.0
) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "greenfed.cli",
        *args,
        env=env or greenfed_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


async def get_json(url: str, token: str | None = None) -> object:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(headers=headers) as http, http.get(url) as response:
        response.raise_for_status()
        return await response.json()
