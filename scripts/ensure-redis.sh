#!/usr/bin/env bash
# Make sure the redis-server binary is installed: the Redis-fence tests start a throwaway server
# from it per test session (tests/fences/servers.py). Debian's `redis-server` package; we only use
# its binary (the packaged service is not needed and not started by the tests).
set -euo pipefail

found() {
  command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ]
}

if found; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "redis-server is missing: install it (Debian: apt-get install redis-server)" >&2
  exit 1
fi
echo "[fencedlease] installing redis-server (apt-get install redis-server) for the Redis-fence tests" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends redis-server >/dev/null
# The package starts its own service where an init system runs; the tests never use it.
if command -v service >/dev/null 2>&1; then service redis-server stop >/dev/null 2>&1 || true; fi
found || { echo "the redis-server install did not provide redis-server" >&2; exit 1; }
