"""The wire contract and common plumbing shared by the cloud and the edge agent."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("greenfed")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
