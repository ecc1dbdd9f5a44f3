"""The agent runs with only the `edge` extra installed: no database stack, ever; and
until a node is given an inference deployment, no web server, numpy or ONNX Runtime
either (they are loaded with the first deployment). A child interpreter that refuses
to import those proves it; and what an idle agent and its supervisor do import is
listed, so that a heavy import coming back is seen (the footprint itself is measured by
benchmarks/agent_footprint.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from shared.desired_signature import public_key_base64, sign_desired
from shared.ed25519 import system_libcrypto_checker
from shared.messages import DesiredState

ROOT = Path(__file__).resolve().parent.parent.parent
CLOUD_ONLY_MODULES = [
    "sqlalchemy",
    "asyncpg",
    "aiosqlite",
    "numpy",
    "prometheus_client",
    "rich",
    "amqtt",
    "aiohttp",
    "onnxruntime",
]

BLOCKER = f"""
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {CLOUD_ONLY_MODULES!r}:
            raise ImportError(f"the edge agent imported {{name}}")
        return None
sys.meta_path.insert(0, Refuse())
"""


def test_the_edge_extra_does_not_pull_the_cloud_stack() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    edge = " ".join(project["optional-dependencies"]["edge"] + project["dependencies"]).lower()
    for package in ("sqlalchemy", "asyncpg", "aiosqlite", "prometheus", "rich", "amqtt"):
        assert package not in edge


def test_discovery_and_the_agent_import_nothing_from_the_cloud_stack() -> None:
    script = BLOCKER + (
        "import edge.agent, edge.main\n"
        "from greenfed.cli import main\n"
        "raise SystemExit(main(['edge', 'discover', '--json']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert '"kind": "cpu"' in result.stdout


def modules_imported_by(script: str, stdin: bytes = b"") -> list[str]:
    """The modules a child interpreter that refuses the cloud's imported for `script`,
    beyond its own start (a coverage or .pth hook's imports are not the code's)."""
    prologue = BLOCKER + "import json, sys\n_before = set(sys.modules)\n"
    epilogue = "\nprint(json.dumps(sorted(set(sys.modules) - _before)))\n"
    result = subprocess.run(
        [sys.executable, "-c", prologue + script + epilogue],
        input=stdin,
        capture_output=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr.decode()
    modules: list[str] = json.loads(result.stdout.decode().splitlines()[-1])
    return modules


def test_an_enrolled_idle_agent_imports_neither_cryptography_nor_importlib_metadata() -> None:
    """What an enrolled agent with nothing to run imports, its desired document verified:
    not cryptography (7 MB: the interpreter's own libcrypto checks Ed25519,
    shared/ed25519.py), nor importlib.metadata (shared/__init__.py reads the version),
    nor the whole command line, nor argparse, nor paho's `urllib.request`
    (edge/deferred_imports.py), nor psutil (/proc is read)."""
    if system_libcrypto_checker() is None:
        pytest.skip("no libcrypto with Ed25519 mapped here: cryptography checks instead")
    key = Ed25519PrivateKey.generate()
    document = DesiredState(node_id="n1", generation=1, issued_at=1.0)
    script = (
        # As `python -m greenfed edge run` runs the agent (greenfed/__main__.py): the
        # stand-ins first, then its command line.
        "from edge.deferred_imports import defer_imports\n"
        "defer_imports()\n"
        "import greenfed.edge_run\n"
        "assert greenfed.edge_run.parse_plainly(['--config', 'agent.toml']) is not None\n"
        "import edge.agent, edge.main\n"
        "from shared.desired_signature import load_public_key, verify_desired\n"
        f"key = load_public_key({public_key_base64(key)!r})\n"
        "assert verify_desired(sys.stdin.buffer.read(), key).generation == 1\n"
        # Deferred (edge/deferred_imports.py): a stand-in, or not imported at all (unless
        # this test's prologue imported it: importlib.abc imports pathlib).
        "for name in {'ipaddress', 'stringprep', 'locale', 'textwrap', 'tokenize'} - _before:\n"
        "    assert type(sys.modules.get(name, sys)).__name__ != 'module', name\n"
    )
    imported = modules_imported_by(script, stdin=sign_desired(document, key))
    assert "edge.agent.core" in imported
    assert [name for name in imported if name.split(".")[0] == "cryptography"] == []
    assert "importlib.metadata" not in imported
    assert "greenfed.cli" not in imported  # the agent's command line is greenfed/edge_run.py
    # Nor what paho's proxy lookup, argparse's help and tempfile bring (issue 28), nor
    # structlog (shared/lean_logs.py), nor the supervisor's module.
    unused = {"argparse", "http.client", "email.message", "tempfile", "shutil", "psutil"}
    unused |= {"structlog", "edge.upgrade.supervisor"}
    assert sorted(unused & set(imported)) == []


def test_the_upgrade_supervisor_imports_a_few_standard_modules() -> None:
    """The supervisor runs as long as the agent: the standard library only, and none of
    its heavier modules (argparse, dataclasses and its inspect, typing, ctypes.util)."""
    imported = modules_imported_by("import edge.upgrade.supervisor\n")
    assert "edge.upgrade.versions" in imported
    foreign = [
        name
        for name in imported
        if name.split(".")[0] not in sys.stdlib_module_names and name.split(".")[0] != "edge"
    ]
    assert foreign == []
    assert {"edge", "edge.upgrade", "edge.upgrade.supervisor", "edge.upgrade.versions"} >= {
        name for name in imported if name.startswith("edge")
    } - {"edge.atomic_files"}
    heavy = {"argparse", "dataclasses", "inspect", "typing", "ctypes.util", "importlib.metadata"}
    assert sorted(heavy & set(imported)) == []


def test_the_agents_command_line_is_greenfed_edge_run_as_the_whole_one_reads_it(
    tmp_path: Path,
) -> None:
    """`python -m greenfed edge run` (how the supervisor starts the agent) is parsed
    without the whole command line, to the same help and the same errors."""

    def run(*command: str) -> tuple[int, str, str]:
        result = subprocess.run(
            [sys.executable, *command], capture_output=True, text=True, cwd=tmp_path, timeout=60
        )
        return result.returncode, result.stdout, result.stderr

    whole = ["-c", "import sys; from greenfed.cli import main; sys.exit(main(sys.argv[1:]))"]
    missing = str(tmp_path / "missing.toml")
    for arguments in (["--help"], ["--config", missing], ["--telemetry-interval", "0"]):
        alone = run("-m", "greenfed", "edge", "run", *arguments)
        assert alone == run(*whole, "edge", "run", *arguments)
        assert alone[0] == (0 if arguments == ["--help"] else 2)


def test_a_deferred_module_is_imported_on_its_first_use() -> None:
    """paho-mqtt imports `urllib.request` (http.client, email) for a proxy lookup an agent
    never makes: its stand-in imports it only when something of it is asked for."""
    script = (
        "from edge.deferred_imports import defer_imports\n"
        "defer_imports(('urllib.request', 'no_such_module_here'))\n"
        "import paho.mqtt.client, urllib.request\n"
        "assert 'http.client' not in sys.modules\n"
        "assert 'no_such_module_here' not in sys.modules\n"
        "from urllib.request import getproxies\n"
        "assert 'http.client' in sys.modules\n"
        "assert sys.modules['urllib.request'] is urllib.request\n"
        "assert paho.mqtt.client.urllib.request.getproxies is getproxies\n"
    )
    imported = modules_imported_by(script)
    assert "urllib.request" in imported


def test_the_agents_other_deferred_modules_load_where_they_are_first_used() -> None:
    """`ipaddress`, `stringprep`, `locale`, `textwrap` and `tokenize`, deferred before
    anything imports them (greenfed/__main__.py), are real modules where the agent would
    use them (a traceback's source lines: tokenize)."""
    script = (
        "from edge.deferred_imports import defer_imports\n"
        "defer_imports()\n"
        "import pathlib, subprocess, textwrap, traceback, urllib.parse\n"
        "import msgspec.json, paho.mqtt.client\n"
        "real = {n for n in ('ipaddress', 'stringprep', 'locale', 'textwrap', 'tokenize')\n"
        "        if type(sys.modules.get(n)).__name__ == 'module'}\n"
        "assert real == set(), real\n"
        "assert urllib.parse.urlsplit('mqtt://[::1]:1883').hostname == '::1'\n"
        "try:\n"
        "    urllib.parse.urlsplit('mqtt://[127.0.0.1]:1883')\n"
        "except ValueError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('ipaddress did not check the bracketed host')\n"
        "assert 'bücher.example'.encode('idna') == b'xn--bcher-kva.example'\n"
        "run = subprocess.run([sys.executable, '-c', 'print(7)'], capture_output=True, text=True)\n"
        "assert run.stdout == '7\\n'\n"
        "assert textwrap.dedent('  a\\n  b') == 'a\\nb'\n"
        "try:\n"
        "    pathlib.Path('/no/such/file').read_text()\n"
        "except OSError as error:\n"
        "    lines = traceback.format_exception(error)\n"
        "assert any('pathlib.py' in line and 'open' in line for line in lines), lines\n"
        "for name in ('ipaddress', 'stringprep', 'locale', 'textwrap', 'tokenize'):\n"
        "    assert type(sys.modules[name]).__name__ == 'module', name\n"
        "print('used')\n"
    )
    # A plain interpreter, as the agent's starts: nothing has imported them yet.
    result = subprocess.run(
        [sys.executable, "-c", "import sys\n" + script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "used"


@pytest.mark.parametrize(
    "arguments",
    [
        [],
        ["--config", "agent.toml"],
        ["--config=agent.toml", "--no-supervisor"],
        ["--mqtt-url", "mqtts://user:secret@broker:8883", "--log-level", "debug"],
        ["--log-format", "json", "--telemetry-interval", "2.5", "--config", "a", "--config", "b"],
    ],
)
def test_the_agents_plain_command_line_reads_as_argparse_does(arguments: list[str]) -> None:
    import argparse

    from greenfed.edge_run import add_edge_run_options, parse_plainly

    parser = argparse.ArgumentParser()
    add_edge_run_options(parser)
    assert parse_plainly(arguments) == vars(parser.parse_args(arguments))


@pytest.mark.parametrize(
    "arguments",
    [
        ["--help"],
        ["-h"],
        ["--conf", "agent.toml"],  # argparse's abbreviation
        ["--config"],
        ["--config="],
        ["--config", "--no-supervisor"],
        ["--no-supervisor=yes"],
        ["--telemetry-interval", "0"],
        ["--telemetry-interval", "-1"],
        ["--mqtt-url", "http://broker"],
        ["--log-level", "verbose"],
        ["--", "--config", "agent.toml"],
        ["stray"],
    ],
)
def test_anything_else_is_left_to_argparse(arguments: list[str]) -> None:
    from greenfed.edge_run import parse_plainly

    assert parse_plainly(arguments) is None
