#!/usr/bin/env bash
# Make sure the redis-server binary is installed: the Redis-fence tests start a throwaway server
# from it per test session (tests/fences/servers.py). Debian's `redis-server` package; we only use
# its binary (the packaged service is not needed and not started by the tests).
set -euo pipefail
. "$(dirname "$0")/apt-package.sh"

found() {
  command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ]
}

after_install() {
  # The package starts its own service where an init system runs; the tests never use it.
  if command -v service >/dev/null 2>&1; then service redis-server stop >/dev/null 2>&1 || true; fi
}

ensure_apt_package redis-server "redis-server" "the Redis-fence tests"
