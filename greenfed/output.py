"""`-o/--output`: how every command that prints what the API answered prints it.

- `table` (the default): the command's table, or its line, for a person;
- `wide`: a listing's table with the columns `table` leaves out (labels, versions,
  timestamps, reasons), every cell whole at any terminal width;
- `json`: the API's JSON, indented (`--json` is the same);
- `yaml`: the same data as YAML, block style, keys in the API's order.

A command adds the option with `add_output_options` (`greenfed.work_cli.add_client_options`
does, for every command that reaches the API), builds its `Output` with `output_of(args)`
and prints through `emit`:

    _, payload = await client.call("GET", "/v1/agent-packages")
    emit(output, payload, lambda: render_packages(decode(payload), output))

Only argparse and msgspec at import: `greenfed`'s parser is built by every command, an
agent's included. PyYAML is imported when YAML is asked for.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, TextIO

import msgspec

# What a listing or a show command prints; a command that acts prints a line for a person
# (`table`) or the API's answer (`json`, `yaml`): a `wide` line would be the same line.
LISTING_FORMATS: Final = ("table", "wide", "json", "yaml")
ACTION_FORMATS: Final = ("table", "json", "yaml")

# `-o wide`: a table as wide as it is; no cell is cut or folded to fit a terminal.
WIDE_COLUMNS: Final = 100_000
# Lines longer than any terminal: a YAML scalar is never folded over two lines.
_YAML_WIDTH: Final = 1 << 30


@dataclass(frozen=True, slots=True)
class Output:
    """The format asked for and where it goes (the stdout of the moment by default)."""

    format: str = "table"
    out: TextIO = field(default_factory=lambda: sys.stdout)

    @property
    def wide(self) -> bool:
        return self.format == "wide"


def add_output_options(
    parser: argparse.ArgumentParser,
    formats: tuple[str, ...] = LISTING_FORMATS,
    *,
    nested: bool = False,
    extra: tuple[tuple[str, str], ...] = (),
) -> None:
    """`-o/--output FORMAT` and `--json` (the same as `-o json`); `extra`: more
    `(--flag, format)` spellings a command kept (`greenfed usage --csv`).

    `nested`: a sub-command of a command that has them too; its unset options must not
    overwrite what was given before the sub-command's name.
    """
    given = parser.add_mutually_exclusive_group()
    given.add_argument(
        "-o",
        "--output",
        choices=formats,
        metavar="FORMAT",
        default=argparse.SUPPRESS if nested else None,
        help=f"{', '.join(formats)} (default table)",
    )
    for flag, format_name in (("--json", "json"), *extra):
        given.add_argument(
            flag,
            dest="output",
            action="store_const",
            const=format_name,
            default=argparse.SUPPRESS,
            help=f"the same as -o {format_name}",
        )


def output_of(args: argparse.Namespace) -> Output:
    """The `Output` the command line asked for (`table` where it asked for none)."""
    return Output(format=getattr(args, "output", None) or "table")


def json_bytes(document: bytes | object) -> bytes:
    """The document as JSON: the API's own bytes as they came, anything else encoded."""
    return document if isinstance(document, bytes) else msgspec.json.encode(document)


def yaml_text(document: bytes | object) -> str:
    """The document's JSON data as YAML: block style, keys in their order, no line folded."""
    # Imported here: only YAML output needs PyYAML (untyped, hence import_module).
    yaml = importlib.import_module("yaml")
    data: Any = msgspec.json.decode(json_bytes(document))
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    text: str = yaml.dump(
        data,
        Dumper=dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=_YAML_WIDTH,
    )
    return text


def emit(output: Output, document: bytes | object, for_people: Callable[[], object]) -> None:
    """Print `document` (the API's JSON bytes, or a value msgspec encodes) as `output`
    asks: JSON or YAML of it, or what `for_people` prints (a table, honouring
    `output.wide`, or a line) for `table` and `wide`."""
    if output.format == "json":
        output.out.write(msgspec.json.format(json_bytes(document), indent=2).decode() + "\n")
    elif output.format == "yaml":
        output.out.write(yaml_text(document))
    else:
        for_people()
