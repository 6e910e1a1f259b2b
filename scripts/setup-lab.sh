#!/usr/bin/env bash
# Install the lab's servers and peer load generators from Debian packages:
#   memcached, nginx-light, redis-server, mariadb-server (the servers under test, paper §4
#   Table 1 plus redis) and libmemcached-tools (memcaslap), wrk (the load generators most
#   papers use, for comparison with preheat's own client), and the programs the cache-affinity
#   experiments run on fixed inputs (gzip, xz-utils, sqlite3, gcc; setpriv from util-linux).
# Idempotent: a package that is installed (or whose program is already present, e.g. nginx from
# another flavour) is skipped. Debian starts the packaged daemons on their default ports; they
# are stopped again (preheat starts its own instances on free ports, in their own directories).
#
# Usage: sudo scripts/setup-lab.sh
set -euo pipefail

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

if [ ${#need[@]} -eq 0 ]; then
  echo "setup-lab: nothing to install"
  exit 0
fi

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
echo "setup-lab: done"
