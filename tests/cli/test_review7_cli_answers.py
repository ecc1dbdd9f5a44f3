"""What the CLI makes of answers and inputs that are not what it expects, each one line on
stderr with its exit status (docs/cli.md, "Exit status and messages"), never a traceback:

- a URL that answers 2xx with JSON that is not greenfed's, or with an empty body: one
  line saying so, for every command, whatever it decodes (exit 1);
- a token given but empty (`--token ""`, `GREENFED_TOKEN=""`, a CI secret that was not
  set) is refused as a blank one is, never replaced by this machine's admin token (3);
- an `--api` URL that cannot be one (no host, a port out of range, a broken IPv6
  address, a user and password in it) is a usage error naming what is wrong (2);
- a refusal that is not a problem (a proxy's HTML error page) is its status and what it
  was, and a problem's words reach the terminal printable, on one line;
- a job or deployment reference goes into the path as one segment, quoted: a slash or a
  `..` in it never reaches another route.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from greenfed.cli import main

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_AUTH = 3
NOWHERE = "http://127.0.0.1:1"
ADMIN_SECRET = "gf_admin0000000000_ADMIN"
A_ID = "01M98X8XQXEB1E5TA5V9AZ6X9Y"
OTHER_JSON = b'{"status": "ok", "items": "none here"}'
SPEC = """\
kind = "training"
name = "t1"
command = ["python", "-c", "print(1)"]
accelerators_per_worker = 1
"""


@dataclass
class Answer:
    status: int
    content_type: str
    body: bytes


@dataclass
class Seen:
    """What the fake API was asked: (method, path as sent, Authorization header)."""

    requests: list[tuple[str, str, str | None]] = field(default_factory=list)


def _handler(answer: Answer, seen: Seen) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            seen.requests.append((self.command, self.path, self.headers.get("Authorization")))
            status = 201 if self.command == "POST" and answer.status == 200 else answer.status
            self.send_response(status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            # The CLI may hang up first (it had what it needed from another request).
            with contextlib.suppress(ConnectionError):
                self.wfile.write(answer.body)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        def log_message(self, *args: object) -> None:
            pass

    return Handler


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hung up (the CLI, done with one of two requests) is no error of
        the CLI's: nothing on the stderr the tests read."""


@contextlib.contextmanager
def serving(answer: Answer) -> Iterator[tuple[str, Seen]]:
    """The URL of a server that answers every request with `answer`, and what it saw."""
    seen = Seen()
    server = _QuietServer(("127.0.0.1", 0), _handler(answer, seen))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(autouse=True)
def admin_token_here(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A data directory of the test's own holding an admin token file, as on the machine
    that runs `greenfed up`; no token or API from the environment."""
    for variable in ("GREENFED_TOKEN", "GREENFED_API"):
        monkeypatch.delenv(variable, raising=False)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "admin-token").write_text(ADMIN_SECRET + "\n")
    monkeypatch.setenv("GREENFED_STORE__DATA_DIR", str(data_dir))
    (tmp_path / "spec.toml").write_text(SPEC)
    monkeypatch.chdir(tmp_path)


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert out == ""
    assert err.startswith("greenfed: "), err
    assert err.count("\n") == 1, err
    return err


# ---- 1. a 2xx answer that is not greenfed's JSON ----------------------------------------

COMMANDS = [
    ["jobs"],
    ["jobs", "-o", "json"],
    ["job", A_ID],
    ["job", A_ID, "-o", "json"],
    ["deployment", A_ID],
    ["deployments"],
    ["cancel", A_ID],
    ["cancel", A_ID, "-o", "json"],
    ["submit", "spec.toml"],
    ["submit", "spec.toml", "-o", "json"],
    ["submit", "spec.toml", "--dry-run"],
    ["apply", "-f", "spec.toml"],
    ["scale", A_ID, "2"],
    ["rollout", "promote", A_ID],
    ["hold", A_ID],
    ["patch", A_ID, "--priority", "p1"],
    ["tenants"],
    ["tenants", "create", "acme", "--quota", "gpu=1"],
    ["tenants", "set", "acme", "--max-running", "2"],
    ["usage"],
    ["models"],
    ["logs", A_ID],
    ["events"],
    ["tokens", "list"],
    ["tokens", "create", "ci"],
    ["tokens", "rotate", A_ID],
    ["tokens", "revoke", A_ID],
    ["audit"],
    ["mqtt", "accounts", "create", "grafana"],
    ["mqtt", "accounts", "revoke", "grafana"],
    ["nodes", "join-token", "create"],
    ["nodes", "join-token", "revoke", A_ID],
    ["nodes", "cordon", "node-1"],
    ["nodes", "revoke", "node-1"],
    ["nodes", "approve", "node-1"],
    ["nodes", "readmit", "node-1"],
    ["nodes", "rollouts"],
    ["nodes", "rollouts", A_ID],
    ["nodes", "upgrade", "--version", "1.2.3"],
    ["agent-packages", "list"],
    ["clusters", "list"],
]


@pytest.mark.parametrize("body", [OTHER_JSON, b""], ids=["another API's JSON", "empty"])
@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_2xx_answer_that_is_not_greenfeds_json_is_one_line(
    argv: list[str], body: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving(Answer(200, "application/json", body)) as (url, _):
        assert main([*argv, "--api", url]) == EXIT_FAILURE
    err = one_line(capsys)
    assert f"the API at {url} (from --api) answered " in err
    assert "not greenfed's" in err


# ---- 2. a token given but empty --------------------------------------------------------


def test_an_empty_token_option_is_refused_not_replaced_by_the_admin_token(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with serving(Answer(200, "application/json", b'{"items": [], "count": 0}')) as (url, seen):
        assert main(["tenants", "--token", "", "--api", url]) == EXIT_AUTH
    assert seen.requests == []
    assert one_line(capsys) == "greenfed: the token from --token is empty\n"


def test_an_empty_greenfed_token_is_refused_as_a_blank_one_is(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving(Answer(200, "application/json", b'{"items": [], "count": 0}')) as (url, seen):
        for value in ("", " "):
            monkeypatch.setenv("GREENFED_TOKEN", value)
            assert main(["tenants", "--api", url]) == EXIT_AUTH
            assert one_line(capsys) == "greenfed: the token from GREENFED_TOKEN is empty\n"
    assert seen.requests == []


# ---- 3. an --api URL that cannot be one ------------------------------------------------


@pytest.mark.parametrize(
    ("api", "said"),
    [
        ("http://[::1", "not a valid URL"),
        ("http://localhost:99999", "port 99999 is out of range"),
        ("http://localhost:http", "its port 'http' is not a number"),
        ("http://", "names no host"),
        ("https://:8700", "names no host"),
    ],
)
def test_an_api_url_that_cannot_be_one_is_a_usage_error_naming_why(
    api: str, said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GREENFED_TOKEN", "abc")
    assert main(["jobs", "--api", api]) == EXIT_USAGE
    err = one_line(capsys)
    assert err.startswith(f"greenfed: --api {api!r} ")
    assert said in err


def test_a_user_and_password_in_the_api_url_are_refused_without_showing_the_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GREENFED_TOKEN", "abc")
    assert main(["jobs", "--api", "http://user:s3cret@127.0.0.1:1"]) == EXIT_USAGE
    err = one_line(capsys)
    assert err.startswith("greenfed: --api 'http://user:***@127.0.0.1:1' ")
    assert "a user or password in it is not allowed" in err
    assert "s3cret" not in err


def test_a_bad_greenfed_api_is_named_as_such(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GREENFED_API", "http://[::1")
    assert main(["jobs"]) == EXIT_USAGE
    assert one_line(capsys).startswith("greenfed: GREENFED_API 'http://[::1' is not a valid URL")


# ---- 4. refusals that are not greenfed's problems, and a problem's words ---------------

PROXY_PAGE = (
    b"<html>\n<head><title>502 Bad Gateway</title></head>\n<body>\n"
    b"<center><h1>502 Bad Gateway</h1></center>\n<hr><center>nginx</center>\n</body>\n</html>\n"
)


def test_a_proxys_error_page_is_its_status_and_size_not_its_html(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with serving(Answer(502, "text/html", PROXY_PAGE)) as (url, _):
        assert main(["jobs", "--api", url]) == EXIT_FAILURE
    assert one_line(capsys) == f"greenfed: HTTP 502 (text/html, {len(PROXY_PAGE)} bytes)\n"


def test_a_plain_text_refusal_is_its_first_line_printable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    body = b"upstream \x1b[31mdown\r\nretry later\n"
    with serving(Answer(503, "text/plain", body)) as (url, _):
        assert main(["jobs", "--api", url]) == EXIT_FAILURE
    assert one_line(capsys) == "greenfed: HTTP 503: upstream \ufffd[31mdown\n"


def test_a_problems_title_and_detail_reach_the_terminal_printable_on_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    problem = {
        "type": "https://greenfed.dev/problems/unavailable",
        "title": "Service\nUnavailable",
        "status": 503,
        "detail": "store down\nsecond line \x1b[31mred",
    }
    body = json.dumps(problem).encode()
    with serving(Answer(503, "application/problem+json", body)) as (url, _):
        assert main(["jobs", "--api", url]) == EXIT_FAILURE
    err = one_line(capsys)
    assert "\x1b" not in err
    assert err == (
        "greenfed: Service\ufffdUnavailable (503): store down\ufffdsecond line \ufffd[31mred\n"
    )


# ---- 5. references are one path segment -------------------------------------------------

NOT_FOUND = json.dumps(
    {"type": "https://greenfed.dev/problems/not-found", "title": "Not Found", "status": 404}
).encode()


@pytest.mark.parametrize(
    ("argv", "path"),
    [
        (["job", "a b/c"], "/v1/jobs/a%20b%2Fc"),
        (["job", "../../v1/tenants"], "/v1/jobs/..%2F..%2Fv1%2Ftenants"),
        (["deployment", "x?y#z"], "/v1/deployments/x%3Fy%23z"),
        (["cancel", "a/b"], "/v1/jobs/a%2Fb"),
        (["hold", "a/b"], "/v1/jobs/a%2Fb/hold"),
        (["patch", "a/b", "--priority", "p1"], "/v1/jobs/a%2Fb"),
        (["scale", "a/b", "2"], "/v1/deployments/a%2Fb"),
        (["rollout", "abort", "a/b"], "/v1/deployments/a%2Fb/rollout/abort"),
        (["logs", "a/b"], "/v1/jobs/a%2Fb"),
        (["tokens", "revoke", "a/b"], "/v1/tokens/a%2Fb"),
        (["tokens", "rotate", "a/b"], "/v1/tokens/a%2Fb/rotate"),
        (["tenants", "set", "a/b", "--max-running", "2"], "/v1/tenants/a%2Fb"),
    ],
)
def test_a_reference_goes_into_the_path_as_one_quoted_segment(
    argv: list[str], path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving(Answer(404, "application/problem+json", NOT_FOUND)) as (url, seen):
        assert main([*argv, "--api", url]) == EXIT_FAILURE
    one_line(capsys)
    asked = [each for _, each, _ in seen.requests]
    assert path in asked
    quoted = path.split("/")[3]  # /v1/jobs/QUOTED...
    assert all(each.split("/")[3] == quoted for each in asked), asked  # no other route


@pytest.mark.parametrize("reference", ["..", ".", ""])
@pytest.mark.parametrize("command", ["job", "cancel", "deployment", "logs"])
def test_a_reference_that_a_path_would_swallow_is_refused_before_anything_is_sent(
    command: str, reference: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving(Answer(404, "application/problem+json", NOT_FOUND)) as (url, seen):
        assert main([command, reference, "--api", url]) == EXIT_USAGE
    assert seen.requests == []
    assert f"{reference!r} names nothing" in one_line(capsys)
