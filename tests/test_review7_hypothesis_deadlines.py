"""Property tests have no per-example deadline: CI runs the suite on two shared, loaded
cores, where Hypothesis's default 200 ms failed a test whose example took 268 ms once
and 99 ms on the rerun (FlakyFailure, DeadlineExceeded), which blocks every other result.

tests/conftest.py loads a profile without the deadline; a test's own `@settings(...)`
inherits that unless it names a deadline, which the source check below refuses. Read
from the source with `ast`, as tests/test_layering.py reads imports, so a job's
`deadline=` (a field of the work, not of Hypothesis) is not mistaken for one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _settings_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names bound to `hypothesis.settings`, names bound to the `hypothesis` module)."""
    settings_names: set[str] = set()
    module_names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "hypothesis":
            settings_names.update(
                alias.asname or alias.name for alias in node.names if alias.name == "settings"
            )
        elif isinstance(node, ast.Import):
            module_names.update(
                alias.asname or alias.name for alias in node.names if alias.name == "hypothesis"
            )
    return settings_names, module_names


def _is_settings_call(call: ast.Call, settings_names: set[str], module_names: set[str]) -> bool:
    """`settings(...)`, `hypothesis.settings(...)` or `<anything>.register_profile(...)`."""
    function = call.func
    if isinstance(function, ast.Name):
        return function.id in settings_names
    if isinstance(function, ast.Attribute):
        if function.attr == "register_profile":
            return True
        return (
            function.attr == "settings"
            and isinstance(function.value, ast.Name)
            and function.value.id in module_names
        )
    return False


def _is_none(value: ast.expr) -> bool:
    return isinstance(value, ast.Constant) and value.value is None


def deadlines_set_in(tree: ast.Module) -> Iterator[str]:
    """`line: text` of each Hypothesis deadline in a module that is not None."""
    settings_names, module_names = _settings_names(tree)
    if not settings_names and not module_names:
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_settings_call(node, settings_names, module_names):
            for keyword in node.keywords:
                if keyword.arg == "deadline" and not _is_none(keyword.value):
                    yield f"{node.lineno}: {ast.unparse(node)}"
        elif isinstance(node, ast.Dict):  # keyword arguments kept apart (`**_COMMON`)
            for key, value in zip(node.keys, node.values, strict=True):
                if (
                    isinstance(key, ast.Constant)
                    and key.value == "deadline"
                    and not _is_none(value)
                ):
                    yield f"{node.lineno}: {ast.unparse(node)}"


def _test_modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(TESTS.rglob("*.py")):
        try:
            source = path.read_text(encoding="utf-8")
            # Only a module that imports hypothesis can set its deadline (deadlines_set_in
            # finds none in the others): most are not parsed at all.
            if "hypothesis" not in source:
                continue
            tree = ast.parse(source, filename=str(path))
        except (FileNotFoundError, SyntaxError):
            continue  # gone since listed, or half-written: collecting it reports that
        yield path, tree


def test_no_test_sets_a_hypothesis_deadline() -> None:
    found = sorted(
        f"{path.relative_to(ROOT)}:{line}"
        for path, tree in _test_modules()
        for line in deadlines_set_in(tree)
    )
    assert not found, (
        "a per-example deadline fails property tests on a loaded CI machine; leave it "
        "unset (tests/conftest.py loads deadline=None):\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "source",
    [
        "from hypothesis import settings\n@settings(max_examples=5, deadline=500)\ndef t(): ...",
        "from hypothesis import settings as s\nX = s(PROFILE, deadline=timedelta(seconds=1))",
        "import hypothesis\nX = hypothesis.settings(deadline=200)",
        "from hypothesis import settings\nsettings.register_profile('p', deadline=200)",
        "from hypothesis import settings\nCOMMON = {'deadline': 1000}",
    ],
)
def test_the_check_finds_a_deadline_however_it_is_written(source: str) -> None:
    assert list(deadlines_set_in(ast.parse(source))) != []


@pytest.mark.parametrize(
    "source",
    [
        "from hypothesis import settings\n@settings(max_examples=5, deadline=None)\ndef t(): ...",
        "from hypothesis import given\njob(deadline=T0 + 24 * HOUR)",
        "def settings(d): ...\nsettings(deadline=5)",  # not Hypothesis's (no import)
    ],
)
def test_the_check_leaves_other_deadlines_alone(source: str) -> None:
    assert list(deadlines_set_in(ast.parse(source))) == []


def test_the_suite_runs_without_a_deadline_and_as_many_examples(
    pytestconfig: pytest.Config,
) -> None:
    """The profile changes the deadline only: the suite's examples, and so its time, stay."""
    if pytestconfig.getoption("--hypothesis-profile", None) is None:  # as CI runs it
        loaded = settings()  # every value as the loaded profile has it
        assert loaded.deadline is None
        assert loaded.max_examples == settings.get_profile("default").max_examples
        # A test's own settings inherit what they do not name.
        assert settings(max_examples=5).deadline is None
    profile = settings.get_profile("greenfed")
    assert profile.deadline is None
    assert profile.max_examples == settings.get_profile("default").max_examples == 100
