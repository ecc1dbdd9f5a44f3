"""Query strings parsed into typed Structs; a bad or unknown parameter is a 400 naming it."""

from __future__ import annotations

from typing import TypeVar

import msgspec
from aiohttp import web

from cloud.api.problems import invalid_query
from shared.errors import FieldError, MissingFieldError, UnknownFieldError, dotted_path
from shared.problems import InvalidParam

QueryT = TypeVar("QueryT", bound=msgspec.Struct)


def _invalid_param(refused: FieldError) -> InvalidParam:
    if isinstance(refused, UnknownFieldError):
        return InvalidParam(dotted_path(refused.path), "unknown parameter")
    if isinstance(refused, MissingFieldError):
        # As this API has always said it: of the query as a whole, in msgspec's words.
        return InvalidParam(dotted_path(refused.path[:-1]), str(refused))
    return InvalidParam(dotted_path(refused.path), refused.reason)


def parse_query(request: web.Request, query_type: type[QueryT]) -> QueryT:
    raw = {name: request.query.getone(name) for name in request.query}
    try:
        return msgspec.convert(raw, query_type, strict=False)
    except msgspec.ValidationError as error:
        raise invalid_query(_invalid_param(FieldError.from_msgspec(error))) from None
