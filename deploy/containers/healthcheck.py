"""The control plane image's health check: GET one of the API's health paths in this
container and exit 0 on a 2xx answer, 1 otherwise (what Docker, Podman and Compose take
as healthy or not).

    python /opt/greenfed/healthcheck.py            # /healthz: the process serves
    python /opt/greenfed/healthcheck.py /readyz    # ... and is subscribed to the broker

The port is `GREENFED_CLOUD__API_PORT`'s where that is set, else the default 8700 (the
image takes its settings from the environment; a port set only in a TOML file is not
seen here). The standard library only: the image has no curl.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

DEFAULT_API_PORT = "8700"
TIMEOUT_S = 4.0


def main(argv: list[str]) -> int:
    path = argv[1] if len(argv) > 1 else "/healthz"
    port = os.environ.get("GREENFED_CLOUD__API_PORT", DEFAULT_API_PORT)
    url = f"http://127.0.0.1:{port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            status = int(response.status)
    except urllib.error.HTTPError as error:  # 4xx and 5xx: /readyz's 503 before the broker
        status = error.code
    except (OSError, ValueError) as error:  # refused, timed out, a malformed port
        print(f"{url}: {error}", file=sys.stderr)
        return 1
    if 200 <= status < 300:
        return 0
    print(f"{url}: HTTP {status}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
