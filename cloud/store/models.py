"""The model registry's rows: one per upload, the file itself stored by its sha256."""

from __future__ import annotations

from typing import Any

import msgspec
from sqlalchemy import Row, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store.records import ModelPage, ModelRecord, ModelTensor, NewModel
from cloud.store.schema import models

_TENSORS = msgspec.json.Decoder(list[tuple[str, str, list[int | str | None]]])


def _encode(tensors: tuple[ModelTensor, ...]) -> bytes:
    return msgspec.json.encode([[t.name, t.dtype, list(t.shape)] for t in tensors])


def _decode(document: bytes) -> tuple[ModelTensor, ...]:
    return tuple(
        ModelTensor(name, dtype, tuple(shape)) for name, dtype, shape in _TENSORS.decode(document)
    )


def model_from_row(row: Row[Any]) -> ModelRecord:
    return ModelRecord(
        model_id=row.id,
        tenant_id=row.tenant_id,
        name=row.name,
        sha256=row.sha256,
        size_bytes=int(row.size_bytes),
        opset=int(row.opset),
        inputs=_decode(row.inputs),
        outputs=_decode(row.outputs),
        created_at=float(row.created_at),
    )


async def insert_model(
    connection: AsyncConnection, model_id: str, tenant_id: str, model: NewModel, now: float
) -> ModelRecord:
    values = {
        "id": model_id,
        "tenant_id": tenant_id,
        "name": model.name,
        "sha256": model.sha256,
        "size_bytes": model.size_bytes,
        "opset": model.opset,
        "inputs": _encode(model.inputs),
        "outputs": _encode(model.outputs),
        "created_at": now,
    }
    await connection.execute(insert(models).values(**values))
    return ModelRecord(
        model_id=model_id,
        tenant_id=tenant_id,
        name=model.name,
        sha256=model.sha256,
        size_bytes=model.size_bytes,
        opset=model.opset,
        inputs=model.inputs,
        outputs=model.outputs,
        created_at=now,
    )


async def select_model(
    connection: AsyncConnection, model_id: str, tenant_id: str
) -> ModelRecord | None:
    query = select(models).where(models.c.id == model_id, models.c.tenant_id == tenant_id)
    row = (await connection.execute(query)).first()
    return None if row is None else model_from_row(row)


async def list_model_page(
    connection: AsyncConnection, tenant_id: str, *, limit: int, cursor: str | None
) -> ModelPage:
    """Newest first."""
    query = select(models).where(models.c.tenant_id == tenant_id)
    if cursor is not None:
        query = query.where(models.c.id < cursor)
    rows = (await connection.execute(query.order_by(models.c.id.desc()).limit(limit + 1))).all()
    items = tuple(model_from_row(row) for row in rows[:limit])
    return ModelPage(items, items[-1].model_id if len(rows) > limit else None)
