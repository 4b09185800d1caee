from fencedlease.cli import main

raise SystemExit(main())
