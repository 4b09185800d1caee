"""Storage adapters of the grant authority (etcd): :mod:`fencedlease.store.etcd`."""
