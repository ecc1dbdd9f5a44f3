"""Every pattern greenfed publishes (the MQTT payload schemas here, the OpenAPI document
in tests/api/test_openapi.py) compiles under RE2 (as Go's and Rust's JSON Schema
validators do) and under Python's `re`, and means there what greenfed's own validation
means: a value with a trailing newline is refused by both."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import re2

from greenfed.cli import main
from shared.portable_patterns import portable_pattern
from shared.schemas import all_payload_schemas, schema_catalog
from shared.topics import Topics


def patterns(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                yield value
            elif key == "patternProperties" and isinstance(value, dict):
                yield from value
            yield from patterns(value)
    elif isinstance(node, list):
        for item in node:
            yield from patterns(item)


def published() -> dict[str, set[str]]:
    return {
        "payload schemas": set(patterns(all_payload_schemas())),
        "schema catalog": set(patterns(schema_catalog(Topics("greenfed")))),
    }


def refused_by_re2(found: set[str]) -> list[str]:
    """The patterns RE2 refuses, with why (each compiles under Python's `re` too)."""
    refused = []
    for pattern in sorted(found):
        try:
            re2.compile(pattern)
        except re2.error as error:
            refused.append(f"{pattern}: {error}")
        re.compile(pattern)
    return refused


@pytest.mark.parametrize("document", ["payload schemas", "schema catalog"])
def test_every_published_pattern_compiles_under_re2(document: str) -> None:
    found = published()[document]
    assert found  # the documents do hold patterns
    assert refused_by_re2(found) == []


def test_the_portable_form_refuses_what_the_python_one_refuses() -> None:
    python = r"^[a-z][a-z0-9-]{0,31}$(?!\n)"
    ecma = portable_pattern(python)
    assert ecma == r"^[a-z][a-z0-9-]{0,31}$"
    # RE2's `$` is the end of the text (no multiline flag), like ECMA-262's.
    assert re2.fullmatch(ecma, "node-1") is not None
    assert re2.search(ecma, "node-1\n") is None
    assert re.search(python, "node-1\n") is None


def test_greenfed_schema_prints_every_channel_including_logs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["schema", "logs"]) == 0
    printed = capsys.readouterr().out
    assert '"$id": "https://greenfed.dev/schemas/v1/logs.json"' in printed
    assert "(?!" not in printed
