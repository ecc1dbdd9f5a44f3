"""Query strings parsed into typed Structs; a bad or unknown parameter is a 400 naming it."""

from __future__ import annotations

import re
from typing import TypeVar

import msgspec
from aiohttp import web

from cloud.api.problems import invalid_query
from shared.problems import InvalidParam

QueryT = TypeVar("QueryT", bound=msgspec.Struct)

_AT_PATH = re.compile(r" - at `\$\.?(?P<name>[^`]*)`$")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]+)`$")


def parse_query(request: web.Request, query_type: type[QueryT]) -> QueryT:
    raw = {name: request.query.getone(name) for name in request.query}
    try:
        return msgspec.convert(raw, query_type, strict=False)
    except msgspec.ValidationError as error:
        message = str(error)
        name = ""
        match = _AT_PATH.search(message)
        if match:
            name = match.group("name")
            message = message[: match.start()]
        unknown = _UNKNOWN.match(message)
        if unknown:
            raise invalid_query(InvalidParam(unknown.group("name"), "unknown parameter")) from None
        raise invalid_query(InvalidParam(name, message)) from None
