"""Where uploaded models are checked: a thread pool of their own, and a bound on the
uploads in progress.

The check (`cloud/models/inspect.py`) is Python: seconds of CPU for a file of many
small fields. On asyncio's default pool it would hold the threads the scheduling
loop's passes run on (`cloud/loop/loop.py`), and a tenant's burst of uploads would
stall scheduling for every tenant; on a small pool of its own it only waits for other
checks. The bound on uploads being received or checked, overall and per tenant, keeps
that wait short and the staged files few (each up to `cloud.max_model_bytes` on disk);
past it an upload is refused at once, to be retried.
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

from cloud.models.inspect import ModelInfo, inspect_model
from cloud.tenant_slots import TenantSlots

CHECK_THREADS: Final = 2  # checks run at once; the others wait their turn
MAX_UPLOADS: Final = 4  # received or being checked, all tenants together
MAX_UPLOADS_PER_TENANT: Final = 2
RETRY_AFTER_S: Final = 10  # about one check of a large model


class UploadsBusyError(Exception):
    """No upload slot is free; `per_tenant`: the tenant holds its share (else the
    server is at its bound). The message says which, for the uploader."""

    def __init__(self, message: str, *, per_tenant: bool) -> None:
        super().__init__(message)
        self.per_tenant = per_tenant
        self.retry_after_s = RETRY_AFTER_S


class ModelChecks:
    def __init__(
        self,
        *,
        threads: int = CHECK_THREADS,
        max_uploads: int = MAX_UPLOADS,
        max_uploads_per_tenant: int = MAX_UPLOADS_PER_TENANT,
    ) -> None:
        # Threads start on the first check and end with this object (the app's blob
        # store, cloud/app.py) or the process: no shutdown to call.
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="model-check")
        self._uploads = TenantSlots(most=max_uploads, most_per_tenant=max_uploads_per_tenant)

    def upload_slot(self, tenant_id: str) -> contextlib.AbstractContextManager[None]:
        """Hold an upload slot for the block; raises `UploadsBusyError` when none is free."""
        return self._uploads.slot(tenant_id, self._busy)

    def _busy(self, per_tenant: bool) -> UploadsBusyError:
        if per_tenant:
            return UploadsBusyError(
                f"this tenant has its share of uploads being received or checked (at most "
                f"{self._uploads.most_per_tenant}; fewer while the server is nearly at its "
                "bound, the last one kept for a tenant with none); retry when one is done",
                per_tenant=True,
            )
        return UploadsBusyError(
            f"{self._uploads.most} uploads are being received or checked; retry later",
            per_tenant=False,
        )

    async def inspect(self, path: Path) -> ModelInfo:
        """`inspect_model` on this pool; raises `InvalidModelError` with the reason."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, inspect_model, path)
