"""`/openapi.json`: generated from the routes and msgspec types, and complete."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import msgspec

from cloud.api.routes import REGISTERED_ROUTES
from cloud.app import create_app
from cloud.work.specs import DeploymentSpec, TrainingJobSpec
from cloud.work.views import TenantCreate
from shared.settings import Settings
from tests.api.support import Api, deployment_spec, job_spec
from tests.shared.test_portable_patterns import patterns, refused_by_re2

_PARAMETER = re.compile(r"\{([^}]+)\}")


def refs(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)


def validator(document: dict[str, Any], name: str) -> jsonschema.Draft202012Validator:
    root = {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
    return jsonschema.Draft202012Validator(root)


async def test_the_document_is_openapi_3_1_and_covers_every_route(api: Api) -> None:
    response = await api.client.get("/openapi.json")  # public
    assert response.status == 200
    document: dict[str, Any] = await response.json()
    assert document["openapi"] == "3.1.0"
    assert document["info"]["title"]
    assert document["info"]["version"]
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert document["security"] == [{"bearer": []}]

    # Every route the app serves is documented, with its method.
    served = set()
    for route in api.app.router.routes():
        # HEAD comes with GET; "*" answers every other method with 405 and an exact Allow.
        if route.method in ("HEAD", "*"):
            continue
        path = route.resource.canonical if route.resource is not None else ""
        served.add((route.method.lower(), path))
    documented = {(method, path) for path, item in document["paths"].items() for method in item}
    assert served == documented
    for path in ("/v1/jobs", "/v1/jobs/{id}/logs", "/v1/deployments", "/v1/tenants", "/v1/events"):
        assert path in document["paths"]

    operation_ids = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            operation_ids.append(operation["operationId"])
            assert operation["summary"]
            assert operation["responses"], (method, path)
            for status in operation["responses"]:
                assert re.fullmatch(r"[1-5]\d\d", status), (method, path, status)
            declared = {p["name"] for p in operation.get("parameters", ()) if p["in"] == "path"}
            assert declared == set(_PARAMETER.findall(path)), (method, path)
            public = operation.get("security") == []
            assert public == (
                path in ("/healthz", "/readyz", "/openapi.json", "/v1/schemas")
                # the dashboard page and its files hold no data (the page calls the API)
                or path in ("/ui", "/ui/", "/ui/static/{name}")
                # a node enrolling has a join token in the body, no bearer token, and
                # reads the public key its identity proof is made against
                or path == "/v1/nodes/enrol"
            )
            if not public:
                assert "401" in operation["responses"]
    assert len(operation_ids) == len(set(operation_ids))
    # /metrics: anyone, and a token (the scrape token, an admin's) shows more.
    assert document["paths"]["/metrics"]["get"]["security"] == [{}, {"scrape": []}]
    # A model download: a bearer token, or the signature the control plane made (?sig=).
    blob = document["paths"]["/v1/models/{id}/blob"]["get"]
    assert blob["security"] == [{"bearer": []}, {"signature": []}]
    signature = document["components"]["securitySchemes"]["signature"]
    assert (signature["type"], signature["in"], signature["name"]) == ("apiKey", "query", "sig")
    # Rotating a token: the body may be left out.
    rotate = document["paths"]["/v1/tokens/{token_id}/rotate"]["post"]
    assert rotate["requestBody"]["required"] is False

    # Every reference resolves; every component is a valid JSON Schema (2020-12).
    schemas = document["components"]["schemas"]
    for ref in refs(document):
        assert ref.startswith("#/components/schemas/")
        assert ref.rsplit("/", 1)[1] in schemas, ref
    for schema in schemas.values():
        jsonschema.Draft202012Validator.check_schema(schema)

    submit = document["paths"]["/v1/jobs"]["post"]
    assert submit["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/TrainingJobSpec"
    }
    assert {"201", "200", "401", "403", "409", "413", "415", "422"} <= set(submit["responses"])
    headers = {p["name"] for p in submit["parameters"] if p["in"] == "header"}
    assert headers == {"Idempotency-Key"}
    listing = {p["name"] for p in document["paths"]["/v1/jobs"]["get"]["parameters"]}
    assert listing == {"state", "priority", "limit", "cursor", "tenant"}


async def test_the_published_schemas_accept_and_refuse_what_the_api_does(api: Api) -> None:
    document: dict[str, Any] = await (await api.client.get("/openapi.json")).json()
    training = validator(document, "TrainingJobSpec")
    deployment = validator(document, "DeploymentSpec")
    good_job = job_spec(workers=2, deadline="2030-01-01T00:00:00Z", start_window="20:00-06:00")
    training.validate(good_job)
    deployment.validate(
        deployment_spec("01JE0ABCDEFGHJKMNPQRSTVWXY", providers=["QNNExecutionProvider"])
    )
    for bad in (
        job_spec(wokers=2),
        job_spec(workers=0),
        job_spec(start_window="25:00-06:00"),
        {"command": ["a"]},
    ):
        assert not training.is_valid(bad), bad
    # The responses match their schemas too.
    token = await api.tenant("acme")
    response = await api.submit(token, good_job)
    validator(document, "JobView").validate(await response.json())
    listed = await (await api.get(token, "/v1/jobs")).json()
    validator(document, "JobList").validate(listed)
    problem = await (await api.submit(token, job_spec(workers="x"))).json(
        content_type="application/problem+json"
    )
    validator(document, "ProblemBody").validate(problem)
    assert msgspec.json.decode(msgspec.json.encode(problem))["invalid_params"]


def test_the_rest_guide_documents_every_route_and_spec_field() -> None:

    text = (Path(__file__).resolve().parents[2] / "docs" / "rest.md").read_text()
    app = create_app(Settings())  # not started: only its routes are read
    missing = [route.path for route in app[REGISTERED_ROUTES] if route.path not in text]
    assert missing == []
    for struct in (TrainingJobSpec, DeploymentSpec, TenantCreate):
        fields = [f.name for f in msgspec.structs.fields(struct) if f"`{f.name}`" not in text]
        assert fields == [], f"docs/rest.md does not document {struct.__name__} fields {fields}"


async def test_every_pattern_of_the_document_compiles_under_re2(api: Api) -> None:
    document: dict[str, Any] = await (await api.client.get("/openapi.json")).json()
    found = set(patterns(document))
    assert len(found) > 5
    assert refused_by_re2(found) == []


async def test_every_declared_reply_keeps_its_media_type_and_headers(api: Api) -> None:
    """Two replies of one status (JSON, or CSV on request: /v1/usage) are both documented:
    no route's declared media type or header is lost to another of the same status."""
    document: dict[str, Any] = await (await api.client.get("/openapi.json")).json()
    lost = []
    for route in api.app[REGISTERED_ROUTES]:
        responses = document["paths"][route.path][route.method.lower()]["responses"]
        for reply in route.replies:
            response = responses[str(reply.status)]
            declares_media = reply.body is not None or reply.content_type != "application/json"
            if declares_media and reply.content_type not in response.get("content", {}):
                lost.append((route.method, route.path, reply.status, reply.content_type))
            for header in reply.headers:
                if header not in response.get("headers", {}):
                    lost.append((route.method, route.path, reply.status, header))
    assert lost == []
    usage = document["paths"]["/v1/usage"]["get"]["responses"]["200"]["content"]
    assert usage["application/json"]["schema"] == {"$ref": "#/components/schemas/UsageReport"}
    assert "text/csv" in usage
