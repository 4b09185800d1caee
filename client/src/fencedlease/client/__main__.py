"""``python -m fencedlease.client``: the ``fencedlease`` command (token, publish, and the
commands of any installed distribution that adds some)."""

from fencedlease.client.cli import main

raise SystemExit(main())
