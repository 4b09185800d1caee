"""The FencedLease operator: Kopf handlers feed caches; one scheduler drives grants and expiry."""
