"""Leader election of the controller replicas (``docs/operations.md``, "Controller failover").

:mod:`.decisions` is the pure client-go-style state machine (injected monotonic clock, no I/O);
:mod:`.kube` runs it against a ``coordination.k8s.io/v1`` Lease.
"""
