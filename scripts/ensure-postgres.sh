#!/usr/bin/env bash
# Make sure PostgreSQL server binaries (initdb, pg_ctl, postgres) are installed: the SQL-fence
# tests start a throwaway server from them (tests/pg.py). Debian's `postgresql` package; we only
# use its binaries (the packaged cluster service is not needed and not started by the tests).
set -euo pipefail
. "$(dirname "$0")/apt-package.sh"

found() {
  command -v initdb >/dev/null 2>&1 && return 0
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null 2>&1
}

ensure_apt_package postgresql "PostgreSQL (initdb)" "the SQL-fence tests"
