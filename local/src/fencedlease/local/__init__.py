"""Local machinery: Go-built binaries, a local control plane, and ``fencedlease local up/down``.

Nothing here is loaded by ``fencedlease run``: the CLI imports this package only for the
``local`` subcommands, and the tests and benchmarks import it directly.

- :mod:`fencedlease.local.binaries` builds and caches the pinned binaries;
- :mod:`fencedlease.local.cluster` runs etcd and kube-apiserver as child processes;
- :mod:`fencedlease.local.up` is the ``local up`` / ``local down`` process management.
"""
