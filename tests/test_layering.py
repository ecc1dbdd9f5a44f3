"""Imports run in the intended direction only (the layout of the handbook's
architecture map and the package docstrings).

Read from the source with `ast`, so a lazy import inside a function counts as much
as one at the top of a module; only `if TYPE_CHECKING:` blocks are left out, since
they never run.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
    )


def _imports(tree: ast.AST) -> Iterator[str]:
    for node in ast.iter_child_nodes(tree):
        if _is_type_checking_block(node):
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            # `from cloud import api` imports the module cloud.api
            yield from (f"{node.module}.{alias.name}" for alias in node.names)
        yield from _imports(node)


def imports_of(package: str) -> dict[str, set[str]]:
    """Module path -> every module it imports, for each file under `package`."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        found[str(path.relative_to(ROOT))] = set(_imports(tree))
    return found


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


# (files under, that may not import, why)
RULES = [
    ("shared", ("cloud", "edge", "greenfed", "sim_devices"), "shared is imported by every role"),
    ("cloud", ("edge", "greenfed"), "the control plane runs without the agent or the CLI"),
    ("edge", ("cloud", "greenfed"), "the agent installs without the cloud stack"),
    ("sim_devices", ("cloud", "greenfed"), "simulated devices swap probes, not logic"),
    (
        "cloud/scheduler",
        ("cloud.api", "cloud.store", "cloud.loop", "cloud.green", "cloud.signals", "cloud.fleet"),
        "the scheduler core is pure: extensions reach it through its hooks",
    ),
    ("cloud/scheduler", ("cloud.work",), "work converts to the core's types, not the reverse"),
    ("cloud/store", ("cloud.work", "cloud.scheduler"), "the store keeps records, not decisions"),
    ("cloud/signals", ("cloud.scheduler.extensions",), "signals feed hooks, not the reverse"),
]


@pytest.mark.parametrize(("package", "forbidden", "why"), RULES)
def test_no_import_against_the_layering(package: str, forbidden: tuple[str, ...], why: str) -> None:
    wrong = sorted(
        f"{path} imports {module}"
        for path, modules in imports_of(package).items()
        for module in modules
        if any(_under(module, prefix) for prefix in forbidden)
    )
    assert not wrong, f"{why}:\n" + "\n".join(wrong)


def test_the_cli_never_imports_the_rest_api_handlers() -> None:
    """Every command reaches the control plane through greenfed.api_client; only
    `greenfed up` runs the control plane in-process (through cloud.app)."""
    wrong = sorted(
        f"{path} imports {module}"
        for path, modules in imports_of("greenfed").items()
        for module in modules
        if _under(module, "cloud.api")
    )
    assert not wrong, "\n".join(wrong)


def test_the_cli_loads_without_the_database_stack_or_the_server() -> None:
    """The client modules decode the REST types (cloud.work.views, cloud.fleet.views,
    shared.problems) and nothing of the server behind them."""
    script = (
        "import sys\n"
        "import greenfed.api_client, greenfed.nodes_cli, greenfed.spec_files\n"
        "import greenfed.work_cli, greenfed.work_commands\n"
        "import greenfed.access_cli, greenfed.access_commands\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'asyncpg',"
        " 'aiosqlite') or m.startswith(('cloud.api', 'cloud.store', 'cloud.loop'))))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert loaded.stdout.strip() == "[]"


def test_the_rules_see_imports_inside_functions(tmp_path: Path) -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import cloud.store\n"
        "def f():\n    from cloud import api\n    import edge.agent\n"
    )
    found = set(_imports(tree))
    assert {"cloud.api", "edge.agent"} <= found
    assert "cloud.store" not in found
