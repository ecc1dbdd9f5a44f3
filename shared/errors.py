"""Errors that cross a seam as data, and errors that end a command with a clear message.

`FieldError` is what greenfed's validation raises (spec and settings `__post_init__`
checks, the scheduler's model): the path of the value at fault and the reason, so the
API maps it to `invalid_params` and settings name the key without reading either back
out of a message.

msgspec reports its own refusals (an unknown, missing or mistyped field) and where in
the document a `__post_init__` error happened only as text, so `FieldError.from_msgspec`
reads that text, here and nowhere else. An error our `__post_init__` raised keeps its
typed path and reason; only the location msgspec adds in front of it is read from text.

A string that does not match its type's `pattern` msgspec refuses by quoting the regex,
which tells a person nothing; `worded_pattern` gives a pattern the words that replace it.
"""

from __future__ import annotations

import re
from types import EllipsisType
from typing import Final, TypeAlias

import msgspec

PathSegment: TypeAlias = str | int | EllipsisType
"""A field (or key) name, a list index, or `...`: a value of a mapping whose key msgspec
does not report (it writes `$.score_weights[...]`)."""
FieldPath: TypeAlias = tuple[PathSegment, ...]

MSGSPEC_DECODE_ERRORS: Final = (msgspec.DecodeError, RecursionError)
"""What decoding bytes from another party with msgspec raises for bytes it cannot take:
`DecodeError` (its `ValidationError` included) and `RecursionError`, msgspec's guard
against a stack overflow on nesting too deep (`{"x":` then 3,000 `[`), which no decoder
type prevents: a field the type ignores, or an untyped one, is walked all the same.
Caught where such bytes are decoded, too deep is malformed there, not a crash."""


def _step(segment: PathSegment) -> str:
    if segment is ...:
        return "[...]"
    if isinstance(segment, int):
        return f"[{segment}]"
    return f".{segment}"


def json_path(path: FieldPath) -> str:
    """`$.affinity[0].values`; `$` for the document itself (the REST `invalid_params` names)."""
    return "$" + "".join(_step(segment) for segment in path)


def dotted_path(path: FieldPath) -> str:
    """`mqtt.url`, `agent.probes[1]`; empty for the document itself (settings keys)."""
    return "".join(_step(segment) for segment in path).removeprefix(".")


class FieldError(ValueError):
    """A value refused: `path` says which (relative to whatever is being validated),
    `reason` why. `str()` is for people: `message` when given, else "path: reason"."""

    def __init__(self, path: str | FieldPath, reason: str, *, message: str | None = None) -> None:
        self.path: FieldPath = (path,) if isinstance(path, str) else tuple(path)
        self.reason = reason
        if message is None:
            message = f"{dotted_path(self.path)}: {reason}" if self.path else reason
        super().__init__(message)

    def within(self, outer: FieldPath) -> FieldError:
        """The same refusal as seen from the value that holds this one at `outer`."""
        return FieldError(outer + self.path, self.reason)

    @staticmethod
    def from_msgspec(error: msgspec.ValidationError) -> FieldError:
        """The field at fault in a decode or convert error, with the whole path."""
        message = str(error)
        location: FieldPath = ()
        in_key = False
        match = _LOCATION.search(message)
        if match:
            location = tuple(_segment(step) for step in _STEP.finditer(match.group("path")))
            in_key = match.group("key") is not None
            message = message[: match.start()]
        cause = error.__cause__
        if isinstance(cause, FieldError):  # raised by a __post_init__ at `location`
            return cause.within(location)
        if match := _UNKNOWN.match(message):
            return UnknownFieldError((*location, match.group("field")), message)
        if match := _MISSING.match(message):
            return MissingFieldError((*location, match.group("field")), message)
        reason = _worded(message)
        return FieldError(location, f"{reason} (a key)" if in_key else reason)


class UnknownFieldError(FieldError):
    """msgspec met a field the type does not have (`forbid_unknown_fields`); `path` ends
    with its name. `str()` is msgspec's wording."""

    def __init__(self, path: FieldPath, msgspec_message: str) -> None:
        super().__init__(path, "unknown field", message=msgspec_message)


class MissingFieldError(FieldError):
    """msgspec found no value for a required field; `path` ends with its name. `str()` is
    msgspec's wording."""

    def __init__(self, path: FieldPath, msgspec_message: str) -> None:
        super().__init__(path, "required field is missing", message=msgspec_message)


# msgspec's message format (as of msgspec 0.23; tests/shared/test_errors.py pins it):
# "<reason>", "<reason> - at `$<path>`" or, for a mapping key, "<reason> - at `key` in
# `$<path>`"; <path> is made of `.field`, `[index]` and `[...]` (a mapping's value) steps.
# Its own reasons for unknown and missing fields:
_LOCATION: Final = re.compile(r" - at `(?P<key>key` in `)?\$(?P<path>[^`]*)`$")
_STEP: Final = re.compile(r"\.(?P<field>[^.\[`]+)|\[(?P<index>\d+|\.\.\.)\]")
_UNKNOWN: Final = re.compile(r"^Object contains unknown field `(?P<field>[^`]+)`$")
_MISSING: Final = re.compile(r"^Object missing required field `(?P<field>[^`]+)`$")


# msgspec's refusal of a string that does not match its pattern: "Expected `str`
# matching regex <repr of the pattern>".
_PATTERN_REFUSAL: Final = "Expected `str` matching regex "
# Said of a pattern no `worded_pattern` gave words: still no regex.
UNWORDED_PATTERN_REASON: Final = "not in the form this field takes"
_PATTERN_REASONS: Final[dict[str, str]] = {}  # msgspec's refusal -> the words shown instead


def worded_pattern(pattern: str, reason: str) -> str:
    """`pattern`, for a `msgspec.Meta(pattern=...)`, with `reason`: what
    `FieldError.from_msgspec` says of a value that does not match it, in place of the
    regex ("must be letters, digits, ..."). A pattern has one reason: the same pattern
    given other words (two types that share it) is a mistake, refused at import."""
    refusal = f"{_PATTERN_REFUSAL}{pattern!r}"
    known = _PATTERN_REASONS.setdefault(refusal, reason)
    if known != reason:
        raise ValueError(f"pattern {pattern!r} already has the words {known!r}")
    return pattern


def _worded(message: str) -> str:
    """msgspec's reason, with a pattern's words in place of the regex it quotes."""
    if not message.startswith(_PATTERN_REFUSAL):
        return message
    return _PATTERN_REASONS.get(message, UNWORDED_PATTERN_REASON)


def _segment(step: re.Match[str]) -> PathSegment:
    index = step.group("index")
    if index is None:
        return step.group("field")
    return ... if index == "..." else int(index)


class MqttAuthError(RuntimeError):
    """The broker refused our credentials; reconnecting will not help."""
