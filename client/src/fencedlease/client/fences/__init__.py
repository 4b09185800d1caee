"""Fences where side effects really land (docs/fences.md): one result vocabulary for all.

============================================  ==============================================
:mod:`~fencedlease.client.publish`            a FencedArtifact (the admission webhook)
:class:`~fencedlease.client.SqlFence`         a catalog row, conditional ``UPDATE``
:mod:`.postgres`                              PostgreSQL enforcing it: trigger + grants
:mod:`.redis`                                 Redis: one Lua script (``pip install
                                              'fencedlease-client[redis]'``)
:mod:`.etcd`                                  etcd keys of your own: one transaction
                                              (``pip install 'fencedlease-client[etcd]'``)
:mod:`.s3`                                    S3: staged objects + a fenced pointer
                                              (``pip install 'fencedlease-client[s3]'``)
============================================  ==============================================

Each returns ``Applied | Duplicate | StaleFence | Rejected`` (``Unavailable`` when the store
could not be reached) and refuses bad input (:class:`FenceInputError`) before sending anything.
The submodules import their store's client; import the one you use.
"""

from __future__ import annotations

from fencedlease.client.fences.core import (
    MAX_OPERATIONS,
    FenceInputError,
    FenceRequest,
    FenceResult,
    InvalidMark,
    Mark,
    check_token,
    decide,
)

__all__ = [
    "MAX_OPERATIONS",
    "FenceInputError",
    "FenceRequest",
    "FenceResult",
    "InvalidMark",
    "Mark",
    "check_token",
    "decide",
]
