"""An answer of the API nested too deeply to decode (msgspec raises RecursionError there,
not DecodeError) is, for the command line, what any answer it cannot read is: one line
on stderr, never a traceback. A 2xx answer is not greenfed's JSON, a refusal's body is
shown as text (greenfed/api_client.py), and `greenfed edge enrol` says the control plane
answered the enrolment with something else (greenfed/enrol_cli.py)."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from greenfed.cli import main

pytestmark = pytest.mark.timeout(60)

EXIT_FAILURE = 1
# Far deeper than msgspec's recursion guard (Python's default limit is 1,000 frames).
NESTING = 10_000
# In a field the answer's type does not have: skipped, yet walked all the same.
NESTED = b'{"x":' + b"[" * NESTING + b"]" * NESTING + b',"items":[]}'


def _answering(status: int, body: bytes) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextlib.contextmanager
def serving(status: int, body: bytes) -> Iterator[str]:
    """The URL of a server that answers every GET and POST with `status` and `body`."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _answering(status, body))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def one_line(err: str) -> str:
    assert "Traceback" not in err
    assert err.count("\n") == 1, err[:500]
    return err


@pytest.mark.parametrize(
    ("status", "said"),
    [(200, "not greenfed's JSON"), (500, "HTTP 500: {")],
    ids=["an-answer", "a-refusal"],
)
def test_an_api_answer_nested_too_deeply_is_one_line(
    status: int,
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with serving(status, NESTED) as url:
        monkeypatch.setenv("GREENFED_API", url)
        monkeypatch.setenv("GREENFED_TOKEN", "some-token")
        assert main(["nodes"]) == EXIT_FAILURE
    out, err = capsys.readouterr()
    assert out == ""
    assert said in one_line(err)


def test_an_enrolment_answer_nested_too_deeply_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The node's sealing key is made under the test's directory, never a real home.
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    config = tmp_path / "agent.toml"
    with serving(200, NESTED) as url:
        code = main(
            ["edge", "enrol", "--api", url, "--token", "gfj_x", "--config", str(config),
             "--node-id", "orin-1"]
        )  # fmt: skip
    assert code == EXIT_FAILURE
    _, err = capsys.readouterr()
    assert f"{url} answered the enrolment with something else" in one_line(err)
    assert not config.exists()
