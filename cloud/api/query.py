"""Query strings parsed into typed Structs; a bad or unknown parameter is a 400 naming it.

Values are checked as text before they are typed: percent-encoded bytes that are not
UTF-8 (yarl decodes them to U+FFFD) and control characters (NUL, which PostgreSQL
refuses in text, among them) are a 400 naming the parameter, so no such value
reaches a handler, a log line or the store.
"""

from __future__ import annotations

import re
from typing import TypeVar

import msgspec
from aiohttp import web

from cloud.api.problems import invalid_query
from shared.errors import FieldError, MissingFieldError, UnknownFieldError, dotted_path
from shared.problems import InvalidParam

QueryT = TypeVar("QueryT", bound=msgspec.Struct)

_NOT_TEXT = re.compile("[\x00-\x1f\x7f\ufffd]")
UNDECODABLE_REASON = "not UTF-8 text (control characters and invalid percent-encoding refused)"


def is_clean_text(value: str) -> bool:
    """True for text without control characters or undecodable bytes (U+FFFD)."""
    return _NOT_TEXT.search(value) is None


def _invalid_param(refused: FieldError) -> InvalidParam:
    if isinstance(refused, UnknownFieldError):
        return InvalidParam(dotted_path(refused.path), "unknown parameter")
    if isinstance(refused, MissingFieldError):
        # As this API has always said it: of the query as a whole, in msgspec's words.
        return InvalidParam(dotted_path(refused.path[:-1]), str(refused))
    return InvalidParam(dotted_path(refused.path), refused.reason)


def parse_query(request: web.Request, query_type: type[QueryT]) -> QueryT:
    raw = {name: request.query.getone(name) for name in request.query}
    for name, value in raw.items():
        if not (is_clean_text(name) and is_clean_text(value)):
            shown = name if is_clean_text(name) else name.encode("unicode_escape").decode()
            raise invalid_query(InvalidParam(shown, UNDECODABLE_REASON))
    try:
        return msgspec.convert(raw, query_type, strict=False)
    except msgspec.ValidationError as error:
        raise invalid_query(_invalid_param(FieldError.from_msgspec(error))) from None
