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

from shared.settings import ConfigError, StoreSettings
from shared.token_files import (
    MalformedTokenFile,
    metrics_token_path,
    read_token_file,
    write_secret,
)

if TYPE_CHECKING:  # loaded by the app, which has the store anyway
    from cloud.store import Store

SECRET_NAME: Final = "metrics-scrape-token"
# Told apart from tenants' `gf_<id>_<secret>` bearer tokens at a glance.
TOKEN_PREFIX: Final = "gfm_"
# The setting that says where the token file is (`<store.data_dir>/metrics-token`).
SETTING: Final = "store.data_dir"


async def bootstrap_scrape_token(store: Store, settings: StoreSettings) -> str:
    """The scrape token (made on the store's first use), written to its file if needed."""
    token = TOKEN_PREFIX + await store.shared_secret(SECRET_NAME)
    path = metrics_token_path(settings)
    await asyncio.to_thread(_write_if_changed, path, token)
    return token


def _write_if_changed(path: Path, token: str) -> None:
    """Write the token unless the file holds it already. A file there that is not text is
    a ConfigError naming the setting (the command line prints it as one line): it is no
    token file of ours, and `store.data_dir` may point at a directory of someone else's,
    so it is not overwritten."""
    log = structlog.get_logger("greenfed.cloud")
    try:
        if read_token_file(path) == token:
            return
        write_secret(path, token)
    except MalformedTokenFile as error:
        raise ConfigError(
            f"{SETTING}: {error}; remove it and the control plane writes the metrics "
            "scrape token there at its next start",
            key=SETTING,
        ) from None
    except OSError as error:
        # Not fatal: the tenant series stay served to admin tokens.
        log.warning(
            "could not read or write the metrics scrape token file",
            metrics_token_file=str(path),
            setting=SETTING,
            error=str(error),
        )
        return
    log.info("metrics scrape token written", metrics_token_file=str(path))


def is_scrape_token(candidate: str, token: str) -> bool:
    """Constant-time: a scrape with a wrong token learns nothing from the timing."""
    # surrogateescape: a header's undecodable bytes reach handlers as surrogates
    return hmac.compare_digest(candidate.encode("utf-8", "surrogateescape"), token.encode())
