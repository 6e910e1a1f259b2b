#!/usr/bin/env bash
# The whole test suite: installs what the tests need (Debian packages, when run as root), builds
# the workspace, runs every test, and smoke-runs the fuzz targets when a nightly toolchain and
# cargo-fuzz are available. It ends with a summary of the skipped tests (with CI set, a skip for
# something this script installs fails the run) and of what the run left in /tmp. `.ci/run`
# calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

# Every skipped test appends `suite<TAB>test<TAB>component<TAB>reason` here (Rust tests, the Python
# tests' conftest, and this script's own skipped steps); the summary at the end lists them.
mkdir -p target
export PREHEAT_SKIP_LOG="$PWD/target/preheat-skips.tsv"
: >"$PREHEAT_SKIP_LOG"
# A step's start, with the seconds since the run began (to see where the suite's time goes).
step() { echo "test.sh: [${SECONDS}s] $*"; }
skip() { # skip STEP COMPONENT REASON: a step of this script that did not run
  printf 'test.sh\t%s\t%s\t%s\n' "$1" "$2" "$3" >>"$PREHEAT_SKIP_LOG"
  echo "test.sh: SKIP $1: $3"
}
# What existed in /tmp before the run: whatever /tmp/preheat-* appears and stays was left behind by
# this run (this script's own logs excepted: kept where the run failed, removed where it passed); the same for the network namespaces `demo --netns`
# makes (/run/netns/preheat-PID) and for the Rust tests' temporary files and directories
# (tempfile's /tmp/.tmpXXXXXX, and anything written beside them).
tmp_listing() {
  { find /tmp /run/netns -maxdepth 1 -name 'preheat-*'; find /tmp -maxdepth 1 -name '.tmp*'; } \
    2>/dev/null | sort
}
tmp_before=$(tmp_listing)

# The components this script provides itself (Debian binaries and PyPI packages below, the preheat
# binary it builds, cargo-fuzz when there is a nightly toolchain): on CI a test that skips for one
# of them fails the run.
installed=(preheat)
need=()
# Go builds the static net/http servers of the pre-flight and observation tests: the official
# release in /usr/local/go where there is one (this machine kind has it, not always on PATH),
# else Debian's golang-go.
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH="$PATH:/usr/local/go/bin"
fi
# The lab's servers and peer load generators (scripts/setup-lab.sh installs the same set), a
# server outside the catalog (lighttpd), the programs the cache-affinity experiments run on
# fixed inputs (gzip, xz, sqlite3, gcc), QEMU for the real guests (their image is made from
# packages apt downloads, never installs: see the guest-image step below), Go, Node.js and a
# JDK (servers in managed runtimes, issue 23).
for pkg_bin in memcached:memcached nginx-light:nginx valgrind:valgrind gcc:gcc make:make \
    redis-server:redis-server mariadb-server:mariadbd libmemcached-tools:memcaslap wrk:wrk \
    lighttpd:lighttpd gzip:gzip xz-utils:xz sqlite3:sqlite3 util-linux:setpriv \
    qemu-system-x86:qemu-system-x86_64 golang-go:go nodejs:node \
    default-jdk-headless:javac; do
  pkg=${pkg_bin%%:*}; bin=${pkg_bin##*:}
  installed+=("$bin")
  command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || need+=("$pkg")
done
pip_packages=(matplotlib pandas pyarrow rich ray ruff mypy)
installed+=("${pip_packages[@]}" cargo-fuzz)

# At every exit (success, a failed step, Ctrl-C): the skip summary, then what was left in /tmp.
finish() {
  local status=$? left
  trap - EXIT
  python3 scripts/skip-summary.py "$PREHEAT_SKIP_LOG" --installed "${installed[*]}" \
    || { [ "$status" -ne 0 ] || status=1; }
  left=$(comm -13 <(printf '%s\n' "$tmp_before") <(tmp_listing) \
    | grep -vE '^/tmp/preheat-(test\.log|cargo-fuzz-install\.log|fuzz-.*\.log)$' || true)
  if [ -n "$left" ]; then
    echo "test.sh: left behind in /tmp or /run/netns by this run (tests and the demo must remove what they create):"
    printf '  %s\n' $left
    if [ -n "${CI:-}" ]; then
      echo "test.sh: FAILED (CI): the run left files behind"
      [ "$status" -ne 0 ] || status=1
    fi
  fi
  if [ "$status" -eq 0 ]; then
    # This script's own logs are for a failure's diagnosis: a run that passed removes them.
    rm -f /tmp/preheat-test.log /tmp/preheat-cargo-fuzz-install.log /tmp/preheat-fuzz-*.log
    echo "test.sh: [${SECONDS}s] all tests passed"
  else
    echo "test.sh: this run's logs (where it got that far): /tmp/preheat-test.log, /tmp/preheat-fuzz-*.log"
  fi
  exit "$status"
}
trap finish EXIT
# A signal ends the run as failed (the EXIT trap alone would see the status of the last command).
trap 'exit 130' INT
trap 'exit 143' TERM
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing ${need[*]} from Debian packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    # Debian starts the packaged daemons; the tests start their own on other ports.
    for svc in memcached nginx redis-server mariadb lighttpd; do
      systemctl stop "$svc" >/dev/null 2>&1 || service "$svc" stop >/dev/null 2>&1 || true
    done
  else
    echo "test.sh: missing ${need[*]} and cannot install them (not root or no apt-get): the tests that need them will SKIP"
  fi
fi

# The guest image (preheat-guest) is built from packages apt downloads (the kernel that
# linux-image-amd64 names, busybox-static): apt needs its package lists for that.
if ! apt-cache show linux-image-amd64 >/dev/null 2>&1 && [ "$(id -u)" = 0 ] \
    && command -v apt-get >/dev/null 2>&1; then
  echo "test.sh: apt has no package lists (for the guest image): apt-get update"
  apt-get update -qq
fi

step "building the workspace"
cargo build --workspace --quiet
if cargo fmt --version >/dev/null 2>&1; then
  step "formatting (cargo fmt --check)"
  cargo fmt --all --check >/dev/null || { echo "test.sh: run cargo fmt --all"; cargo fmt --all --check | head -40; exit 1; }
else
  skip "format check (cargo fmt)" rustfmt "rustfmt is not installed (rustup component add rustfmt)"
fi
if cargo clippy --version >/dev/null 2>&1; then
  step "lints (cargo clippy, warnings are errors)"
  cargo clippy --workspace --all-targets --quiet -- -D warnings || { echo "test.sh: fix the clippy findings above"; exit 1; }
else
  skip "lints (cargo clippy)" clippy "clippy is not installed (rustup component add clippy)"
fi
step "API docs (cargo doc, warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
# Two passes. Tests of one binary run in parallel on the two CPUs, so a test whose outcome depends
# on the machine's timing (caches, wake-ups, deadlines) lives in a `timing` module and runs in the
# second pass, after every other test, one at a time: nothing else loads the CPUs meanwhile.
step "running the tests"
cargo test --workspace --quiet --no-fail-fast -- --skip timing:: 2>&1 | tee /tmp/preheat-test.log
status=${PIPESTATUS[0]}
if [ "$status" -ne 0 ]; then
  exit "$status"
fi
step "running the timing-dependent tests alone (timing::, one at a time)"
cargo test --workspace --tests --quiet --no-fail-fast -- timing:: --test-threads=1 2>&1 \
  | tee -a /tmp/preheat-test.log
status=${PIPESTATUS[0]}
if [ "$status" -ne 0 ]; then
  exit "$status"
fi

if rustup toolchain list 2>/dev/null | grep -q nightly && ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "test.sh: installing cargo-fuzz (cargo install cargo-fuzz --locked) for the fuzz targets"
  cargo install cargo-fuzz --locked --quiet >/tmp/preheat-cargo-fuzz-install.log 2>&1 \
    || echo "test.sh: cargo-fuzz could not be installed (see /tmp/preheat-cargo-fuzz-install.log)"
fi
step "the Python lab package (experiments, plots, reports)"
# Its packages as python/pyproject.toml declares them (the one list: dependencies, the lab and
# test extras), installed the way scripts/setup-lab.sh installs them for the lab.
python3 -m pip install -q -e "python[lab,test]" >/dev/null 2>&1 \
  || echo "test.sh: could not install the lab's Python packages (pip install -e 'python[lab,test]')"
# Ray runs the lab's sweeps on a cluster (--executor ray); its test skips, saying so, without it.
python3 -c "import ray" 2>/dev/null \
  || python3 -m pip install -q -e "python[ray]" >/dev/null 2>&1 \
  || echo "test.sh: could not install ray: the ray-executor test will SKIP"
# Lint and type checks of the lab package (configured in python/pyproject.toml).
for tool in ruff mypy; do
  python3 -m "$tool" --version >/dev/null 2>&1 \
    || python3 -m pip install -q "$tool" >/dev/null 2>&1 \
    || echo "test.sh: could not install $tool"
done
if python3 -m ruff --version >/dev/null 2>&1; then
  step "Python lints (ruff check)"
  (cd python && python3 -m ruff check -q .) || { echo "test.sh: fix the ruff findings above"; exit 1; }
else
  skip "Python lints (ruff)" ruff "ruff could not be installed (pip install ruff)"
fi
if python3 -m mypy --version >/dev/null 2>&1; then
  step "Python types (mypy)"
  (cd python && python3 -m mypy) || { echo "test.sh: fix the mypy findings above"; exit 1; }
else
  skip "Python types (mypy)" mypy "mypy could not be installed (pip install mypy)"
fi
# The lab drives the release CLI when it exists, else the debug one built above.
# The tests that do not measure run on both CPUs (pytest-xdist); the slow end-to-end runs, which
# measure, after them and alone, one at a time (as the Rust timing pass).
both_cpus=(-n 2)
python3 -c "import xdist" 2>/dev/null \
  || { echo "test.sh: pytest-xdist is missing: the Python tests run on one CPU"; both_cpus=(); }
step "Python tests (pytest on both CPUs; the slowest five listed)"
(cd python && python3 -m pytest -q "${both_cpus[@]}" -m "not slow" --durations=5) || exit 1
step "Python end-to-end runs that measure (pytest -m slow, one at a time)"
(cd python && python3 -m pytest -q -m slow --durations=5) || exit 1

if command -v cargo-fuzz >/dev/null 2>&1 && rustup toolchain list 2>/dev/null | grep -q nightly; then
  for t in decode_profile decode_announcement decode_net; do
    step "fuzzing $t for 10 s"
    (cd fuzz && cargo +nightly fuzz run "$t" -- -max_total_time=10 -rss_limit_mb=1024 >/tmp/preheat-fuzz-$t.log 2>&1) \
      || { echo "fuzz target $t failed:"; tail -30 /tmp/preheat-fuzz-$t.log; exit 1; }
  done
elif ! rustup toolchain list 2>/dev/null | grep -q nightly; then
  skip "fuzzing" nightly "needs a nightly toolchain (rustup toolchain install nightly) and cargo-fuzz"
else
  skip "fuzzing" cargo-fuzz "cargo-fuzz is not installed and could not be (cargo install cargo-fuzz)"
fi
