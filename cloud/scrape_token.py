"""The metrics scrape token: what a Prometheus scrape sends to see the series of
`/metrics` that name a tenant, a job or a deployment (cloud/api/system.py).

It is a secret every replica of the store shares (`Store.shared_secret`), so one
token scrapes them all and a store restored from a backup keeps it. At every start
the control plane writes it to `<store data dir>/metrics-token`, owner-only, when
that file is missing or holds another token; Prometheus reads it from a copy
(`authorization: credentials_file:`, deploy/prometheus/prometheus.yml). It opens
nothing but `/metrics`.
"""

from __future__ import annotations

import asyncio
import hmac
from pathlib import Path
from typing import TYPE_CHECKING, Final

import structlog

from shared.settings import StoreSettings
from shared.token_files import metrics_token_path, read_token_file, write_secret

if TYPE_CHECKING:  # loaded by the app, which has the store anyway
    from cloud.store import Store

SECRET_NAME: Final = "metrics-scrape-token"
# Told apart from tenants' `gf_<id>_<secret>` bearer tokens at a glance.
TOKEN_PREFIX: Final = "gfm_"


async def bootstrap_scrape_token(store: Store, settings: StoreSettings) -> str:
    """The scrape token (made on the store's first use), written to its file if needed."""
    token = TOKEN_PREFIX + await store.shared_secret(SECRET_NAME)
    path = metrics_token_path(settings)
    await asyncio.to_thread(_write_if_changed, path, token)
    return token


def _write_if_changed(path: Path, token: str) -> None:
    log = structlog.get_logger("greenfed.cloud")
    try:
        if read_token_file(path) == token:
            return
        write_secret(path, token)
    except OSError as error:
        # Not fatal: the tenant series stay served to admin tokens.
        log.warning(
            "could not write the metrics scrape token",
            metrics_token_file=str(path),
            error=str(error),
        )
        return
    log.info("metrics scrape token written", metrics_token_file=str(path))


def is_scrape_token(candidate: str, token: str) -> bool:
    """Constant-time: a scrape with a wrong token learns nothing from the timing."""
    # surrogateescape: a header's undecodable bytes reach handlers as surrogates
    return hmac.compare_digest(candidate.encode("utf-8", "surrogateescape"), token.encode())
