#!/usr/bin/env bash
# The whole test suite: installs what the tests need (Debian packages, when run as root), builds
# the workspace, runs every test, and smoke-runs the fuzz targets when a nightly toolchain and
# cargo-fuzz are available. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
# The lab's servers and peer load generators (scripts/setup-lab.sh installs the same set), and
# the programs the cache-affinity experiments run on fixed inputs (gzip, xz, sqlite3, gcc).
for pkg_bin in memcached:memcached nginx-light:nginx valgrind:valgrind gcc:gcc make:make \
    redis-server:redis-server mariadb-server:mariadbd libmemcached-tools:memcaslap wrk:wrk \
    gzip:gzip xz-utils:xz sqlite3:sqlite3 util-linux:setpriv; do
  pkg=${pkg_bin%%:*}; bin=${pkg_bin##*:}
  command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing ${need[*]} from Debian packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    # Debian starts the packaged daemons; the tests start their own on other ports.
    for svc in memcached nginx redis-server mariadb; do
      systemctl stop "$svc" >/dev/null 2>&1 || service "$svc" stop >/dev/null 2>&1 || true
    done
  else
    echo "test.sh: missing ${need[*]} and cannot install them (not root or no apt-get): the tests that need them will SKIP"
  fi
fi

echo "test.sh: building the workspace"
cargo build --workspace --quiet
if cargo fmt --version >/dev/null 2>&1; then
  echo "test.sh: formatting (cargo fmt --check)"
  cargo fmt --all --check >/dev/null || { echo "test.sh: run cargo fmt --all"; cargo fmt --all --check | head -40; exit 1; }
else
  echo "test.sh: SKIP format check: rustfmt is not installed (rustup component add rustfmt)"
fi
if cargo clippy --version >/dev/null 2>&1; then
  echo "test.sh: lints (cargo clippy, warnings are errors)"
  cargo clippy --workspace --all-targets --quiet -- -D warnings || { echo "test.sh: fix the clippy findings above"; exit 1; }
else
  echo "test.sh: SKIP lints: clippy is not installed (rustup component add clippy)"
fi
echo "test.sh: API docs (cargo doc, warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
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
python3 -c "import matplotlib, pandas, pytest, pyarrow, rich" 2>/dev/null \
  || python3 -m pip install -q matplotlib pandas pytest pyarrow rich >/dev/null 2>&1 \
  || echo "test.sh: could not install matplotlib/pandas/pytest/pyarrow/rich"
# Ray runs the lab's sweeps on a cluster (--executor ray); its test skips, saying so, without it.
python3 -c "import ray" 2>/dev/null \
  || python3 -m pip install -q "ray==2.*" >/dev/null 2>&1 \
  || echo "test.sh: could not install ray: the ray-executor test will SKIP"
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
