"""Proof that a lease status was written by the grant authority (pure, no I/O).

A FencedLease status can be written by anyone allowed to patch ``fencedleases/status``, so a
token shown there is not evidence that the authority issued it.  The controller signs every
status it writes with an HMAC over ``(namespace, name, leaseId, fencingToken)`` keyed by a
secret only it reads (``docs/tokens.md``, "Restore guard").  The restore guard trusts a status
token only when its proof verifies; anything else is reported and ignored.  Copying a valid
proof to another lease fails (the lease is in the message); replaying an older proof of the
same lease can only show a lower token, which never raises the floor.
"""

from __future__ import annotations

import hashlib
import hmac

PROOF_BYTES = 16


def _message(namespace: str, name: str, lease_id: str, token: int) -> bytes:
    return "\n".join(("fencedlease.io/v1", namespace, name, lease_id, str(token))).encode()


def sign(key: bytes, namespace: str, name: str, lease_id: str, token: int) -> str:
    """The proof (hex) the controller writes next to ``fencingToken``."""
    digest = hmac.new(key, _message(namespace, name, lease_id, token), hashlib.sha256)
    return digest.hexdigest()[: PROOF_BYTES * 2]


def verify(
    key: bytes, namespace: str, name: str, lease_id: str | None, token: int | None, proof: str
) -> bool:
    """Whether ``proof`` was made by :func:`sign` with ``key`` for exactly these values."""
    if not key or lease_id is None or token is None or not isinstance(proof, str):
        return False
    expected = sign(key, namespace, name, lease_id, token)
    return hmac.compare_digest(expected.encode(), proof.encode("utf-8", "replace"))


class TokenProofs:
    """:func:`sign` and :func:`verify` bound to one key (the controller's)."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("the token proof key must be at least 16 bytes")
        self._key = key

    def sign(self, namespace: str, name: str, lease_id: str, token: int) -> str:
        return sign(self._key, namespace, name, lease_id, token)

    def verify(
        self,
        namespace: str,
        name: str,
        lease_id: str | None,
        token: int | None,
        proof: str | None,
    ) -> bool:
        return proof is not None and verify(self._key, namespace, name, lease_id, token, proof)
