"""Which of a worker's environment variables change what a program run as root does.

A worker starts through programs run as root before its privileges are dropped
(edge/sandbox/root_env.py). A variable named here is never in their environment: its
value reaches the worker after the drop, as an argument, which other users of the node
can read. So a secret may not have such a name: the control plane refuses it at
submission (cloud/work/specs.py `check_submitted_secrets`) and the agent again before
a start.
"""

from __future__ import annotations

from typing import Final

# The C library's own list of variables a privileged program must not take from its
# caller (glibc's unsecure-envvars), the dynamic loader's, the shells', proxies and
# certificates, Go's runtime (podman, runc), GLib's (conmon), systemd's and D-Bus's, and
# the container tools' configuration.
_SENSITIVE_PREFIXES: Final = (
    "LD_",
    "GCONV_",
    "GLIBC_",
    "MALLOC_",
    "NIS_",
    "RES_",
    "CONTAINERS_",
    "_CONTAINERS_",
    "CONTAINER_",
    "PODMAN_",
    "BUILDAH_",
    "DOCKER_",
    "STORAGE_",
    "REGISTRIES_",
    "XDG_",
    "SSL_CERT_",
    "CNI_",
    "OCI_",
    "REGISTRY_",  # podman's REGISTRY_AUTH_FILE
    "_LIBCONTAINER",  # runc's own hand-over to its init
    "CRUN_",
    "CONMON_",
    "DBUS_",  # podman's cgroup manager talks to systemd over D-Bus
    "SYSTEMD_",
    "LISTEN_",  # socket activation
    "GIO_",  # GLib (conmon): modules it loads
    "GSETTINGS_",
    "G_",
)
_SENSITIVE_NAMES: Final = frozenset(
    {
        "PATH",
        "HOME",
        "TMPDIR",
        "TZ",
        "TZDIR",
        "TERMINFO",
        "TERMINFO_DIRS",
        "LOCPATH",
        "NLSPATH",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "GETCONF_DIR",
        "RESOLV_HOST_CONF",
        "NOTIFY_SOCKET",
        "IFS",
        "ENV",
        "BASH_ENV",
        "SHELLOPTS",
        "PS4",
        "GODEBUG",
        "GOGC",
        "GOMEMLIMIT",
        "GOMAXPROCS",
        "GOTRACEBACK",
        "GORACE",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
    }
)


def is_root_sensitive(name: str) -> bool:
    """Whether a variable may change what a program run as root loads, runs or reads."""
    upper = name.upper()
    return upper in _SENSITIVE_NAMES or upper.startswith(_SENSITIVE_PREFIXES)
