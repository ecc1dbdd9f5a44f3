"""Spec files for `greenfed submit`: JSON, TOML or YAML by extension, checked locally.

The file holds one `TrainingJobSpec` or `DeploymentSpec` (the same fields as the REST
body). Which one is said by its `kind` field (`training` or `deployment`) or by
`--kind`. A file that does not match the spec fails here, naming the field, before
anything is sent.
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path
from typing import Any, Final, get_args

import msgspec

from cloud.work.specs import (
    SPEC_TYPES,
    TrainingJobSpec,
    WorkSpec,
    check_submitted_secrets,
    describe_error,
)
from shared.errors import FieldError, json_path
from shared.work_literals import SpecKind

SPEC_KINDS: Final[tuple[SpecKind, ...]] = get_args(SpecKind)
SUFFIXES: Final = (".json", ".toml", ".yaml", ".yml")


class SpecFileError(ValueError):
    """The file cannot be read or is not a valid spec; the message says where and why."""


_FORMAT_NAMES: Final = {".json": "JSON", ".toml": "TOML", ".yaml": "YAML", ".yml": "YAML"}


def _parse(path: Path, text: str) -> object:
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            return msgspec.json.decode(text.encode())
        if suffix == ".toml":
            return tomllib.loads(text)
        if suffix in (".yaml", ".yml"):
            # Imported here: only YAML spec files need PyYAML (untyped, hence import_module).
            yaml = importlib.import_module("yaml")
            return yaml.safe_load(text)
    except msgspec.DecodeError as error:
        raise SpecFileError(f"{path}: not valid JSON: {error}") from None
    except tomllib.TOMLDecodeError as error:
        raise SpecFileError(f"{path}: not valid TOML: {error}") from None
    except ImportError:
        raise
    except RecursionError:
        # Each parser recurses per level of nesting: a document nested thousands deep
        # is refused for that, whichever format it is in.
        raise SpecFileError(f"{path}: {_FORMAT_NAMES[suffix]} nested too deeply to read") from None
    except Exception as error:  # yaml.YAMLError and its subclasses
        raise SpecFileError(f"{path}: not valid YAML: {yaml_reason(error)}") from None
    raise SpecFileError(
        f"{path}: unknown file type {suffix or '(none)'}; use {', '.join(SUFFIXES)}"
    )


def yaml_reason(error: Exception) -> str:
    """What is wrong with a YAML file and where, never the line itself (PyYAML quotes it,
    and a spec file's line may hold a secret's value)."""
    if isinstance(error, RecursionError):  # PyYAML recurses per level of nesting
        return "nested too deeply to read"
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or type(error).__name__
    if mark is None:
        return str(problem)
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"


def parse_spec(document: object, kind: SpecKind | None, *, source: str) -> WorkSpec:
    """A decoded document (a mapping) as the spec of its `kind` (or the one given)."""
    if not isinstance(document, dict):
        raise SpecFileError(
            f"{source}: a spec is a mapping of fields, not {type(document).__name__}"
        )
    fields: dict[str, Any] = document
    file_kind = fields.get("kind")
    if file_kind is not None and file_kind not in SPEC_KINDS:
        raise SpecFileError(f"{source}: $.kind: must be one of {', '.join(SPEC_KINDS)}")
    if kind is not None and file_kind is not None and kind != file_kind:
        raise SpecFileError(f"{source}: $.kind: the file says {file_kind}, --kind says {kind}")
    chosen = kind or file_kind
    if chosen is None:
        raise SpecFileError(
            f'{source}: say what it is: add kind = "training" or "deployment", or pass --kind'
        )
    try:
        spec = msgspec.convert(fields, SPEC_TYPES[chosen])
        if isinstance(spec, TrainingJobSpec):
            check_submitted_secrets(spec)
    except RecursionError:
        raise SpecFileError(f"{source}: nested too deeply to read") from None
    except msgspec.ValidationError as error:
        name, reason = describe_error(error)
        raise SpecFileError(f"{source}: {name}: {reason}") from None
    except FieldError as error:
        raise SpecFileError(f"{source}: {json_path(error.path)}: {error.reason}") from None
    return spec


def read_spec_text(path: Path) -> str:
    """A spec file's text; `SpecFileError` naming the file when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as error:
        raise SpecFileError(f"{path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise SpecFileError(f"{path}: not UTF-8 text") from None


def load_spec_file(path: Path, kind: SpecKind | None = None) -> WorkSpec:
    return parse_spec(_parse(path, read_spec_text(path)), kind, source=str(path))
