"""fencedlease: leases with fencing tokens from etcd revisions, enforced at the resource."""

__version__ = "0.1.0"
