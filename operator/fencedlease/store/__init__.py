"""Storage adapters of the grant authority (etcd)."""

from fencedlease.store.etcd import EtcdStore, parse_endpoint

__all__ = ["EtcdStore", "parse_endpoint"]
