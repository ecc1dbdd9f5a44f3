"""`greenfed apply`, `greenfed diff`, `greenfed submit --dry-run` and `greenfed events`:
what they send and what they print (argparse lives in greenfed/declarative_cli.py).

apply and diff send each spec to `PUT /v1/jobs/{name}` or `PUT /v1/deployments/{name}`
(`?dry_run=true` for diff and `apply --dry-run`): the server decides what is created,
changed in place or refused (cloud/api/apply.py). A spec refused is one line on stderr;
the others go on, and the exit status is the first refusal's.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Final

import msgspec

from cloud.work.apply_views import ApplyView, DryRunView
from cloud.work.specs import TrainingJobSpec, WorkSpec, encode_spec
from cloud.work.views import EventView
from greenfed.arguments import EXIT_OK
from greenfed.output import Output, emit, yaml_text
from greenfed.spec_files import (
    SUFFIXES,
    SpecFileError,
    load_spec_file,
    parse_spec,
    read_spec_text,
    yaml_reason,
)
from shared.printable import printable
from shared.work_literals import SpecKind

if TYPE_CHECKING:
    from greenfed.api_client import ApiClient

_EVENT_LINE: Final = msgspec.json.Encoder()


class _StateChange(msgspec.Struct, frozen=True):
    """What a `work.state` event's payload says, for its line."""

    state: str
    previous_state: str | None = None
    reason: str | None = None


def spec_files(paths: Sequence[Path]) -> list[Path]:
    """The files named, and the spec files (by suffix) directly in each directory
    named, in name order."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            inside = sorted(p for p in path.iterdir() if p.suffix.lower() in SUFFIXES)
            if not inside:
                raise SpecFileError(f"{path}: no spec files ({', '.join(SUFFIXES)}) in it")
            found.extend(inside)
        else:
            found.append(path)
    return found


def load_specs(paths: Sequence[Path], kind: SpecKind | None) -> list[tuple[str, WorkSpec]]:
    """Every spec of `paths` with where it came from, each checked locally; the first
    invalid one raises. A YAML file may hold several specs (documents split by `---`,
    as kubectl reads them)."""
    found: list[tuple[str, WorkSpec]] = []
    for path in spec_files(paths):
        if path.suffix.lower() not in (".yaml", ".yml"):
            found.append((str(path), load_spec_file(path, kind)))
            continue
        documents = _yaml_documents(path)
        for index, document in enumerate(documents, start=1):
            source = str(path) if len(documents) == 1 else f"{path} (document {index})"
            found.append((source, parse_spec(document, kind, source=source)))
    return found


def _yaml_documents(path: Path) -> list[object]:
    """The documents of a YAML file, empty ones left out."""
    # Imported here: only YAML spec files need PyYAML (untyped, hence import_module).
    yaml = importlib.import_module("yaml")
    text = read_spec_text(path)
    try:
        documents = [document for document in yaml.safe_load_all(text) if document is not None]
    except Exception as error:  # yaml.YAMLError and its subclasses
        raise SpecFileError(f"{path}: not valid YAML: {yaml_reason(error)}") from None
    if not documents:
        raise SpecFileError(f"{path}: no spec in it")
    return documents


def _collection(spec: WorkSpec) -> tuple[str, str]:
    return (
        ("/v1/jobs", "job")
        if isinstance(spec, TrainingJobSpec)
        else ("/v1/deployments", "deployment")
    )


def _value(raw: msgspec.Raw) -> str:
    """A JSON value as one printable line (JSON escapes C0 characters, not DEL or C1)."""
    return printable(bytes(raw).decode())


def _said(view: ApplyView) -> str:
    """One line (and the changed fields under it) for a person."""
    noun = "job" if view.kind == "training" else "deployment"
    lines = [printable(view.message)]
    lines.extend(
        f"  {change.field}: {_value(change.before)} -> {_value(change.after)}"
        for change in view.changes
    )
    if not view.message.startswith(noun):
        lines[0] = f"{noun} {view.name}: {view.message}"
    return "\n".join(lines) + "\n"


async def apply(
    client: ApiClient,
    specs: Sequence[tuple[str, WorkSpec]],
    *,
    dry_run: bool,
    output: Output,
    diff: bool = False,
) -> int:
    """PUT each spec by name; `dry_run`: what would be done (`diff`: as a diff)."""
    from greenfed.api_client import CliError, path_segment

    status = EXIT_OK
    answers: list[ApplyView] = []
    for source, spec in specs:
        base, _ = _collection(spec)
        params = {"dry_run": "true"} if dry_run else None
        try:
            path = f"{base}/{path_segment(spec.name)}"
            reply = await client.ask("PUT", path, ApplyView, params=params, body=encode_spec(spec))
        except CliError as error:
            print(f"greenfed: {source}: {error}", file=sys.stderr)
            status = status or error.exit_code
            continue
        view = reply.value
        answers.append(view)
        if output.format in ("table", "wide"):
            output.out.write(_diff(view) if diff else _said(view))
    if output.format not in ("table", "wide"):
        emit(output, answers, lambda: None)
    return status


def _diff(view: ApplyView) -> str:
    """`greenfed diff`: per object, what apply would change, like `kubectl diff`."""
    noun = "job" if view.kind == "training" else "deployment"
    title = f"{noun} {view.name}" + (f" ({view.id})" if view.id else "")
    if view.action == "created":
        where = "" if view.placement is None else f": {printable(view.placement.message)}"
        return f"{title}: would be created{where}\n"
    if view.action == "unchanged":
        return f"{title}: no changes\n"
    lines = [printable(view.message)]  # "job NAME (ID) would change: FIELDS"
    for change in view.changes:
        lines.append(f"- {change.field}: {_value(change.before)}")
        lines.append(f"+ {change.field}: {_value(change.after)}")
    return "\n".join(lines) + "\n"


async def dry_run(client: ApiClient, spec: WorkSpec, *, output: Output) -> int:
    """`greenfed submit --dry-run`: checked by the server and placed in a pass that
    commits nothing."""
    base, noun = _collection(spec)
    reply = await client.ask("POST", f"{base}/dry-run", DryRunView, body=encode_spec(spec))

    def said() -> None:
        view = reply.value
        message = printable(view.message)
        output.out.write(f"{noun} {view.name} (dry run, nothing submitted): {message}\n")

    emit(output, reply.payload, said)
    return EXIT_OK


def event_detail(event: EventView) -> str:
    """What happened, for a person, on one printable line: a state change as
    `from -> to: reason` (a reason is often a node's words: a CR in it must not rewrite
    the line, an escape sequence must not reach the terminal)."""
    if event.kind != "work.state":
        return _value(event.payload)
    change = msgspec.json.decode(event.payload, type=_StateChange)
    detail = printable(f"{change.previous_state or 'submitted'} -> {change.state}")
    return f"{detail}: {printable(change.reason)}" if change.reason else detail


def _event_line(event: EventView) -> str:
    detail = event_detail(event)
    tenant = f"{printable(event.tenant)}  " if event.tenant else ""
    at = f"{event.at:%Y-%m-%dT%H:%M:%S}Z"
    return f"{at}  {event.seq}  {tenant}{event.kind}  {event.work_id or '-'}  {detail}\n"


async def events(
    client: ApiClient,
    *,
    follow: bool,
    kinds: tuple[str, ...],
    since: datetime | None,
    output: Output,
) -> int:
    """The events (`follow`: then each new one as it comes), one line each; `-o json`:
    one JSON object (an EventView) a line; `-o yaml`: one YAML document each, opened by
    `---` so that a stream that never ends can be read one event at a time. A followed
    stream the control plane ends (it stops, or the token was revoked) is a failure."""
    from greenfed.api_client import CliError
    from greenfed.event_stream import events as event_stream
    from greenfed.event_stream import matches

    # The server starts the stream: with the next event (follow), the first (a listing),
    # or the first at or after `since`.
    params: dict[str, str] = {} if follow else {"follow": "false"}
    if since is not None:
        params["since"] = since.isoformat()
    elif not follow:
        params["after"] = "0"
    async for event in event_stream(client, params):
        if not matches(event, kinds) or (since is not None and event.at < since):
            continue
        if output.format == "json":
            output.out.write(_EVENT_LINE.encode(event).decode() + "\n")
        elif output.format == "yaml":
            output.out.write("---\n" + yaml_text(event))
        else:
            output.out.write(_event_line(event))
        output.out.flush()
    if follow:
        # A followed stream has no end of its own (Ctrl-C ends it): the control plane
        # ended it, and a script must not take that for done.
        raise CliError(
            "the control plane ended the event stream (stopping, or the token was revoked)"
        )
    return EXIT_OK
