#!/usr/bin/env bash
# Make sure PostgreSQL server binaries (initdb, pg_ctl, postgres) are installed: the SQL-fence
# tests start a throwaway server from them (tests/pg.py). Debian's `postgresql` package; we only
# use its binaries (the packaged cluster service is not needed and not started by the tests).
set -euo pipefail

found() {
  command -v initdb >/dev/null 2>&1 && return 0
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null 2>&1
}

if found; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "PostgreSQL server binaries are missing: install them (Debian: apt-get install postgresql)" >&2
  exit 1
fi
echo "[fencedlease] installing PostgreSQL (apt-get install postgresql) for the SQL-fence tests" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends postgresql >/dev/null
found || { echo "PostgreSQL install did not provide initdb" >&2; exit 1; }
