#!/usr/bin/env bash
# The whole test suite: installs what the tests need (Debian packages, when run as root), builds
# the workspace, runs every test, and smoke-runs the fuzz targets when a nightly toolchain and
# cargo-fuzz are available. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for pkg_bin in memcached:memcached nginx-light:nginx valgrind:valgrind gcc:gcc make:make; do
  pkg=${pkg_bin%%:*}; bin=${pkg_bin##*:}
  command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing ${need[*]} from Debian packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    # Debian starts the packaged daemons; the tests start their own on other ports.
    systemctl stop memcached nginx >/dev/null 2>&1 || service memcached stop >/dev/null 2>&1 || true
    service nginx stop >/dev/null 2>&1 || true
  else
    echo "test.sh: missing ${need[*]} and cannot install them (not root or no apt-get): the tests that need them will SKIP"
  fi
fi

echo "test.sh: building the workspace"
cargo build --workspace --quiet
echo "test.sh: running the tests"
cargo test --workspace --quiet 2>&1 | tee /tmp/preheat-test.log
status=${PIPESTATUS[0]}
if [ "$status" -ne 0 ]; then
  exit "$status"
fi

if rustup toolchain list 2>/dev/null | grep -q nightly && ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "test.sh: installing cargo-fuzz (cargo install cargo-fuzz --locked) for the fuzz targets"
  cargo install cargo-fuzz --locked --quiet >/tmp/preheat-cargo-fuzz-install.log 2>&1 \
    || echo "test.sh: cargo-fuzz could not be installed (see /tmp/preheat-cargo-fuzz-install.log)"
fi
echo "test.sh: the Python lab package (experiments, plots, reports)"
python3 -c "import matplotlib, pandas, pytest" 2>/dev/null \
  || python3 -m pip install -q matplotlib pandas pytest >/dev/null 2>&1 \
  || echo "test.sh: could not install matplotlib/pandas/pytest"
# The lab drives the release CLI when it exists, else the debug one built above.
(cd python && python3 -m pytest -q) || exit 1

if command -v cargo-fuzz >/dev/null 2>&1 && rustup toolchain list 2>/dev/null | grep -q nightly; then
  for t in decode_profile decode_announcement decode_net; do
    echo "test.sh: fuzzing $t for 20 s"
    (cd fuzz && cargo +nightly fuzz run "$t" -- -max_total_time=20 -rss_limit_mb=1024 >/tmp/preheat-fuzz-$t.log 2>&1) \
      || { echo "fuzz target $t failed:"; tail -30 /tmp/preheat-fuzz-$t.log; exit 1; }
  done
else
  echo "test.sh: SKIP fuzzing: needs a nightly toolchain and cargo-fuzz (cargo install cargo-fuzz)"
fi
echo "test.sh: all tests passed"
