"""The one client of the control plane's REST API that every `greenfed` command uses.

Here and only here: the base URL (`--api`, then `GREENFED_API`, then
http://127.0.0.1:8700), token discovery (`--token`, then `GREENFED_TOKEN`, then
`--token-file`, then the admin token file of this machine's data directory), both
checked before anything is sent, time limits (streams' too: a control plane that
accepts the connection and never answers, or a stream that falls silent, is given up),
and turning problem+json errors and unreachable APIs into one `CliError` line.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final, TypeVar

import aiohttp
import msgspec

from greenfed.arguments import EXIT_AUTH, EXIT_FAILURE, EXIT_USAGE
from shared.errors import MSGSPEC_DECODE_ERRORS
from shared.problems import CONFIRM_HEADER, CONFIRM_VALUE, ProblemBody
from shared.token_files import MalformedTokenFile, read_token_file, token_problem

DEFAULT_API: Final = "http://127.0.0.1:8700"
# The longest a command waits for an answer; a stream's answer must start within it too.
TIMEOUT_S: Final = 30.0
CONNECT_S: Final = 10.0
# The event stream sends a keep-alive comment after this long without an event (the
# server's `heartbeat_s`, cloud/api/tuning.py, not imported: the CLI loads none of the
# server; a test keeps them equal); one silent for SILENT_HEARTBEATS of them is dead: a
# hung control plane, or a connection a proxy or NAT dropped without a word.
EVENT_HEARTBEAT_S: Final = 15.0
SILENT_HEARTBEATS: Final = 3
# The problems that say a value of the request is invalid, naming it (a query parameter,
# a field of the body, a header, a name in the path): values the command line or a spec
# file gave, so a usage error (exit 2). Other refusals (a file that is no ONNX model)
# are the command's failure (1), as docs/cli.md's "Exit status and messages" says.
_INVALID_VALUE_PROBLEMS: Final = frozenset(
    {"invalid-query", "invalid-body", "invalid-header", "invalid-mqtt-account-name"}
)

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
    _check_api_url(url, api_source)

    def target(token: str | None, token_source: str) -> Target:
        problem = None if token is None else token_problem(token)
        if problem is not None:
            raise CliError(f"the token from {token_source} {problem}", EXIT_AUTH)
        return Target(url, token, token_source, api_source)

    if token:
        return target(token, "--token")
    if environ.get("GREENFED_TOKEN"):
        return target(environ["GREENFED_TOKEN"].strip(), "GREENFED_TOKEN")
    if token_file is not None:
        try:
            found = read_token_file(token_file)
        except MalformedTokenFile as error:
            raise CliError(f"--token-file {error}", EXIT_AUTH) from None
        except OSError as error:
            raise CliError(f"cannot read --token-file {token_file}: {error.strerror}") from None
        if found is None:
            raise CliError(f"--token-file {token_file} does not exist or is empty", EXIT_USAGE)
        return target(found, f"--token-file {token_file}")
    default = default_token_file()
    try:
        found = read_token_file(default)
    except MalformedTokenFile as error:
        raise CliError(f"the admin token file {error}", EXIT_AUTH) from None
    except OSError:
        found = None
    if found is not None:
        return target(found, str(default))
    return target(None, "")


def _check_api_url(url: str, source: str) -> None:
    """An http or https URL, or a usage error naming where it came from: aiohttp would
    take `127.0.0.1:8700` for a path and fail with words that do not say why."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme in ("http", "https") and parts.netloc:
        return
    hint = f"; did you mean http://{url}?" if "://" not in url else ""
    raise CliError(
        f"{source} {url!r} is not the URL of an API: it needs http:// or https:// "
        f"(e.g. {DEFAULT_API}){hint}",
        EXIT_USAGE,
    )


def _problem(body: bytes) -> ProblemBody | None:
    try:
        return msgspec.json.decode(body, type=ProblemBody)
    except MSGSPEC_DECODE_ERRORS:  # nested too deeply included
        return None


def _problem_text(status: int, body: bytes, problem: ProblemBody | None) -> str:
    if problem is None:
        return f"HTTP {status}: {body.decode(errors='replace')[:300]}"
    detail = problem.detail or problem.title
    return f"{problem.title} ({status}): {detail}" if detail != problem.title else detail


def _invalid_value(problem: ProblemBody | None) -> bool:
    """Whether the API refused a value of the request (its problem type's last segment,
    https://greenfed.dev/problems/invalid-query)."""
    return problem is not None and problem.type.rsplit("/", 1)[-1] in _INVALID_VALUE_PROBLEMS


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
        # `timeout_s` None: no overall limit (a command that watches or follows for long),
        # yet an answer that does not come, or stops coming, is still given up.
        self._answer_s = TIMEOUT_S if timeout_s is None else timeout_s
        self._timeout = aiohttp.ClientTimeout(
            total=timeout_s,
            connect=min(CONNECT_S, self._answer_s),
            sock_read=TIMEOUT_S if timeout_s is None else None,
        )
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
        problem = _problem(body)
        text = _problem_text(status, body, problem)
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
        if _invalid_value(problem):
            return CliError(text, EXIT_USAGE, status=status)
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
        except MSGSPEC_DECODE_ERRORS as error:  # nested too deeply included
            raise self._not_greenfed("GET", path, f"something else ({error})") from None

    async def stream(
        self, path: str, params: Mapping[str, str] | None = None, *, heartbeats: bool = False
    ) -> AsyncIterator[bytes]:
        """A long answer, chunk by chunk as it comes, until the server ends it. It must
        start within the client's answer time, as any answer. `heartbeats`: the server
        sends something at least every EVENT_HEARTBEAT_S (the event stream's keep-alive
        comments), so a stream silent for SILENT_HEARTBEATS of them is given up. Without
        (a quiet job's output has nothing to say for hours), each such silence asks the
        API for GET /healthz instead, and a control plane that does not answer is given
        up."""
        silence_s = SILENT_HEARTBEATS * EVENT_HEARTBEAT_S
        try:
            # The session's limits are for whole answers; a stream has none of its own.
            request = self._session.get(
                self.target.api + path,
                params=params,
                timeout=aiohttp.ClientTimeout(total=None, connect=min(CONNECT_S, self._answer_s)),
            )
            async with asyncio.timeout(self._answer_s):
                response = await request
            async with response:
                if response.status >= 300:
                    async with asyncio.timeout(self._answer_s):
                        refusal = await response.read()
                    raise self._refused(response.status, refusal)
                while True:
                    try:
                        async with asyncio.timeout(silence_s):
                            chunk = await response.content.readany()
                    except TimeoutError:
                        if heartbeats:
                            raise
                        await self.call("GET", "/healthz")  # a CliError when it is not there
                        continue
                    if not chunk:
                        return
                    yield chunk
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise self._unreachable(error) from None


def bulk_confirmation(confirm: bool) -> dict[str, str]:
    """The header that confirms a bulk destructive action (`--confirm-bulk`), if asked."""
    return {CONFIRM_HEADER: CONFIRM_VALUE} if confirm else {}
