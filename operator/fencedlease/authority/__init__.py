"""The grant authority's pure core: lease decisions, fence checks and their result types.

No I/O lives here; :mod:`fencedlease.store.etcd` runs these decisions as etcd transactions and
:mod:`fencedlease.authority.memory` runs them against a dict (tests, operator unit tests).
"""
