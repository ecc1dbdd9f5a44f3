"""The one client of the control plane's REST API that every `greenfed` command uses.

Here and only here: the base URL (`--api`, then `GREENFED_API`, then
http://127.0.0.1:8700), token discovery (`--token`, then `GREENFED_TOKEN`, then
`--token-file`, then the admin token file of this machine's data directory), both
checked before anything is sent, time limits (streams' too: a control plane that
accepts the connection and never answers, or a stream that falls silent, is given up),
decoding answers into their types (an answer that is not greenfed's JSON is one line,
never a traceback), quoting references into paths (`path_segment`), and turning
problem+json errors and unreachable APIs into one `CliError` line.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final, Generic, TypeVar

import aiohttp
import msgspec

from greenfed.arguments import EXIT_AUTH, EXIT_FAILURE, EXIT_USAGE
from shared.errors import MSGSPEC_DECODE_ERRORS
from shared.printable import printable
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
# The media types of greenfed's streams: a job's output and the event stream.
_STREAM_MEDIA_TYPES: Final = frozenset({"text/plain", "text/event-stream"})
# The most of a refusal that is no problem (a proxy's words) a message quotes.
_QUOTED_CHARACTERS: Final = 200

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
    _check_api_url(url, api_source)
    url = url.rstrip("/")

    def target(token: str | None, token_source: str) -> Target:
        problem = None if token is None else token_problem(token)
        if problem is not None:
            raise CliError(f"the token from {token_source} {problem}", EXIT_AUTH)
        return Target(url, token, token_source, api_source)

    # Given is given, empty too: `--token "$SECRET"` with a secret that was not set must
    # not fall through to the admin token file and run the command as this machine's admin.
    if token is not None:
        return target(token, "--token")
    if "GREENFED_TOKEN" in environ:
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
    """An http or https URL naming a host (and a port, if any, that is one), or a usage
    error naming where it came from and what is wrong: aiohttp would take
    `127.0.0.1:8700` for a path, `http://[::1` or a port past 65535 for a traceback, and
    `http://user:pw@host` for credentials it cannot send beside the bearer token."""
    problem = _api_url_problem(url)
    if problem is not None:
        raise CliError(f"{source} {_without_password(url)!r} {problem}", EXIT_USAGE)


def _without_password(url: str) -> str:
    """`url` as a message may show it: a password in it is a secret, as a token is."""
    scheme, separator, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    user_info, at, host = authority.rpartition("@")
    if not at or ":" not in user_info:
        return url
    return f"{scheme}{separator}{user_info.partition(':')[0]}:***@{host}{slash}{path}"


def _api_url_problem(url: str) -> str | None:
    not_api = "is not the URL of an API:"
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as error:  # a broken IPv6 address ("http://[::1")
        return f"is not a valid URL ({error})"
    if parts.scheme not in ("http", "https"):
        hint = f"; did you mean http://{url}?" if "://" not in url else ""
        return f"{not_api} it needs http:// or https:// (e.g. {DEFAULT_API}){hint}"
    if parts.username is not None or parts.password is not None:
        return (
            f"{not_api} a user or password in it is not allowed (the API takes a bearer "
            "token: --token, GREENFED_TOKEN or --token-file)"
        )
    if not parts.hostname:
        return f"{not_api} it names no host (e.g. {DEFAULT_API})"
    _, bracket, after_address = parts.netloc.rpartition("]")  # an IPv6 address holds ":"
    _, colon, port_text = (after_address if bracket else parts.netloc).rpartition(":")
    if colon and port_text:  # "host:" is the scheme's port, as urllib takes it
        if not (port_text.isascii() and port_text.isdigit()):
            return f"{not_api} its port {port_text!r} is not a number"
        if not 1 <= int(port_text) <= 65535:
            return f"{not_api} port {port_text} is out of range (1-65535)"
    if parts.query or parts.fragment:
        return f"{not_api} a query or fragment in it is not allowed"
    return None


def path_segment(reference: str) -> str:
    """`reference` (a job's or deployment's id, name or id prefix, a token's id, a
    tenant's name) as one segment of a path: quoted, so that a slash, `?` or `#` in it
    stays in it and never reaches another route. `.`, `..` and an empty reference would
    be swallowed by the path itself (`/v1/jobs/..` is `/v1/`): refused, naming nothing."""
    if reference in ("", ".", ".."):
        raise CliError(f"{reference!r} names nothing: no job, deployment or other", EXIT_USAGE)
    return urllib.parse.quote(reference, safe="")


def _problem(body: bytes) -> ProblemBody | None:
    try:
        return msgspec.json.decode(body, type=ProblemBody)
    except MSGSPEC_DECODE_ERRORS:  # nested too deeply included
        return None


def _problem_text(status: int, body: bytes, content_type: str, problem: ProblemBody | None) -> str:
    """A problem's words, printable on one line (they may be anyone's: a proxy's, a
    control plane's of another version); an answer that is no problem, as its status and
    first line (text), or its status and what it is (a proxy's HTML page, bytes)."""
    if problem is None:
        first_line = body.decode(errors="replace").strip().split("\n", 1)[0].strip()
        textual = content_type.startswith("text/") or content_type.endswith("json")
        if first_line and textual and content_type != "text/html":
            return f"HTTP {status}: {printable(first_line[:_QUOTED_CHARACTERS])}"
        return f"HTTP {status} ({content_type or 'no content type'}, {len(body)} bytes)"
    title = printable(problem.title)
    detail = printable(problem.detail) or title
    return f"{title} ({status}): {detail}" if detail != title else detail


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


@dataclass(frozen=True, slots=True)
class Reply(Generic[T]):
    """A 2xx answer: its status, its bytes as they came (what `-o json|yaml` prints) and
    what they hold, decoded into the type the command expects."""

    status: int
    payload: bytes
    value: T


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

    def _not_greenfed(
        self, method: str, path: str, what: str, expected: str = "greenfed's JSON"
    ) -> CliError:
        """A 2xx answer that is not greenfed's: the URL is likely not greenfed's API."""
        return CliError(
            f"the API at {self.target.api} ({_from(self.target)}) answered {method} {path} "
            f"with {what}, not {expected}; {_hint(self.target)}"
        )

    def _refused(self, status: int, body: bytes, content_type: str) -> CliError:
        problem = _problem(body)
        text = _problem_text(status, body, content_type, problem)
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
                    raise self._refused(response.status, payload, response.content_type)
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

    def decode(self, method: str, path: str, payload: bytes, reply_type: type[T]) -> T:
        """The answer to `method path` as `reply_type`; one that is not (another API's
        JSON, an empty body, no JSON at all, too deep) is one line saying so."""
        try:
            return msgspec.json.decode(payload, type=reply_type)
        except MSGSPEC_DECODE_ERRORS as error:  # ValidationError is a DecodeError
            # msgspec's words may quote the answer's (a key): printable.
            what = "an empty body" if not payload.strip() else f"something else ({error})"
            what = printable(what)
            raise self._not_greenfed(method, path, what) from None

    async def ask(
        self,
        method: str,
        path: str,
        reply_type: type[T],
        *,
        params: Mapping[str, str] | None = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply[T]:
        """`call`, its answer decoded into `reply_type` (`decode`)."""
        status, payload = await self.call(method, path, params=params, body=body, headers=headers)
        return Reply(status, payload, self.decode(method, path, payload, reply_type))

    async def upload(
        self, path: str, file: Path, params: Mapping[str, str], reply_type: type[T]
    ) -> Reply[T]:
        """POST a file as the raw body, streamed from disk, with no overall time limit."""
        with file.open("rb") as stream:
            status, payload = await self.call(
                "POST",
                path,
                params=params,
                body=stream,
                headers={"Content-Type": "application/octet-stream"},
                client_timeout=aiohttp.ClientTimeout(total=None, connect=10.0),
            )
        return Reply(status, payload, self.decode("POST", path, payload, reply_type))

    async def get(self, path: str, decode: type[T], params: Mapping[str, str] | None = None) -> T:
        return (await self.ask("GET", path, decode, params=params)).value

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
                    raise self._refused(response.status, refusal, response.content_type)
                # A stream is a job's output or the event stream; an answer of another
                # kind (another API's JSON, a web page) is not greenfed's.
                if response.content_type not in _STREAM_MEDIA_TYPES:
                    raise self._not_greenfed(
                        "GET",
                        path,
                        response.content_type or "no content type",
                        "greenfed's text/plain or text/event-stream",
                    )
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
