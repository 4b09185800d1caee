# Sourced by ensure-postgres.sh and ensure-redis.sh: the one way a test prerequisite that
# Debian packages is installed.
#
# ensure_apt_package PACKAGE WHAT PURPOSE: nothing when `found` (defined by the caller)
# succeeds; else, as root, installs Debian's PACKAGE quietly and runs `after_install` if the
# caller defines one, then checks `found` again; not root: says how to install it and fails.
ensure_apt_package() {
  local package=$1 what=$2 purpose=$3
  if found; then
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "$what is not installed: install it (Debian: apt-get install $package)" >&2
    exit 1
  fi
  echo "[fencedlease] installing $package (apt-get install $package) for $purpose" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "$package" >/dev/null
  if declare -F after_install >/dev/null; then
    after_install
  fi
  found || { echo "the $package install did not provide $what" >&2; exit 1; }
}
