"""`GET /openapi.json`: OpenAPI 3.1, generated from the registered routes and the very
msgspec types their handlers decode and encode (never a hand-maintained copy).

Schemas come from `msgspec.json.schema_components`; query parameters are the fields
of each route's query Struct; the error answers every route can give (400 for a query
parameter it does not take, 401, 403, 404, 413/415/422 for bodies, 428 for bulk
destructive actions) are added from the route's access level, path, query and body.

The document says what the API holds requests to, as far as a JSON Schema can: a query
parameter is never null and its text has no control characters (`parse_query`'s rule),
a time is RFC 3339 (a pattern, since JSON Schema takes `format` as a note), a header
has its own schema, an event stream is described event by event (`data` a JSON
document), and `/metrics` and model downloads have the security they accept (a token
that shows more; a signature in `sig`). tests/api/test_openapi_schemathesis.py holds
the API to it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import msgspec
from aiohttp import web

from cloud.api.bulk_actions import destructive_action_of
from cloud.api.problems import problem_reply
from cloud.api.query import CLEAN_TEXT_PATTERN, RFC3339_PATTERN
from cloud.api.routes import JSON, REGISTERED_ROUTES, JsonObject, Reply, RequestHeader, Route
from cloud.store import WorkStateChanged
from shared import __version__
from shared.portable_patterns import portable
from shared.problems import CONFIRM_HEADER, CONFIRM_VALUE, ProblemBody

OPENAPI: web.AppKey[bytes] = web.AppKey("openapi", bytes)
EVENT_STREAM: Final = "text/event-stream"
REF_TEMPLATE: Final = "#/components/schemas/{name}"
_PATH_PARAMETER = re.compile(r"\{(?P<name>[^}:]+)\}")
# Documented alongside the routes although no route's signature names them.
EXTRA_TYPES: Final = (WorkStateChanged,)

_ERRORS: Final = {
    400: "Bad request: malformed JSON, a bad or unknown query parameter, or a bad header",
    401: "Missing or invalid bearer token",
    403: "Not allowed for this tenant",
    404: "Not found (also another tenant's id, or an unknown ?tenant=)",
    413: "Body larger than 1 MiB",
    415: "Body is not application/json",
    422: "Body does not match the schema; invalid_params names the field",
    428: (
        "The admin did cloud.destructive_actions_per_minute revocations, drains and "
        "cancellations in the last minute: confirm with Greenfed-Confirm: bulk"
    ),
    429: (
        "Too many attempts at this bearer token's secret not yet verified here: "
        "try again after Retry-After seconds"
    ),
    500: "Internal error",
    409: (
        "Ambiguous reference: the name or id prefix matches several (listed in the detail; "
        "invalid_params names `id`)"
    ),
}
# The `{id}` of a job's or deployment's path takes a name or an id prefix too
# (cloud/api/references.py); the PUT of apply takes the name (cloud/api/apply.py).
_WORK_PATHS: Final = ("/v1/jobs/{id}", "/v1/deployments/{id}")
_WORK_REFERENCE: Final = (
    "The id, the name (its live work; else the newest) or a unique prefix of the id "
    "(4 characters or more)"
)
_CONFIRM_HEADER: Final = RequestHeader(
    CONFIRM_HEADER,
    "An admin past cloud.destructive_actions_per_minute confirms a bulk destructive "
    "action with it (a tenant cancelling its own work never needs it).",
    {"type": "string", "enum": [CONFIRM_VALUE]},
)
_SCHEMA_KEYS_OF_THEIR_OWN: Final = frozenset({"enum", "const", "pattern", "format"})


def _types(routes: Iterable[Route]) -> list[Any]:
    found: list[Any] = [ProblemBody, *EXTRA_TYPES]
    for route in routes:
        body = route.body if route.body_media_type == JSON else None
        candidates = [body, route.query, *(reply.body for reply in route.replies)]
        for candidate in candidates:
            if candidate is not None and candidate not in found:
                found.append(candidate)
    return found


def _reply(reply: Reply, schema: dict[str, Any]) -> dict[str, object]:
    answer: dict[str, object] = {"description": reply.description}
    if reply.body is not None and reply.content_type == EVENT_STREAM:
        answer["content"] = {EVENT_STREAM: {"schema": _server_sent_event(schema)}}
    elif reply.body is not None:
        answer["content"] = {reply.content_type: {"schema": schema}}
    elif reply.content_type != JSON:  # a body of its own kind (CSV, a file): no schema
        answer["content"] = {reply.content_type: {}}
    if reply.headers:
        answer["headers"] = {name: {"schema": {"type": "string"}} for name in reply.headers}
    return answer


def _responses(
    replies: Iterable[Reply], schemas: dict[Any, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """One response per status: replies of the same status (JSON, or CSV on request) are
    one response with each one's media type and headers, their descriptions joined."""
    responses: dict[str, dict[str, Any]] = {}
    for reply in replies:
        answer = _reply(reply, schemas.get(reply.body, {}))
        merged = responses.setdefault(str(reply.status), {})
        if reply.content_type in merged.get("content", {}):
            raise ValueError(f"two {reply.status} replies of {reply.content_type}: make one")
        if "description" in merged:
            merged["description"] = f"{merged['description']}. {answer['description']}"
        else:
            merged["description"] = answer["description"]
        for part in ("content", "headers"):
            if part in answer:
                merged.setdefault(part, {}).update(answer[part])
    return responses


def _query_parameters(
    query: type, schema: dict[str, Any], components: dict[str, Any]
) -> list[dict[str, object]]:
    """One parameter per field of the query Struct, with the field's own schema."""
    name = schema["$ref"].rsplit("/", 1)[-1]
    component = components[name]
    required = set(component.get("required", ()))
    parameters: list[dict[str, object]] = []
    for field in msgspec.structs.fields(query):
        field_schema = _query_value_schema(dict(component["properties"][field.encode_name]))
        description = field_schema.pop("description", None)
        parameter: dict[str, object] = {
            "name": field.encode_name,
            "in": "query",
            "required": field.encode_name in required,
            "schema": field_schema,
        }
        if description:
            parameter["description"] = description
        parameters.append(parameter)
    return parameters


def _server_sent_event(data_schema: dict[str, Any]) -> dict[str, Any]:
    """One event of a text/event-stream (OpenAPI 3.1 describes a stream by its events):
    its fields, `data` a JSON document of `data_schema`."""
    return {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "event": {"type": "string"},
            "data": {
                "type": "string",
                "contentMediaType": JSON,
                "contentSchema": data_schema,
            },
            "retry": {"type": "integer", "minimum": 0},
        },
    }


def _query_value_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A query parameter's schema from its field's: an optional parameter is left out,
    never sent as null; free text is held to what `parse_query` takes (no control
    characters or undecodable bytes)."""
    alternatives = schema.pop("anyOf", None)
    if alternatives is not None:
        kept = [alternative for alternative in alternatives if alternative != {"type": "null"}]
        schema.update(kept[0] if len(kept) == 1 else {"anyOf": kept})
    if schema.get("default", 0) is None:
        del schema["default"]
    if schema.get("type") == "string" and not _SCHEMA_KEYS_OF_THEIR_OWN & schema.keys():
        schema["pattern"] = CLEAN_TEXT_PATTERN
    return schema


def _field_names(struct_type: type) -> set[str]:
    return {field.encode_name for field in msgspec.structs.fields(struct_type)}


def _header_parameter(header: RequestHeader) -> dict[str, object]:
    return {
        "name": header.name,
        "in": "header",
        "required": False,
        "schema": header.schema,
        "description": header.description,
    }


def _operation(
    route: Route, schemas: dict[Any, dict[str, Any]], components: dict[str, Any]
) -> dict[str, object]:
    parameters: list[dict[str, object]] = [
        # No id holds control characters (cloud/api/auth.py answers 404 for one).
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": {"type": "string", "pattern": CLEAN_TEXT_PATTERN},
        }
        for name in _PATH_PARAMETER.findall(route.path)
    ]
    by_reference = route.path.startswith(_WORK_PATHS) and route.method != "PUT"
    if by_reference:
        parameters[0]["description"] = _WORK_REFERENCE
    if route.query is not None:
        parameters += _query_parameters(route.query, schemas[route.query], components)
    destructive = destructive_action_of(route.handler) is not None
    headers = (*route.headers, _CONFIRM_HEADER) if destructive else route.headers
    parameters += [_header_parameter(header) for header in headers]
    responses: dict[str, object] = dict(_responses(route.replies, schemas))
    errors: list[int] = [500]
    if route.access != "public":
        errors += [401, 429]  # 429: Store.check_token's scrypt budget per token id
    if route.access in ("admin", "signed"):  # signed: a signature that is not ours
        errors.append(403)
    if "{" in route.path:
        errors.append(404)
    if by_reference:
        errors.append(409)
    if route.body is not None:
        errors += [413, 415, 422]  # 400 too (malformed JSON): every route has it
    # Every route: a query parameter it does not take (one that declares no query takes
    # none: cloud/api/routes.py), besides a bad one, a bad header or malformed JSON.
    errors.append(400)
    if route.query is not None and "tenant" in _field_names(route.query):
        errors += [403, 404]  # another tenant's, for a tenant; no such tenant, for the admin
    if destructive:
        errors.append(428)
    for status in sorted(set(errors)):
        error = problem_reply(status, _ERRORS[status])
        responses.setdefault(str(status), _reply(error, schemas[ProblemBody]))
    operation: dict[str, object] = {
        "operationId": route.handler.__name__,
        "summary": route.summary,
        "tags": [route.tag],
        "responses": responses,
    }
    if route.description:
        operation["description"] = route.description
    if parameters:
        operation["parameters"] = parameters
    if route.body is not None:
        schema = (
            schemas[route.body]
            if route.body_media_type == JSON
            else {"type": "string", "format": "binary"}
        )
        operation["requestBody"] = {
            "required": route.body_required,
            "content": {route.body_media_type: {"schema": schema}},
        }
    if route.access == "public":
        operation["security"] = []
    elif route.access == "scrape":
        operation["security"] = [{}, {"scrape": []}]  # optional: a token shows more
    elif route.access == "signed":
        operation["security"] = [{"bearer": []}, {"signature": []}]
    return operation


def _refs(node: object) -> Iterable[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value.rsplit("/", 1)[-1]
            else:
                yield from _refs(value)
    elif isinstance(node, list | tuple):
        for item in node:
            yield from _refs(item)


def _reachable(components: dict[str, Any], roots: Sequence[object]) -> dict[str, Any]:
    """The components that something documented refers to (query Structs are inlined as
    parameters, so theirs would otherwise linger), plus the extra types."""
    kept: set[str] = set()
    pending = [name for root in roots for name in _refs(root)]
    pending += [getattr(extra, "__name__", "") for extra in EXTRA_TYPES]
    while pending:
        name = pending.pop()
        if name in kept or name not in components:
            continue
        kept.add(name)
        pending.extend(_refs(components[name]))
    return {name: schema for name, schema in sorted(components.items()) if name in kept}


def _each_object(node: object, visit: Callable[[dict[str, Any]], None]) -> None:
    """Call `visit` on every JSON object in `node`, each before what it holds (which
    `visit` may change in place)."""
    if isinstance(node, dict):
        visit(node)
        for value in node.values():
            _each_object(value, visit)
    elif isinstance(node, list):
        for item in node:
            _each_object(item, visit)


def _with_date_time_pattern(schema: dict[str, Any]) -> None:
    """A date-time string gets the RFC 3339 pattern the API holds times to: JSON Schema
    treats a format as a note, a pattern as a rule."""
    if schema.get("format") == "date-time" and "pattern" not in schema:
        schema["pattern"] = RFC3339_PATTERN


# What every string and key of a body is held to (cloud/api/bodies.py refuses a NUL).
NO_NUL_PATTERN: Final = "^[^\\u0000]*$"


def _without_nul(schema: dict[str, Any]) -> None:
    """A free string, and a map's keys, hold no NUL: no command, path or name means one,
    and PostgreSQL stores none."""
    if schema.get("type") == "string" and not _SCHEMA_KEYS_OF_THEIR_OWN & schema.keys():
        schema["pattern"] = NO_NUL_PATTERN
    if schema.get("type") == "object" and "additionalProperties" in schema:
        schema.setdefault("propertyNames", {"pattern": NO_NUL_PATTERN})


def _without_sentinel_default(schema: dict[str, Any]) -> None:
    """Drop a default below its own minimum: it only marks "not given", and the struct
    fills the real value in (DeploymentSpec.replicas: autoscale's min_replicas, else
    1); no client could send it."""
    default, minimum = schema.get("default"), schema.get("minimum")
    if isinstance(default, int) and isinstance(minimum, int) and default < minimum:
        del schema["default"]


def openapi_document(routes: Sequence[Route]) -> dict[str, object]:
    types = _types(routes)
    refs, components = msgspec.json.schema_components(types, ref_template=REF_TEMPLATE)
    schemas = dict(zip(types, refs, strict=True))
    paths: dict[str, dict[str, object]] = {}
    for route in routes:
        path = _PATH_PARAMETER.sub(lambda m: "{" + m.group("name") + "}", route.path)
        paths.setdefault(path, {})[route.method.lower()] = _operation(route, schemas, components)
    tags = sorted({route.tag for route in routes})
    components = _reachable(components, [paths])
    _each_object([paths, components], _with_date_time_pattern)
    _each_object(components, _without_nul)
    _each_object(components, _without_sentinel_default)
    paths, components = portable(paths), portable(components)
    return {
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "info": {
            "title": "greenfed control plane",
            "version": __version__,
            "description": (
                "Submit training jobs and inference deployments, follow them, and see why "
                "they run where they do. Errors are application/problem+json (RFC 9457)."
            ),
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "tags": [{"name": tag} for tag in tags],
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A tenant token, gf_<token id>_<secret>.",
                },
                "signature": {
                    "type": "apiKey",
                    "in": "query",
                    "name": "sig",
                    "description": (
                        "A model download's signature: the control plane puts it in the "
                        "URLs it sends agents (blob_url)."
                    ),
                },
                "scrape": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": (
                        "On /metrics: the metrics scrape token (gfm_..., written to "
                        "<store data dir>/metrics-token) or an admin's tenant token."
                    ),
                },
            },
        },
        "security": [{"bearer": []}],
    }


def publish(app: web.Application) -> None:
    """Generate the document from every route registered so far (call it last)."""
    routes: list[Route] = app[REGISTERED_ROUTES]
    app[OPENAPI] = msgspec.json.encode(openapi_document(routes))


async def openapi_json(request: web.Request) -> web.Response:
    return web.Response(body=request.app[OPENAPI], content_type="application/json")


ROUTES: Final = (
    Route(
        "GET",
        "/openapi.json",
        openapi_json,
        "This API's OpenAPI 3.1 document",
        "public",
        "operations",
        replies=(Reply(200, "The OpenAPI document", JsonObject),),
    ),
)
