"""Query strings parsed into typed Structs; a bad or unknown parameter is a 400 naming it.
A route that declares no query refuses every parameter so (`refuse_undeclared`, applied
by `cloud.api.routes.add_routes`): one it ignored would let `?dry_run=true` cancel for real.

Values are checked as text before they are typed: percent-encoded bytes that are not
UTF-8 (yarl decodes them to U+FFFD) and control characters (NUL, which PostgreSQL
refuses in text, among them) are a 400 naming the parameter, so no such value
reaches a handler, a log line or the store. A parameter given twice is a 400 too
(which one would count?).

Numbers, booleans and times are read as the OpenAPI document says they are written
(`style: form`): an integer is decimal digits with an optional minus (`10`, not
`1e1` or `10.0`), a number a JSON number, a boolean `true` or `false`, a time RFC 3339
(`2026-12-01T00:00:00Z`). They are typed here, and the rest converted strictly: msgspec's
lax conversion would take more (`1e3` for 1000, `null` for no value, a space for `T`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Final, Literal, TypeVar

import msgspec
from aiohttp import web

from cloud.api.problems import invalid_query
from shared.errors import FieldError, MissingFieldError, UnknownFieldError, dotted_path
from shared.problems import InvalidParam

QueryT = TypeVar("QueryT", bound=msgspec.Struct)
Scalar = Literal["integer", "number", "boolean", "date-time"]

_NOT_TEXT = re.compile("[\x00-\x1f\x7f\ufffd]")
UNDECODABLE_REASON = "not UTF-8 text (control characters and invalid percent-encoding refused)"
# The same rule as a JSON Schema pattern, for the OpenAPI document (cloud/api/openapi.py).
# `(?!\n)`: Python's `$` (Hypothesis generates from these) also matches before a final \n.
CLEAN_TEXT_PATTERN: Final = "^[^\\u0000-\\u001f\\u007f\\ufffd]*$(?!\\n)"
# RFC 3339 section 5.6 (T and Z in either case), as JSON Schema's format date-time reads
# it, from year 0001 (Python's first); msgspec checks the calendar once the form is
# right. The OpenAPI document gives date-time strings this pattern (cloud/api/openapi.py).
RFC3339_PATTERN: Final = (
    # Any year but 0000, without a lookahead (published: RE2 has none).
    "^([1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
    "-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]"
    "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?"
    "([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$(?!\\n)"
)
_WRITTEN: Final[dict[Scalar, re.Pattern[str]]] = {
    # At most 20 digits: int() refuses (ValueError) a text of more than 4,300, and no
    # parameter takes a number beyond int64's 19 digits anyway.
    "integer": re.compile(r"-?[0-9]{1,20}"),
    "number": re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"),
    "boolean": re.compile(r"true|false"),
    "date-time": re.compile(RFC3339_PATTERN),
}
_REASONS: Final[dict[Scalar, str]] = {
    "integer": "an integer, in at most 20 decimal digits",
    "number": "a number",
    "boolean": "true or false",
    "date-time": "an RFC 3339 time with its offset, e.g. 2026-12-01T00:00:00Z",
}


def is_clean_text(value: str) -> bool:
    """True for text without control characters or undecodable bytes (U+FFFD)."""
    return _NOT_TEXT.search(value) is None


def _scalar_of(field_type: msgspec.inspect.Type) -> Scalar | None:
    """What a field holds if it is an integer, number or boolean (None allowed)."""
    while isinstance(field_type, msgspec.inspect.Metadata):
        field_type = field_type.type
    if isinstance(field_type, msgspec.inspect.UnionType):
        kinds = {
            _scalar_of(member)
            for member in field_type.types
            if not isinstance(member, msgspec.inspect.NoneType)
        }
        return kinds.pop() if len(kinds) == 1 else None
    if isinstance(field_type, msgspec.inspect.BoolType):
        return "boolean"
    if isinstance(field_type, msgspec.inspect.IntType):
        return "integer"
    if isinstance(field_type, msgspec.inspect.FloatType):
        return "number"
    if isinstance(field_type, msgspec.inspect.DateTimeType):
        return "date-time"
    return None


def _typed(scalar: Scalar, text: str) -> object:
    """A parameter's text (already matching its `_WRITTEN` form) as its value."""
    if scalar == "integer":
        return int(text)
    if scalar == "number":
        return float(text)
    if scalar == "boolean":
        return text == "true"
    return text  # a time: msgspec reads RFC 3339 (and checks the calendar)


@functools.cache
def _scalars(query_type: type[msgspec.Struct]) -> dict[str, Scalar]:
    """Parameter name -> what it holds, for the query's integer, number and boolean
    parameters."""
    info = msgspec.inspect.type_info(query_type)
    assert isinstance(info, msgspec.inspect.StructType)
    found: dict[str, Scalar] = {}
    for field in info.fields:
        scalar = _scalar_of(field.type)
        if scalar is not None:
            found[field.encode_name] = scalar
    return found


def _invalid_param(refused: FieldError) -> InvalidParam:
    if isinstance(refused, UnknownFieldError):
        return InvalidParam(dotted_path(refused.path), "unknown parameter")
    if isinstance(refused, MissingFieldError):
        # As this API has always said it: of the query as a whole, in msgspec's words.
        return InvalidParam(dotted_path(refused.path[:-1]), str(refused))
    return InvalidParam(dotted_path(refused.path), refused.reason)


def _shown(name: str) -> str:
    """A parameter's name as an answer may quote it (control characters escaped)."""
    return name if is_clean_text(name) else name.encode("unicode_escape").decode()


def parse_query(request: web.Request, query_type: type[QueryT]) -> QueryT:
    query = request.query
    raw: dict[str, str] = {}
    for name, value in query.items():  # every occurrence, repeats included
        shown = _shown(name)
        if name in raw:
            raise invalid_query(InvalidParam(shown, "given more than once"))
        if not (is_clean_text(name) and is_clean_text(value)):
            raise invalid_query(InvalidParam(shown, UNDECODABLE_REASON))
        raw[name] = value
    values: dict[str, object] = dict(raw)
    for name, scalar in _scalars(query_type).items():
        if name not in raw:
            continue
        if _WRITTEN[scalar].fullmatch(raw[name]) is None:
            raise invalid_query(InvalidParam(name, _REASONS[scalar]))
        values[name] = _typed(scalar, raw[name])
    try:
        return msgspec.convert(values, query_type, strict=True)
    except msgspec.ValidationError as error:
        raise invalid_query(_invalid_param(FieldError.from_msgspec(error))) from None


def refuse_undeclared(request: web.Request, taken: frozenset[str] = frozenset()) -> None:
    """For a route that declares no query: a 400 naming each parameter but those in
    `taken` (which its handler reads itself, as a signed download's `sig`), each once."""
    refused: dict[str, InvalidParam] = {}
    for name in request.query:
        if name not in taken and name not in refused:
            reason = "unknown parameter" if is_clean_text(name) else UNDECODABLE_REASON
            refused[name] = InvalidParam(_shown(name), reason)
    if refused:
        raise invalid_query(*refused.values())


def comma_list_pattern(allowed: Sequence[str]) -> str:
    """The JSON Schema pattern of a comma-separated list of `allowed` values (at least
    one, no spaces): what `comma_list` takes."""
    # Only `.` is escaped: `\\-` is no valid escape in every regex dialect that reads it.
    choice = "(" + "|".join(value.replace(".", "\\.") for value in allowed) + ")"
    return f"^{choice}(,{choice})*$(?!\\n)"


def comma_list(name: str, text: str | None, allowed: Sequence[str]) -> tuple[str, ...]:
    """The values of a comma-separated query parameter (none when it is absent); a 400
    naming it for an empty list or a value not in `allowed` (its pattern in the OpenAPI
    document is `comma_list_pattern(allowed)`)."""
    if text is None:
        return ()
    values = tuple(text.split(","))
    unknown = [repr(value) for value in values if value not in allowed]
    if unknown:
        raise invalid_query(
            InvalidParam(
                name,
                f"unknown value {', '.join(unknown)[:200]}; a comma-separated list (no "
                f"spaces) of {', '.join(allowed)}",
            )
        )
    return values
