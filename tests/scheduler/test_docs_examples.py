"""The examples in docs/scheduler.md run, and print what the document says they print:
a change to the scheduler that alters them fails here, not in a reader's hands."""

from __future__ import annotations

import contextlib
import io
import itertools
import re
import sys
import types
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "scheduler.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)


def _examples() -> list[tuple[int, str, str]]:
    """(line, code, printed) for every python block followed by its output: a text block
    with nothing between them but a short "Output:" line."""
    text = DOC.read_text()
    fences = list(_FENCE.finditer(text))
    found = []
    for block, after in itertools.pairwise(fences):
        between = text[block.end() : after.start()].strip()
        if block.group(1) == "python" and after.group(1) == "text" and len(between) < 20:
            line = text[: block.start()].count("\n") + 1
            found.append((line, block.group(2), after.group(2)))
    return found


@pytest.mark.parametrize(("line", "code", "printed"), _examples(), ids=lambda v: str(v)[:12])
def test_the_example_prints_what_the_document_shows(line: int, code: str, printed: str) -> None:
    out = io.StringIO()
    module = types.ModuleType(f"doc_example_{line}")  # dataclasses look their module up
    sys.modules[module.__name__] = module
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"{DOC.name}:{line}", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    assert out.getvalue().strip() == printed.strip()


def test_the_document_has_examples_to_check() -> None:
    assert len(_examples()) >= 3
