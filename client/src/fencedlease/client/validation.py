"""Every value the client takes from outside, checked before it is used (docs/client.md).

* **Names that go into a URL path** (a namespace, a FencedLease, a FencedArtifact, a Pod) must
  be what the API server itself requires: a namespace is a DNS label (RFC 1123, at most 63
  characters), an object name a DNS subdomain (at most 253).  ``cart/status`` is neither: put
  unchecked into ``.../fencedartifacts/cart/status`` it would address the status subresource.
* **Every request's path** is checked where requests are built (:func:`api_path`, called by
  the API clients for every request, whatever made the path): each segment a Kubernetes path
  segment name (no ``.`` or ``..``, no ``/``, ``%``, ``#``, ``?``, whitespace or anything but
  ASCII letters, digits and ``-._:``), the segment after ``namespaces`` a DNS label.  httpx
  resolves ``..`` before sending: unchecked, a name ``a/../../..`` read from a queue would
  address another object (a DELETE of a ConfigMap instead of a FencedClaim).
* **Fencing tokens** are positive integers everywhere (they are etcd revisions): ``True``,
  ``8.5``, ``Decimal("8")`` and ``"8"`` are refused, not rounded or coerced.
* **Token text** (a downward-API file, a command-line argument) is ASCII digits only, no sign,
  no ``_``, no leading zero: ``int()`` would also take ``+752``, ``7_52`` and Arabic-Indic
  digits.
"""

from __future__ import annotations

import math
import re

from fencedlease.client.errors import FencedLeaseError

MAX_TOKEN = 2**63 - 1
"""etcd revisions are int64 (and the SQL fence stores a BIGINT)."""

_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_DNS_LABEL = re.compile(rf"{_LABEL}\Z")
_DNS_SUBDOMAIN = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\Z")
_TOKEN_TEXT = re.compile(r"[1-9][0-9]{0,18}\Z")
_LEASE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
_PATH_SEGMENT = re.compile(r"[A-Za-z0-9._:-]{1,253}\Z")


class InvalidInput(FencedLeaseError, ValueError):
    """A value from outside (an argument, a file, a reply) that the client refuses to use."""


def dns_label(value: object, what: str = "namespace") -> str:
    """``value`` if it is a DNS label (RFC 1123: ``[a-z0-9]([-a-z0-9]*[a-z0-9])?``, <= 63)."""
    if not isinstance(value, str) or len(value) > 63 or not _DNS_LABEL.match(value):
        raise InvalidInput(f"invalid {what} {_show(value)}: not a DNS label (RFC 1123)")
    return value


def dns_subdomain(value: object, what: str = "name") -> str:
    """``value`` if it is a DNS subdomain (RFC 1123 labels joined by dots, <= 253)."""
    if not isinstance(value, str) or len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise InvalidInput(f"invalid {what} {_show(value)}: not a DNS subdomain (RFC 1123)")
    return value


def api_path(path: object) -> str:
    """``path`` if it is an API path whose every segment is a Kubernetes name (what the API
    server itself allows in a path segment, minus ``.`` and ``..``; ASCII letters, digits and
    ``-._:`` only) and whose namespace, after ``namespaces``, is a DNS label.  Query
    parameters go in ``params``, never in the path."""
    if not isinstance(path, str) or not path.startswith("/") or path == "/":
        raise InvalidInput(f"invalid API path {_show(path)}: not an absolute path")
    segments = path[1:].split("/")
    for i, segment in enumerate(segments):
        if segment in (".", "..") or not _PATH_SEGMENT.match(segment):
            raise InvalidInput(
                f"invalid API path {_show(path)}: segment {_show(segment)} is not a Kubernetes "
                "name (a name with '/', '..', '%', '#', '?' or spaces cannot be in a URL)"
            )
        namespace = _in_api(segments, i) and segments[i - 1] == "namespaces"
        if namespace and (len(segment) > 63 or not _DNS_LABEL.match(segment)):
            raise InvalidInput(
                f"invalid API path {_show(path)}: namespace {_show(segment)} is not a DNS "
                "label (RFC 1123)"
            )
    return path


def url_path(url: str) -> str:
    """``url`` if no segment of its path, once percent-decoded, is ``.`` or ``..`` or holds
    ``/``, ``\\``, ``#``, ``?``, ``%`` or whitespace: the check of :func:`api_path` for a URL
    another library built (the official clients percent-encode names, so ``:`` arrives as
    ``%3A`` and is fine, but ``..`` arrives as it is and urllib3 resolves it)."""
    from urllib.parse import unquote, urlsplit

    for segment in urlsplit(url).path.split("/")[1:]:
        name = unquote(segment)
        if name in (".", "..") or _URL_UNSAFE.search(name):
            raise InvalidInput(
                f"invalid URL {_show(url)}: segment {_show(name)} is not a Kubernetes name"
            )
    return url


_URL_UNSAFE = re.compile(r"[/\\#?%\s]")


def _in_api(segments: list[str], i: int) -> bool:
    """Whether ``segments[i]`` follows ``/api/v1/namespaces`` or ``/apis/G/V/namespaces``."""
    return (segments[0] == "api" and i == 3) or (segments[0] == "apis" and i == 4)


def token(value: object, what: str = "token") -> int:
    """``value`` if it is a positive integer that fits int64 (``bool`` is not an integer
    here; floats, ``Decimal`` and strings are refused, never rounded)."""
    return _integer(value, what, 1)


def version(value: object, what: str = "expected_version") -> int:
    """A non-negative integer (a catalog row's version), with the same type rules as
    :func:`token`."""
    return _integer(value, what, 0)


def _integer(value: object, what: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{what} must be an integer, got {type(value).__name__} {value!r:.40}")
    if not low <= value <= MAX_TOKEN:
        raise InvalidInput(f"{what} must be between {low} and {MAX_TOKEN}, got {value}")
    return int(value)


def parse_token(text: str, what: str = "token") -> int:
    """A token written as text: ASCII digits only, no sign, ``_`` or leading zero (surrounding
    ASCII whitespace, such as a file's final newline, is ignored)."""
    stripped = text.strip(" \t\r\n")
    if not _TOKEN_TEXT.match(stripped) or int(stripped) > MAX_TOKEN:
        raise InvalidInput(f"invalid {what} {_show(stripped)}: want ASCII digits, 1 to {MAX_TOKEN}")
    return int(stripped)


def lease_id(value: object, what: str = "lease id") -> str:
    """A grant's lease id as the operator writes it (ASCII letters, digits, ``._-``, <= 64)."""
    if not isinstance(value, str) or not _LEASE_ID.match(value):
        raise InvalidInput(f"invalid {what} {_show(value)}")
    return value


def finite(value: float, what: str) -> float:
    """``value`` unless it is NaN or infinite (``float()`` takes ``nan`` and ``inf``)."""
    if not math.isfinite(value):
        raise InvalidInput(f"{what} must be a finite number, got {value}")
    return value


def _show(value: object) -> str:
    """A bounded, printable rendering of a refused value for a one-line message."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
