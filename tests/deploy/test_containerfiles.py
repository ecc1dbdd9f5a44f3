"""The container images' definitions, deploy/containers/Containerfile.{cloud,agent},
read instruction by instruction (no image is built here: see docs/deploy.md#containers
for why and for what was built by hand): multi-stage from one base, the wheel built
from the checkout with a real extra, a non-root numeric USER, every COPY'd file present
and inside the build context .dockerignore leaves, the settings they set real, the
command one greenfed parses, and the control plane's HEALTHCHECK asking a real route
through deploy/containers/healthcheck.py (which is run here against a small server)."""

from __future__ import annotations

import fnmatch
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from greenfed.cli import build_parser
from tests.deploy.deploy_files import CONTAINERS, DEFAULTS, REPO, api_routes, assert_real_settings

CLOUD = CONTAINERS / "Containerfile.cloud"
AGENT = CONTAINERS / "Containerfile.agent"
HEALTHCHECK_SCRIPT = CONTAINERS / "healthcheck.py"
IMAGE_UID = 10001


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str
    line: int

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form CMD, ENTRYPOINT or HEALTHCHECK CMD, else None."""
        text = self.arguments
        if self.keyword == "HEALTHCHECK":
            text = text.split(" CMD ", 1)[1] if " CMD " in text else ""
        text = text.strip()
        if not text.startswith("["):
            return None
        parsed = json.loads(text)
        assert isinstance(parsed, list)
        return [str(part) for part in parsed]


def instructions(path: Path) -> list[Instruction]:
    """The file's instructions, continuation lines joined and comments dropped."""
    found: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if not pending:
            start = number
        continued = line.endswith("\\")
        pending.append(line[:-1].strip() if continued else line)
        if not continued:
            text = " ".join(part for part in pending if part)
            keyword, _, arguments = text.partition(" ")
            found.append(Instruction(keyword.upper(), arguments.strip(), start))
            pending = []
    assert not pending, f"{path.name}: a continuation line ends the file"
    return found


def stages(found: list[Instruction]) -> list[list[Instruction]]:
    """The instructions of each stage, FROM first."""
    result: list[list[Instruction]] = []
    for instruction in found:
        if instruction.keyword == "FROM":
            result.append([])
        if result:
            result[-1].append(instruction)
    return result


def _matches(path: str, pattern: str) -> bool:
    """.dockerignore matching: the pattern matches the path or one of its parents."""
    pattern = pattern.rstrip("/")
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: index + 1]) for index in range(len(parts))]
    if pattern.startswith("**/"):
        tail = pattern[3:]
        return any(
            fnmatch.fnmatchcase("/".join(parts[index : stop + 1]), tail)
            for index in range(len(parts))
            for stop in range(index, len(parts))
        )
    return any(fnmatch.fnmatchcase(candidate, pattern) for candidate in candidates)


def in_build_context(path: str) -> bool:
    """Whether the repository-root build context keeps `path` (last matching line wins)."""
    kept = True
    for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        if _matches(path, line.lstrip("!")):
            kept = negated
    return kept


@pytest.fixture(params=[CLOUD, AGENT], ids=["cloud", "agent"])
def containerfile(request: pytest.FixtureRequest) -> Path:
    path: Path = request.param
    return path


def test_two_stages_from_one_base_named_by_an_argument(containerfile: Path) -> None:
    found = instructions(containerfile)
    assert found[0].keyword == "ARG"
    name, _, default = found[0].arguments.partition("=")
    # A base with the Python CI tests on, pinned to a release of Debian (bookworm).
    assert re.fullmatch(r"docker\.io/library/python:3\.11-slim-bookworm", default)
    build, final = stages(found)
    assert build[0].arguments == f"${{{name}}} AS build"
    # The final stage runs on the same base: the environment's interpreter path holds.
    assert final[0].arguments == f"${{{name}}}"
    copied = [i.arguments for i in final if i.keyword == "COPY" and "--from=build" in i.arguments]
    assert copied == ["--from=build /opt/greenfed/venv /opt/greenfed/venv"]


def test_the_wheel_is_built_from_the_checkout_with_a_real_extra(containerfile: Path) -> None:
    build = stages(instructions(containerfile))[0]
    runs = " ".join(i.arguments for i in build if i.keyword == "RUN")
    assert "pip wheel --no-deps --wheel-dir /wheels /src" in runs
    extras = re.findall(r'"\$\{wheel\}\[([a-z,]+)\]"', runs)
    assert len(extras) == 1
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    optional = pyproject["project"]["optional-dependencies"]
    expected = "cloud" if containerfile == CLOUD else "edge"
    assert extras[0] == expected
    assert expected in optional
    # Everything the wheel target packs is copied into the build stage.
    packages = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    copied = {i.arguments.split()[0].rstrip("/") for i in build if i.keyword == "COPY"}
    assert set(packages) <= copied
    assert {"pyproject.toml", "README.md"} <= {
        part for i in build if i.keyword == "COPY" for part in i.arguments.split()[:-1]
    }


def test_every_copied_file_exists_and_is_in_the_build_context(containerfile: Path) -> None:
    for instruction in instructions(containerfile):
        if instruction.keyword != "COPY" or instruction.arguments.startswith("--from="):
            continue
        *sources, _destination = instruction.arguments.split()
        for source in sources:
            assert (REPO / source).exists(), f"{containerfile.name}:{instruction.line}: {source}"
            assert in_build_context(source), f"{source} is left out by .dockerignore"
            if (REPO / source).is_dir():
                some_file = next(p for p in (REPO / source).rglob("*.py"))
                assert in_build_context(str(some_file.relative_to(REPO)))


def test_the_build_context_leaves_out_what_an_image_must_not_hold() -> None:
    for path in (".venv/bin/python", ".git/config", "dist/SHA256SUMS", "tests/conftest.py",
                 "cloud/__pycache__/app.cpython-311.pyc", "data/greenfed.db"):  # fmt: skip
        assert not in_build_context(path), path


def test_it_runs_as_a_numeric_non_root_user(containerfile: Path) -> None:
    final = stages(instructions(containerfile))[-1]
    users = [i.arguments for i in final if i.keyword == "USER"]
    assert users == [f"{IMAGE_UID}:{IMAGE_UID}"]
    # ... which exists, owning its data directory.
    runs = " ".join(i.arguments for i in final if i.keyword == "RUN")
    assert f"--uid {IMAGE_UID} --gid {IMAGE_UID}" in runs
    assert f"install -d -o {IMAGE_UID} -g {IMAGE_UID} -m 0700 /var/lib/greenfed" in runs


def _environment(path: Path) -> dict[str, str]:
    final = stages(instructions(path))[-1]
    text = " ".join(i.arguments for i in final if i.keyword == "ENV")
    return dict(re.findall(r"([A-Z_][A-Z0-9_]*)=(\S+)", text))


def test_its_settings_are_real(containerfile: Path) -> None:
    environment = _environment(containerfile)
    assert_real_settings(environment)
    assert environment["GREENFED_LOG__FORMAT"] == "json"


def test_the_command_is_one_greenfed_parses(containerfile: Path) -> None:
    final = stages(instructions(containerfile))[-1]
    (entrypoint,) = [i.exec_form() for i in final if i.keyword == "ENTRYPOINT"]
    (command,) = [i.exec_form() for i in final if i.keyword == "CMD"]
    assert entrypoint == ["greenfed"]
    assert command is not None
    parsed = build_parser().parse_args(command)
    expected = "cmd_cloud" if containerfile == CLOUD else "cmd_edge_run"
    assert parsed.handler.__name__ == expected


def test_the_exposed_port_is_the_default_one(containerfile: Path) -> None:
    final = stages(instructions(containerfile))[-1]
    exposed = [i.arguments for i in final if i.keyword == "EXPOSE"]
    port = DEFAULTS.cloud.api_port if containerfile == CLOUD else DEFAULTS.agent.inference_port
    assert exposed == [str(port)]


def test_the_control_plane_checks_its_health_on_a_real_route() -> None:
    final = stages(instructions(CLOUD))[-1]
    (check,) = [i for i in final if i.keyword == "HEALTHCHECK"]
    command = check.exec_form()
    assert command is not None
    program, script, path = command
    assert program == "python"
    copies = [i.arguments.split() for i in final if i.keyword == "COPY"]
    assert ["deploy/containers/healthcheck.py", script] in copies
    assert path in api_routes()
    assert path == "/healthz"
    # The script's default port is the API's.
    assert f'DEFAULT_API_PORT = "{DEFAULTS.cloud.api_port}"' in HEALTHCHECK_SCRIPT.read_text()


def test_the_agent_has_no_healthcheck() -> None:
    # It serves HTTP only once a deployment arrives (Containerfile.agent says so).
    assert not [i for i in instructions(AGENT) if i.keyword == "HEALTHCHECK"]


class _HealthServer(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status = {"/healthz": 200, "/readyz": 503}.get(self.path, 404)
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HealthServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def _check(port: int, *path: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "GREENFED_CLOUD__API_PORT": str(port)}
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK_SCRIPT), *path],
        env=environment, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def test_the_healthcheck_script_says_what_the_api_answers(health_server: int) -> None:
    assert _check(health_server).returncode == 0
    assert _check(health_server, "/healthz").returncode == 0
    not_ready = _check(health_server, "/readyz")
    assert not_ready.returncode == 1
    assert "HTTP 503" in not_ready.stderr


def test_the_healthcheck_script_fails_when_nothing_listens() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    refused = _check(closed_port)
    assert refused.returncode == 1
    assert f"127.0.0.1:{closed_port}" in refused.stderr
