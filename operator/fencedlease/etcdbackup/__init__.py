"""Backup and restore of the etcd that holds the fencing state (docs/operations.md, "Backup and
restore"): :mod:`.plan` decides (pure), :mod:`.cli` runs ``etcdutl`` and touches files."""
