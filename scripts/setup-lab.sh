#!/usr/bin/env bash
# Install what `preheat lab` needs:
# * from Debian packages: memcached, nginx-light, redis-server, mariadb-server (the servers
#   under test, paper §4 Table 1 plus redis) and libmemcached-tools (memcaslap), wrk (the load
#   generators most papers use, for comparison with preheat's own client), the programs the
#   cache-affinity experiments run on fixed inputs (gzip, xz-utils, sqlite3, gcc; setpriv from
#   util-linux), and python3 with pip;
# * with pip: the lab's Python package with the packages python/pyproject.toml declares
#   (`dependencies` and the `lab` extra: numpy, pandas, matplotlib, pyarrow, rich), editable
#   (`pip install -e python[lab]`), for the python3 first on PATH, the one `preheat lab` runs.
#   Where that python3 is Debian's (externally managed, PEP 668) pip installs into /usr/local
#   with --break-system-packages; inside a virtual environment, into it.
# Idempotent: a package that is installed (or whose program is already present, e.g. nginx from
# another flavour) is skipped; pip leaves satisfied requirements alone. Debian starts the
# packaged daemons on their default ports; they are stopped again (preheat starts its own
# instances on free ports, in their own directories).
#
# Usage: sudo scripts/setup-lab.sh   (as root; under sudo, PATH is sudo's: the script says which
# python3 it installed for)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

# package:program — the program that shows the package (or an equivalent) is present.
wanted=(
  memcached:memcached
  nginx-light:nginx
  redis-server:redis-server
  mariadb-server:mariadbd
  libmemcached-tools:memcaslap
  wrk:wrk
  lighttpd:lighttpd
  gzip:gzip
  xz-utils:xz
  sqlite3:sqlite3
  gcc:gcc
  util-linux:setpriv
  python3:python3
)

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

has_program() {
  command -v "$1" >/dev/null 2>&1 && return 0
  local d
  for d in /usr/sbin /usr/local/sbin /sbin; do
    [ -x "$d/$1" ] && return 0
  done
  return 1
}

need=()
for pkg_prog in "${wanted[@]}"; do
  pkg=${pkg_prog%%:*}
  prog=${pkg_prog##*:}
  if installed "$pkg"; then
    echo "setup-lab: $pkg is installed"
  elif has_program "$prog"; then
    echo "setup-lab: $prog is present (not from $pkg): keeping it"
  else
    need+=("$pkg")
  fi
done

# pip, for the Python packages below (Debian's python3 comes without it).
if ! python3 -m pip --version >/dev/null 2>&1 && ! installed python3-pip; then
  need+=(python3-pip)
fi

install_debian() {
  if [ "$(id -u)" != 0 ]; then
    echo "setup-lab: missing ${need[*]}; installing needs root: run  sudo $0" >&2
    echo "setup-lab: (or: sudo apt-get install ${need[*]})" >&2
    exit 1
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup-lab: missing ${need[*]} and there is no apt-get: install the equivalent packages" \
      "of your distribution" >&2
    exit 1
  fi

  echo "setup-lab: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"

  # Debian starts the packaged daemons; preheat runs its own instances, so stop them (and keep
  # going when there is no init system, as in containers).
  for svc in memcached nginx redis-server mariadb lighttpd; do
    if command -v systemctl >/dev/null 2>&1 && systemctl stop "$svc" >/dev/null 2>&1; then
      echo "setup-lab: stopped the $svc service"
    elif command -v service >/dev/null 2>&1 && service "$svc" stop >/dev/null 2>&1; then
      echo "setup-lab: stopped the $svc service"
    fi
  done
}

# The lab's Python packages, as python/pyproject.toml declares them (the one list), for the
# python3 that `preheat lab` runs.
install_python() {
  local py args=(install --quiet --editable "$repo/python[lab]")
  py=$(command -v python3)
  # Debian's own python3 refuses pip outside a virtual environment (PEP 668, the
  # EXTERNALLY-MANAGED marker); the lab runs that python3, so install beside Debian's packages.
  if "$py" -c 'import os, sys, sysconfig
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
sys.exit(0 if os.path.isfile(marker) and sys.prefix == sys.base_prefix else 1)'; then
    echo "setup-lab: $py is managed by Debian (PEP 668): pip installs into /usr/local" \
      "(--break-system-packages)"
    args+=(--break-system-packages)
  fi
  echo "setup-lab: the lab's Python packages for $py: pip ${args[*]}"
  if ! "$py" -m pip "${args[@]}"; then
    echo "setup-lab: pip failed (above); the lab's commands will say what is missing" >&2
    exit 1
  fi
  "$py" -c 'import matplotlib, numpy, pandas' \
    || { echo "setup-lab: $py still cannot import numpy, pandas, matplotlib" >&2; exit 1; }
  echo "setup-lab: $py has the lab's Python packages"
}

if [ ${#need[@]} -eq 0 ]; then
  echo "setup-lab: no Debian package to install"
else
  install_debian
fi
install_python
echo "setup-lab: done"
