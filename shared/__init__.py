"""The wire contract and common plumbing shared by the cloud and the edge agent."""

import os
import sys


def _installed_version() -> str:
    """What `importlib.metadata.version("greenfed")` answers: the `Version` of the first
    `greenfed-*.dist-info` on `sys.path` (an upgraded agent's own version comes first).
    Read here because importlib.metadata imports email, zipfile, csv and tempfile: about
    1 MB an agent would hold for months to read one line."""
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # a zip file, or a directory that is gone
            continue
        for name in names:
            if not (name.startswith("greenfed-") and name.endswith(".dist-info")):
                continue
            try:
                with open(os.path.join(entry, name, "METADATA"), encoding="utf-8") as metadata:
                    for line in metadata:
                        if line.startswith("Version:"):
                            return line.removeprefix("Version:").strip()
                        if not line.strip():  # the headers are over
                            break
            except OSError:
                continue
    return "0.0.0+unknown"  # running from a source tree that was never installed


__version__ = _installed_version()
