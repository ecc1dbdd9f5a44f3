"""Reaching a Slurm cluster through `slurmrestd`: HTTP on a UNIX socket of a login node
(`rest_auth/local`: the socket's peer user is who asks) or over TCP with a JWT
(`rest_auth/jwt`: the `X-SLURM-USER-NAME` and `X-SLURM-USER-TOKEN` headers).

Answers are read as slurmrestd writes them: a JSON object whose `errors` list says what
went wrong. A request that cannot reach slurmrestd, that slurmrestd could not pass on to
slurmctld, or that the credentials do not open is `ClusterUnreachable`; any other
answer with errors is `ClusterRefused`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp

from cloud.clusters.backend import ClusterRefused, ClusterUnreachable
from cloud.clusters.slurm.commands import UNREACHABLE_MARKERS

DEFAULT_REQUEST_TIMEOUT_S: Final = 20.0
# What an answer may hold (a listing of 10,000 jobs is tens of MB).
MAX_ANSWER_BYTES: Final = 256 * 1024 * 1024
# Errors a DELETE of a job that is no more answers with: cancelled already.
_GONE_MARKERS: Final = ("Invalid job id specified", "Job/step already completing or completed")


@dataclass(frozen=True, slots=True)
class SlurmRestAccess:
    """`url`: `unix:/path/to/slurmrestd.socket` or `http[s]://host:port`; `user_name` and
    `token`: a JWT for `rest_auth/jwt` (empty: `rest_auth/local`, the socket's peer)."""

    url: str
    user_name: str = ""
    token: str = ""
    timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S


class SlurmRestClient:
    def __init__(self, access: SlurmRestAccess) -> None:
        self.access = access
        self._session: aiohttp.ClientSession | None = None
        if access.url.startswith("unix:"):
            self._base = "http://localhost"
        else:
            self._base = access.url.rstrip("/")

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = (
                aiohttp.UnixConnector(path=self.access.url.removeprefix("unix:"))
                if self.access.url.startswith("unix:")
                else aiohttp.TCPConnector()
            )
            headers = {"Accept": "application/json"}
            if self.access.token:
                headers["X-SLURM-USER-TOKEN"] = self.access.token
                if self.access.user_name:
                    headers["X-SLURM-USER-NAME"] = self.access.user_name
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.access.timeout_s),
            )
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        gone_is_fine: bool = False,
    ) -> dict[str, Any]:
        """The answer's JSON object; raises as the module says. `gone_is_fine`: an answer
        saying the job is no more is no error (a DELETE)."""
        try:
            async with self._client().request(
                method, self._base + path, json=body, params=params
            ) as response:
                data = await _body(response)
                status = response.status
        except aiohttp.InvalidURL as error:
            # A registration kept from before its URL was checked (cloud/clusters/views.py).
            why = error.__cause__ or error.description or "not a URL"
            raise ClusterUnreachable(
                f"slurm.rest_url is no URL slurmrestd answers at: {why}"
            ) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            raise ClusterUnreachable(
                f"slurmrestd at {self.access.url}: {error or type(error).__name__}"
            ) from None
        if len(data) > MAX_ANSWER_BYTES:
            raise ClusterRefused(f"slurmrestd answered {path} with over {MAX_ANSWER_BYTES} bytes")
        try:
            answer = json.loads(data) if data else {}
        except (ValueError, RecursionError):  # RecursionError: nested too deeply to read
            answer = None
        if not isinstance(answer, dict):
            message = data[:300].decode(errors="replace").strip()
            if status in (401, 403):
                raise ClusterUnreachable(f"slurmrestd refused greenfed's credentials: {message}")
            raise ClusterRefused(f"slurmrestd answered {method} {path} {status}: {message}")
        errors = _errors(answer)
        if status in (401, 403):
            raise ClusterUnreachable(f"slurmrestd refused greenfed's credentials: {errors}")
        if status < 400 and not errors:
            return answer
        if gone_is_fine and any(marker in errors for marker in _GONE_MARKERS):
            return answer
        if any(marker in errors for marker in UNREACHABLE_MARKERS):
            raise ClusterUnreachable(f"slurmrestd: {errors[:500]}")
        if status < 400:
            return answer  # errors beside a success are warnings in older versions
        raise ClusterRefused(f"slurmrestd answered {method} {path} {status}: {errors[:500]}")

    async def offered_versions(self) -> tuple[str, ...]:
        """The OpenAPI plugin versions (`v0.0.38`, ...) this slurmrestd serves jobs with."""
        answer = await self.request("GET", "/openapi/v3")
        paths = answer.get("paths")
        if not isinstance(paths, dict):
            raise ClusterRefused("slurmrestd's /openapi/v3 lists no paths")
        versions = {
            path.split("/")[2]
            for path in paths
            if isinstance(path, str) and path.startswith("/slurm/v") and path.count("/") >= 3
        }
        return tuple(sorted(versions))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _body(response: aiohttp.ClientResponse) -> bytes:
    """The whole answer, or its first MAX_ANSWER_BYTES + 1 bytes (then: too large)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(1 << 20):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            break
    return b"".join(chunks)


def _errors(answer: Mapping[str, Any]) -> str:
    """slurmrestd's `errors` as one line ("" when there are none)."""
    found = answer.get("errors")
    if not isinstance(found, list):
        return ""
    parts = []
    for error in found:
        if isinstance(error, Mapping):
            texts = [str(error.get(key) or "") for key in ("description", "error")]
            parts.append(": ".join(dict.fromkeys(text for text in texts if text)))
        else:
            parts.append(str(error))
    return "; ".join(part for part in parts if part)
