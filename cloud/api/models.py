"""`/v1/models`: upload ONNX models, list and describe them, download their files.

`POST /v1/models?name=NAME` takes the raw `.onnx` file as the body
(`application/octet-stream`), streamed to disk and refused past
`cloud.max_model_bytes`; the file is checked with `onnx.checker`, described (opset,
inputs, outputs) and stored by its sha256. A deployment names a model by its id.
Uploads in progress are bounded, per tenant (429) and overall (503), and checked on a
pool of their own, never on the one the scheduling loop's passes use.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from typing import Annotated, Final

import msgspec
from aiohttp import web

from cloud.api.auth import tenant_of
from cloud.api.bodies import json_response, payload_too_large
from cloud.api.file_responses import ProblemFileResponse
from cloud.api.problems import Problem, problem_reply
from cloud.api.query import parse_query
from cloud.api.routes import Reply, Route
from cloud.app_keys import MODEL_BLOBS, MODEL_URL_SIGNER, STORE
from cloud.models.blobs import BlobStore, ModelTooLargeError, StagedBlob
from cloud.models.checking import UploadsBusyError
from cloud.models.inspect import InvalidModelError, ModelInfo
from cloud.models.views import ModelList, ModelView, TensorView
from cloud.store import ModelRecord, ModelTensor, NewModel
from cloud.work.specs import ID_PATTERN, Name
from shared.clock import utc_from_epoch
from shared.problems import InvalidParam

ONNX_MEDIA_TYPES: Final = ("application/octet-stream", "application/onnx")
_CHUNK_BYTES = 1 << 16
SHA256_HEADER: Final = "X-Greenfed-SHA256"  # hex sha256 of the whole file

MODEL_ID_PATTERN: Final = ID_PATTERN
ModelId = Annotated[str, msgspec.Meta(pattern=MODEL_ID_PATTERN)]
_MODEL_ID = re.compile(MODEL_ID_PATTERN)


class UploadQuery(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Name  # a spec's name, in its words


class ModelListQuery(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    limit: Annotated[int, msgspec.Meta(ge=1, le=500)] = 50
    cursor: Annotated[
        ModelId | None, msgspec.Meta(description="The next_cursor of the previous page.")
    ] = None


def _tensors(items: tuple[ModelTensor, ...]) -> tuple[TensorView, ...]:
    return tuple(TensorView(name=t.name, dtype=t.dtype, shape=t.shape) for t in items)


def _view(record: ModelRecord) -> ModelView:
    return ModelView(
        id=record.model_id,
        name=record.name,
        sha256=record.sha256,
        size_bytes=record.size_bytes,
        opset=record.opset,
        inputs=_tensors(record.inputs),
        outputs=_tensors(record.outputs),
        created_at=utc_from_epoch(record.created_at),
        blob_url=f"/v1/models/{record.model_id}/blob",
    )


def _not_found(model_id: str) -> Problem:
    return Problem(404, "model-not-found", "Model not found", f"no model {model_id!r}")


async def upload_model(request: web.Request) -> web.Response:
    tenant = tenant_of(request)
    query = parse_query(request, UploadQuery)
    if request.content_type not in ONNX_MEDIA_TYPES:
        raise Problem(
            415,
            "unsupported-media-type",
            "Unsupported Media Type",
            f"send the .onnx file as application/octet-stream, not {request.content_type}",
        )
    blobs = request.app[MODEL_BLOBS]
    if request.content_length is not None and request.content_length > blobs.max_bytes:
        raise payload_too_large(
            f"the body has {request.content_length} bytes; at most {blobs.max_bytes} are "
            "accepted (cloud.max_model_bytes)"
        )
    try:
        with blobs.checks.upload_slot(tenant.tenant_id):
            staged, info = await _stage_and_check(blobs, request)
    except UploadsBusyError as error:
        raise Problem(
            429 if error.per_tenant else 503,
            "too-many-uploads",
            "Too many uploads in progress",
            str(error),
            headers={"Retry-After": str(error.retry_after_s)},
        ) from None
    await blobs.keep(staged)
    record = await request.app[STORE].create_model(
        tenant.tenant_id,
        NewModel(
            name=query.name,
            sha256=staged.sha256,
            size_bytes=staged.size_bytes,
            opset=info.opset,
            inputs=info.inputs,
            outputs=info.outputs,
        ),
    )
    response = json_response(_view(record), status=201)
    response.headers["Location"] = f"/v1/models/{record.model_id}"
    return response


async def _stage_and_check(blobs: BlobStore, request: web.Request) -> tuple[StagedBlob, ModelInfo]:
    """The body on disk and the model's description; raises a 413 or 422 problem (and
    keeps nothing) where it is too large or not a model."""
    try:
        staged = await blobs.stage(request.content.iter_chunked(_CHUNK_BYTES))
    except ModelTooLargeError as error:
        raise payload_too_large(str(error)) from None
    try:
        if staged.size_bytes == 0:
            raise InvalidModelError("the body is empty")
        info = await blobs.checks.inspect(staged.path)
    except InvalidModelError as error:
        await blobs.discard(staged.path)
        raise Problem(
            422,
            "invalid-model",
            "Not a valid ONNX model",
            str(error),
            (InvalidParam("$", str(error)),),
        ) from None
    except BaseException:
        await blobs.discard(staged.path)
        raise
    return staged, info


async def list_models(request: web.Request) -> web.Response:
    tenant = tenant_of(request)
    query = parse_query(request, ModelListQuery)
    page = await request.app[STORE].list_models(
        tenant.tenant_id, limit=query.limit, cursor=query.cursor
    )
    items = tuple(_view(record) for record in page.items)
    return json_response(ModelList(items=items, count=len(items), next_cursor=page.next_cursor))


async def _find(request: web.Request) -> ModelRecord:
    model_id = request.match_info["id"]
    tenant_id = tenant_of(request).tenant_id
    # An id that is not a ULID names no model; it never reaches the store's SQL.
    record = (
        await request.app[STORE].get_model(tenant_id, model_id)
        if _MODEL_ID.match(model_id)
        else None
    )
    if record is None:
        raise _not_found(model_id)
    return record


async def get_model(request: web.Request) -> web.Response:
    return json_response(_view(await _find(request)))


async def _find_signed(request: web.Request) -> ModelRecord:
    """An agent's download: any tenant's model, if the signature is the one we made.

    Every refusal is the same 403 (an unknown id, a malformed, undecodable or empty
    `sig`, a signature for another file): an anonymous caller learns nothing about
    which model ids exist."""
    model_id = request.match_info["id"]
    signature = request.query.get("sig", "")
    record = (
        (await request.app[STORE].models_by_id([model_id])).get(model_id)
        if _MODEL_ID.match(model_id)
        else None
    )
    signer = request.app[MODEL_URL_SIGNER]
    if record is None or not signer.verify(record.model_id, record.sha256, signature):
        raise Problem(403, "bad-signature", "Forbidden", "the download signature is not valid")
    return record


async def get_model_blob(request: web.Request) -> web.StreamResponse:
    record = await (_find_signed(request) if "sig" in request.query else _find(request))
    path = request.app[MODEL_BLOBS].path(record.sha256)
    if not await asyncio.to_thread(path.is_file):
        raise Problem(
            410,
            "model-file-gone",
            "Model file gone",
            f"the file of model {record.model_id} (sha256 {record.sha256}) is not in this "
            "control plane's data directory",
        )
    # aiohttp answers Range, If-Range and conditional requests itself (with its own ETag
    # from the file's size and mtime), its refusals as problems; the digest lets a
    # downloader verify what it got.
    return ProblemFileResponse(
        path,
        headers={
            "Content-Type": "application/octet-stream",
            SHA256_HEADER: record.sha256,
            "Content-Disposition": f'attachment; filename="{record.name}.onnx"',
        },
    )


_PROBLEM_REPLY = problem_reply(422, "Not a valid ONNX model; detail says why")
_BUSY_REPLIES: Final = tuple(
    dataclasses.replace(problem_reply(status, description), headers=("Retry-After",))
    for status, description in (
        (429, "The tenant has as many uploads in progress as it may: retry after one ends"),
        (503, "The server has as many uploads in progress as it checks: retry later"),
    )
)

ROUTES: Final = (
    Route(
        "POST",
        "/v1/models",
        upload_model,
        "Upload an ONNX model (the raw file as the body)",
        "tenant",
        "models",
        query=UploadQuery,
        body=bytes,
        body_media_type="application/octet-stream",
        replies=(
            Reply(201, "The model, checked and described", ModelView),
            _PROBLEM_REPLY,
            *_BUSY_REPLIES,
        ),
    ),
    Route(
        "GET",
        "/v1/models",
        list_models,
        "List the tenant's models, newest first",
        "tenant",
        "models",
        query=ModelListQuery,
        replies=(Reply(200, "A page of models", ModelList),),
    ),
    Route(
        "GET",
        "/v1/models/{id}",
        get_model,
        "A model: its checksum, opset, inputs and outputs",
        "tenant",
        "models",
        replies=(Reply(200, "The model", ModelView),),
    ),
    Route(
        "GET",
        "/v1/models/{id}/blob",
        get_model_blob,
        "Download the model file (Range requests supported); agents use a signed URL",
        "signed",
        "models",
        replies=(
            Reply(200, "The .onnx file", None, "application/octet-stream", (SHA256_HEADER,)),
            Reply(206, "Part of the file (Range)", None, "application/octet-stream"),
            problem_reply(410, "The model's file is not in this replica's data directory"),
            problem_reply(412, "If-Match or If-Unmodified-Since does not hold for the file"),
            problem_reply(416, "The Range does not fit the file (Content-Range says its size)"),
        ),
    ),
)
