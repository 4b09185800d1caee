"""fencedlease: leases with fencing tokens from etcd revisions, enforced at the resource."""

# `fencedlease` is shared by two distributions: this one (the operator) and fencedlease-client
# (fencedlease/client/, a PEP 420 portion without an __init__.py).  Installed together they land
# in one directory; installed apart (an editable install of either, PYTHONPATH, a venv on top of
# system packages) extend_path finds the other's portion on sys.path.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

__version__ = "0.1.0"
