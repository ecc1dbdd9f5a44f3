"""TCP ports of the processes `greenfed` starts: is one free, and a port in use as
one clear line instead of a bind error deep inside a server's start."""

from __future__ import annotations

import errno
import socket


class PortInUse(OSError):
    """Another process listens on the port; `str()` is the whole message."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EADDRINUSE, message)

    def __str__(self) -> str:
        return str(self.strerror)


def free_tcp_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As asyncio's server does, so a port in TIME_WAIT after a restart counts as free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def check_api_port(host: str, port: int) -> None:
    """Raise `PortInUse` if the REST API could not listen on host:port because another
    process does, before anything else starts (a store opened, an admin created)."""
    if port == 0:
        return  # any free port
    try:
        free = port_is_free(host, port)
    except OSError:
        return  # e.g. an IPv6 or a remote address: the server's own bind says what is wrong
    if not free:
        raise PortInUse(
            f"cannot serve the REST API on {host}:{port}: the port is in use (another "
            "greenfed up or greenfed cloud?); choose another with --api-port"
        )
