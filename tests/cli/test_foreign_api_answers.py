"""A client command whose API URL answers 2xx with something that is not greenfed's JSON
(a web server's page, an SPA fallback, a captive portal, a misrouted ingress, another
JSON API) says so in one line naming the URL and the path, never with a traceback."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator

import pytest

from greenfed.cli import main

EXIT_FAILURE = 1
HTML = b"<!doctype html><html><body>Welcome</body></html>"
OTHER_JSON = b'{"status": "ok", "items": "none here"}'


def _answering(body: bytes, content_type: str) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextlib.contextmanager
def serving(body: bytes, content_type: str) -> Iterator[str]:
    """The URL of a server that answers every GET 200 with `body`."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _answering(body, content_type))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def run_against(url: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setenv("GREENFED_API", url)
    monkeypatch.setenv("GREENFED_TOKEN", "some-token")
    return main(argv)


def assert_one_line_naming(err: str, url: str, path: str) -> None:
    assert err.startswith(f"greenfed: the API at {url} (from GREENFED_API) answered GET {path} ")
    assert "not greenfed's" in err
    assert "Traceback" not in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "path"),
    [
        (["nodes"], "/v1/nodes"),
        (["nodes", "enrolled"], "/v1/nodes/enrolled"),
        (["jobs"], "/v1/jobs"),
    ],
)
def test_a_web_page_for_an_answer_is_one_line_naming_the_url_and_path(
    argv: list[str], path: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving(HTML, "text/html; charset=utf-8") as url:
        assert run_against(url, argv, monkeypatch) == EXIT_FAILURE
    out, err = capsys.readouterr()
    assert out == ""
    assert_one_line_naming(err, url, path)


@pytest.mark.parametrize(
    ("argv", "path"),
    [(["nodes"], "/v1/nodes"), (["nodes", "enrolled"], "/v1/nodes/enrolled")],
)
def test_another_apis_json_for_an_answer_is_one_line_naming_the_url_and_path(
    argv: list[str], path: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving(OTHER_JSON, "application/json") as url:
        assert run_against(url, argv, monkeypatch) == EXIT_FAILURE
    out, err = capsys.readouterr()
    assert out == ""
    assert_one_line_naming(err, url, path)
