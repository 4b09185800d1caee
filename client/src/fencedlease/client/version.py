"""The installed fencedlease-client's version (``fencedlease --version``,
``kubectl fencedlease --version``)."""

from __future__ import annotations


def client_version() -> str:
    """The version of the installed ``fencedlease-client`` distribution (``unknown`` when it
    runs from a source tree that was never installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fencedlease-client")
    except PackageNotFoundError:
        return "unknown"
