"""JSON request bodies decoded straight into msgspec types; every failure a problem.
And the other way: `json_response` encodes a msgspec type as the answer.

415 for a body that is not JSON by its Content-Type, 413 beyond the app's body limit
(aiohttp's `client_max_size`), 400 for malformed JSON, 422 naming the field at fault
(`invalid_params[].name` is a path such as `$.workers` or `$.affinity[0].values`).
"""

from __future__ import annotations

from typing import TypeVar

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


def decode_body(raw: bytes, decoder: msgspec.json.Decoder[T]) -> T:
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as error:
        name, reason = describe_error(error)
        raise invalid_body(name, reason) from None
    except msgspec.DecodeError as error:
        raise Problem(
            400, "malformed-json", "Malformed JSON", f"the body is not JSON: {error}"
        ) from None


async def read_json(request: web.Request, decoder: msgspec.json.Decoder[T]) -> T:
    return decode_body(await read_body(request), decoder)
