"""The one client of the control plane's REST API that every `greenfed` command uses.

Here and only here: the base URL (`--api`, then `GREENFED_API`, then
http://127.0.0.1:8700), token discovery (`--token`, then `GREENFED_TOKEN`, then
`--token-file`, then the admin token file of this machine's data directory), time
limits, and turning problem+json errors and unreachable APIs into one `CliError` line.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final, TypeVar

import aiohttp
import msgspec

from greenfed.arguments import EXIT_AUTH, EXIT_FAILURE, EXIT_USAGE
from shared.problems import CONFIRM_HEADER, CONFIRM_VALUE, ProblemBody
from shared.token_files import read_token_file

DEFAULT_API: Final = "http://127.0.0.1:8700"
TIMEOUT_S: Final = 30.0

T = TypeVar("T")


class CliError(Exception):
    """One line for the person at the terminal, and the exit status."""

    def __init__(
        self, message: str, exit_code: int = EXIT_FAILURE, *, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.status = status  # the HTTP status, when the API answered


@dataclass(frozen=True, slots=True)
class Target:
    api: str
    token: str | None
    token_source: str  # for messages: where the token came from
    api_source: str = "the default"  # for messages: "--api", "GREENFED_API" or "the default"


def resolve_target(
    *,
    api: str | None,
    token: str | None,
    token_file: Path | None,
    default_token_file: Callable[[], Path],
    environ: Mapping[str, str] | None = None,
) -> Target:
    environ = os.environ if environ is None else environ
    if api:
        url, api_source = api, "--api"
    elif environ.get("GREENFED_API"):
        url, api_source = environ["GREENFED_API"].strip(), "GREENFED_API"
    else:
        url, api_source = DEFAULT_API, "the default"
    url = url.rstrip("/")

    def target(token: str | None, token_source: str) -> Target:
        return Target(url, token, token_source, api_source)

    if token:
        return target(token, "--token")
    if environ.get("GREENFED_TOKEN"):
        return target(environ["GREENFED_TOKEN"].strip(), "GREENFED_TOKEN")
    if token_file is not None:
        try:
            found = read_token_file(token_file)
        except OSError as error:
            raise CliError(f"cannot read --token-file {token_file}: {error.strerror}") from None
        if found is None:
            raise CliError(f"--token-file {token_file} does not exist or is empty", EXIT_USAGE)
        return target(found, str(token_file))
    default = default_token_file()
    try:
        found = read_token_file(default)
    except OSError:
        found = None
    if found is not None:
        return target(found, str(default))
    return target(None, "")


def _problem_text(status: int, body: bytes) -> str:
    try:
        problem = msgspec.json.decode(body, type=ProblemBody)
    except msgspec.MsgspecError:
        return f"HTTP {status}: {body.decode(errors='replace')[:300]}"
    detail = problem.detail or problem.title
    return f"{problem.title} ({status}): {detail}" if detail != problem.title else detail


def _from(target: Target) -> str:
    return "the default" if target.api_source == "the default" else f"from {target.api_source}"


def _reason(error: BaseException) -> str:
    """The OS's word for a failed connection, without aiohttp's wrapping around it."""
    if isinstance(error, aiohttp.ClientConnectorError):
        if isinstance(error.os_error, ConnectionRefusedError):
            return "connection refused"
        return error.os_error.strerror or str(error)
    if isinstance(error, TimeoutError):
        return "no answer in time"
    return str(error) or type(error).__name__


def _hint(target: Target) -> str:
    if target.api_source == "--api":
        return "is greenfed up or greenfed cloud running there?"
    if target.api_source == "GREENFED_API":
        return "is greenfed up or greenfed cloud running there? If not, fix GREENFED_API"
    return (
        "is greenfed up or greenfed cloud running? If it serves elsewhere, "
        "set GREENFED_API to its URL (greenfed up prints the export line) or pass --api"
    )


class ApiClient:
    """One HTTP session against the control plane; every failure becomes a `CliError`."""

    def __init__(
        self,
        target: Target,
        *,
        timeout_s: float | None = TIMEOUT_S,
        ssl_context: ssl.SSLContext | None = None,  # verify https against this CA (--ca)
    ) -> None:
        self.target = target
        headers = {"Accept": "application/json"}
        if target.token:
            headers["Authorization"] = f"Bearer {target.token}"
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=min(10.0, timeout_s or 10.0))
        connector = None if ssl_context is None else aiohttp.TCPConnector(ssl=ssl_context)
        self._session = aiohttp.ClientSession(
            headers=headers, timeout=self._timeout, connector=connector
        )

    async def __aenter__(self) -> ApiClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._session.close()

    def _unreachable(self, error: BaseException) -> CliError:
        return CliError(
            f"cannot reach the greenfed API at {self.target.api} ({_from(self.target)}): "
            f"{_reason(error)}; {_hint(self.target)}"
        )

    def _not_greenfed(self, method: str, path: str, what: str) -> CliError:
        """A 2xx answer that is not greenfed's: the URL is likely not greenfed's API."""
        return CliError(
            f"the API at {self.target.api} ({_from(self.target)}) answered {method} {path} "
            f"with {what}, not greenfed's JSON; {_hint(self.target)}"
        )

    def _refused(self, status: int, body: bytes) -> CliError:
        text = _problem_text(status, body)
        if status == 401:
            if self.target.token is None:
                return CliError(
                    "no token: pass --token, set GREENFED_TOKEN or use --token-file "
                    f"(the API at {self.target.api} answered: {text})",
                    EXIT_AUTH,
                    status=status,
                )
            return CliError(
                f"the API at {self.target.api} refused the token from "
                f"{self.target.token_source}: {text}",
                EXIT_AUTH,
                status=status,
            )
        if status == 403:
            return CliError(text, EXIT_AUTH, status=status)
        return CliError(text, status=status)

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: bytes | BinaryIO | None = None,
        headers: Mapping[str, str] | None = None,
        client_timeout: aiohttp.ClientTimeout | None = None,
    ) -> tuple[int, bytes]:
        """(status, body) of a 2xx answer; any other answer raises `CliError`.
        `client_timeout` replaces the session's (an upload may take longer than any answer)."""
        request_headers = dict(headers or {})
        if body is not None:
            request_headers.setdefault("Content-Type", "application/json")
        try:
            async with self._session.request(
                method,
                self.target.api + path,
                params=params,
                data=body,
                headers=request_headers,
                timeout=client_timeout or self._timeout,
            ) as response:
                payload = await response.read()
                if response.status >= 300:
                    raise self._refused(response.status, payload)
                # greenfed's API never answers the CLI with a web page; a web server, an
                # SPA fallback, a captive portal or a misrouted ingress does, with 200.
                if response.content_type == "text/html":
                    raise self._not_greenfed(method, path, "a web page (text/html)")
                return response.status, payload
        except aiohttp.ClientConnectorCertificateError as error:
            raise CliError(
                f"TLS: the certificate of the API at {self.target.api} is not trusted "
                f"({error.certificate_error})"
            ) from None
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise self._unreachable(error) from None

    async def upload(self, path: str, file: Path, params: Mapping[str, str]) -> bytes:
        """POST a file as the raw body, streamed from disk, with no overall time limit."""
        with file.open("rb") as stream:
            _, payload = await self.call(
                "POST",
                path,
                params=params,
                body=stream,
                headers={"Content-Type": "application/octet-stream"},
                client_timeout=aiohttp.ClientTimeout(total=None, connect=10.0),
            )
        return payload

    async def get(self, path: str, decode: type[T], params: Mapping[str, str] | None = None) -> T:
        _, payload = await self.call("GET", path, params=params)
        try:
            return msgspec.json.decode(payload, type=decode)
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            raise self._not_greenfed("GET", path, f"something else ({error})") from None

    async def stream(
        self, path: str, params: Mapping[str, str] | None = None
    ) -> AsyncIterator[bytes]:
        try:
            async with self._session.get(self.target.api + path, params=params) as response:
                if response.status >= 300:
                    raise self._refused(response.status, await response.read())
                async for chunk in response.content.iter_any():
                    yield chunk
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise self._unreachable(error) from None


def bulk_confirmation(confirm: bool) -> dict[str, str]:
    """The header that confirms a bulk destructive action (`--confirm-bulk`), if asked."""
    return {CONFIRM_HEADER: CONFIRM_VALUE} if confirm else {}
