"""JSON request bodies decoded straight into msgspec types; every failure a problem.
And the other way: `json_response` encodes a msgspec type as the answer.

415 for a body that is not JSON by its Content-Type, 413 beyond the app's body limit
(aiohttp's `client_max_size`), 400 for malformed JSON, 422 naming the field at fault
(`invalid_params[].name` is a path such as `$.workers` or `$.affinity[0].values`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from cloud.api.problems import Problem
from cloud.work.specs import describe_error
from shared.problems import InvalidParam

T = TypeVar("T")

# Request bodies are small JSON documents; anything bigger is a mistake or abuse.
MAX_REQUEST_BYTES = 1024 * 1024


def is_json_media_type(content_type: str) -> bool:
    return content_type == "application/json" or (
        content_type.startswith("application/") and content_type.endswith("+json")
    )


def json_response(body: object, status: int = 200) -> web.Response:
    return web.Response(
        status=status, body=msgspec.json.encode(body), content_type="application/json"
    )


def payload_too_large(detail: str) -> Problem:
    return Problem(413, "payload-too-large", "Payload Too Large", detail)


def invalid_body(name: str, reason: str, *, status: int = 422) -> Problem:
    return Problem(
        status,
        "invalid-body",
        "Invalid request body",
        f"{name}: {reason}",
        (InvalidParam(name, reason),),
    )


async def read_body(request: web.Request) -> bytes:
    """The raw JSON body; the media type and size checked."""
    if not is_json_media_type(request.content_type):
        raise Problem(
            415,
            "unsupported-media-type",
            "Unsupported Media Type",
            f"the body must be JSON (Content-Type: application/json), not {request.content_type}",
        )
    limit = MAX_REQUEST_BYTES  # the app's client_max_size (cloud.app)
    if request.content_length is not None and request.content_length > limit:
        raise payload_too_large(
            f"the body has {request.content_length} bytes; at most {limit} are accepted"
        )
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise payload_too_large(f"the body exceeds {limit} bytes") from None


def _malformed(error: msgspec.DecodeError) -> Problem:
    return Problem(400, "malformed-json", "Malformed JSON", f"the body is not JSON: {error}")


# No body of this API nests deeper; a deeper one is refused before it is walked.
MAX_JSON_DEPTH = 64


def _too_deep() -> Problem:
    return Problem(
        400,
        "malformed-json",
        "Malformed JSON",
        f"the body nests arrays or objects deeper than {MAX_JSON_DEPTH} levels",
    )


def _integral_as_int(value: object, depth: int = 0) -> object:
    """`value` (decoded JSON) with every number that has no fractional part an int."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict | list) and depth >= MAX_JSON_DEPTH:
        raise _too_deep()
    if isinstance(value, dict):
        return {key: _integral_as_int(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list):
        return [_integral_as_int(item, depth + 1) for item in value]
    return value


def _nul_at(document: object) -> str | None:
    """The JSON path of the first key or string of `document` (decoded JSON) holding a
    NUL character, or None; walked without recursion."""
    stack: list[tuple[str, object]] = [("$", document)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                return path
        elif isinstance(value, dict):
            for key, item in reversed(value.items()):
                if "\x00" in key:
                    return path
                stack.append((f"{path}.{key}", item))
        elif isinstance(value, list):
            stack.extend(
                (f"{path}[{index}]", item) for index, item in reversed(list(enumerate(value)))
            )
    return None


def _refuse_nul(raw: bytes) -> None:
    """A NUL character (JSON's `\\u0000`) names no id, command, path or value anyone
    means, and PostgreSQL stores none: refused where the body holds one."""
    if b"\\u0000" not in raw:
        return
    try:
        where = _nul_at(msgspec.json.decode(raw))
    except (msgspec.DecodeError, RecursionError):
        return  # not JSON: decoding says so
    if where is not None:
        raise invalid_body(where, "holds a NUL character (\\u0000)")


def decode_body(raw: bytes, decoder: msgspec.json.Decoder[T]) -> T:
    _refuse_nul(raw)
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as error:
        refused = error
    except msgspec.DecodeError as error:
        raise _malformed(error) from None
    except RecursionError:
        raise _too_deep() from None
    # JSON has one kind of number: to JSON Schema (and so to the OpenAPI document) 445.0
    # and 4.45e2 are the integer 445, which msgspec's typed decoding refuses where an int
    # is due. Refused once, the body is read again with such numbers as ints; what is
    # still wrong then is the error to report.
    try:
        untyped = msgspec.json.decode(raw)
    except msgspec.ValidationError:
        # Untyped decoding refuses a number past a float's range too, but at "$[...]":
        # the typed decoding's error names the field that holds it.
        raise _invalid(refused) from None
    except msgspec.DecodeError as error:
        # Typed decoding stops at the first value of the wrong type: JSON may break later.
        raise _malformed(error) from None
    except RecursionError:  # untyped decoding walks whatever nesting it is sent
        raise _too_deep() from None
    try:
        relaxed: T = msgspec.convert(
            _integral_as_int(untyped),
            decoder.type,
            strict=decoder.strict,
            dec_hook=decoder.dec_hook,
        )
    except msgspec.ValidationError as error:
        refused = error
    except RecursionError:  # converting walks the nesting too
        raise _too_deep() from None
    else:
        return relaxed
    raise _invalid(refused) from None


def _invalid(error: msgspec.ValidationError) -> Problem:
    name, reason = describe_error(error)
    return invalid_body(name, reason)


async def read_json(request: web.Request, decoder: msgspec.json.Decoder[T]) -> T:
    return decode_body(await read_body(request), decoder)


@dataclass(frozen=True, slots=True)
class PatchFields:
    """What makes a PATCH body change anything: one of `present` given (a null included,
    where null means something), or one of `not_null` given and not null (where null
    means "unchanged"). A body that changes nothing (`{}`) is refused: it is a client's
    mistake, not a change to record."""

    present: Sequence[str] = ()
    not_null: Sequence[str] = ()

    def json_schema(self) -> dict[str, Any]:
        """The same rule for the OpenAPI document (`msgspec.Meta(extra_json_schema=...)`)."""
        alternatives: list[dict[str, Any]] = [{"required": [name]} for name in self.present]
        alternatives += [
            {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
            for name in self.not_null
        ]
        return {"anyOf": alternatives}

    def check(self, body: msgspec.Struct) -> None:
        if any(getattr(body, name) is not msgspec.UNSET for name in self.present):
            return
        if any(getattr(body, name) is not None for name in self.not_null):
            return
        names = ", ".join([*self.present, *self.not_null])
        raise invalid_body("$", f"nothing to change: give at least one of {names}")
