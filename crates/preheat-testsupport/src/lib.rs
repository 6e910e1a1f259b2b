//! Support shared by the workspace's tests; a dev-dependency only, never linked into a program.
//!
//! * Where the build puts things: [`target_dir`], [`debug_dir`] and [`built`] (one answer for
//!   every test crate, `CARGO_TARGET_DIR` included); building a companion: [`cargo_build`].
//! * The one way a test says it skipped: [`skip()`] (or the [`skip!`] macro). `cargo test` hides
//!   the output of passing tests, so a test that merely printed `SKIP` and returned looked like
//!   a pass; [`skip()`] writes `SKIP <test>: <reason>` straight to the process's stderr (past
//!   the harness's capture) and, when `PREHEAT_SKIP_LOG` names a file, appends one line
//!
//!   ```text
//!   rust\t<test>\t<component>\t<reason>\n
//!   ```
//!
//!   to it (tab-separated; tabs and line breaks inside a field become spaces). The line goes out
//!   in one `write` on an `O_APPEND` descriptor, so lines from tests running in parallel threads
//!   and processes never interleave. `scripts/test.sh` sets the variable and summarizes the file
//!   (together with the Python tests' skips, which write the same format) at the end of a run.
//!
//! `component` is a short key of what was missing: the Debian binary name (`memcached`, `nginx`,
//! `redis-server`, `mariadbd`, `valgrind`, `gcc`, `wrk`, `memcaslap`, `gzip`, `xz`, `sqlite3`,
//! `setpriv`, ...) or a capability (`root`, `realtime`, `ptrace`, `netns`, `pmu`, `nightly`,
//! `quiet-machine`, ...), so the summary can tell a skip the test command should have prevented
//! (it installs the program) from one this machine cannot help.
#![forbid(unsafe_code)]

use std::io::Write;
use std::path::{Path, PathBuf};

/// The environment variable naming the skip log.
pub const SKIP_LOG_ENV: &str = "PREHEAT_SKIP_LOG";

/// The workspace's root directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The build's target directory: `CARGO_TARGET_DIR` (a relative one is relative to the
/// workspace root, as cargo reads it there), else `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => {
            let d = PathBuf::from(d);
            if d.is_absolute() {
                d
            } else {
                workspace_root().join(d)
            }
        }
        _ => workspace_root().join("target"),
    }
}

/// Where `cargo build` (the dev profile) puts the workspace's programs and libraries.
pub fn debug_dir() -> PathBuf {
    target_dir().join("debug")
}

/// A program or library of the workspace as `cargo build` leaves it: `debug_dir()/name`
/// (e.g. `preheat-kv`, `preheatd`, `libpreheat_agent.so`). It may not exist yet.
pub fn built(name: &str) -> PathBuf {
    debug_dir().join(name)
}

/// `cargo build --quiet -p PACKAGE...` of this workspace, by the cargo running the tests
/// (`$CARGO`), stdin closed: the one way a test builds a companion program or library of the
/// workspace (it lands in [`built`] unless the caller adds `--target-dir`). The caller adds
/// arguments and runs it.
pub fn cargo_build(packages: &[&str]) -> std::process::Command {
    let mut cmd =
        std::process::Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root())
        .args(["build", "--quiet"])
        .arg("--manifest-path")
        .arg(workspace_root().join("Cargo.toml"))
        .stdin(std::process::Stdio::null());
    for p in packages {
        cmd.args(["-p", p]);
    }
    cmd
}

/// Report that the running test is skipped because `component` is missing (see the crate
/// docs): `SKIP <test>: <reason>` on stderr, and a line in `PREHEAT_SKIP_LOG` when set. The
/// caller returns afterwards, or leaves out just the part that needs `component` (a partial
/// skip is reported the same way). Never panics: a log that cannot be written is reported on
/// stderr.
pub fn skip(component: &str, reason: &str) {
    let test = test_name();
    let _ = std::io::stderr().write_all(format!("SKIP {test}: {reason}\n").as_bytes());
    if let Some(path) = std::env::var_os(SKIP_LOG_ENV).filter(|p| !p.is_empty()) {
        if let Err(e) = append(Path::new(&path), &log_line(&test, component, reason)) {
            let _ = std::io::stderr().write_all(
                format!(
                    "warning: could not record the skip of {test} in {}: {e}\n",
                    Path::new(&path).display()
                )
                .as_bytes(),
            );
        }
    }
}

/// [`skip()`] with a formatted reason: `skip!("memcached", "{} is not installed", name)`.
#[macro_export]
macro_rules! skip {
    ($component:expr, $($reason:tt)+) => {
        $crate::skip($component, &::std::format!($($reason)+))
    };
}

/// One line of the skip log.
pub fn log_line(test: &str, component: &str, reason: &str) -> String {
    format!(
        "rust\t{}\t{}\t{}\n",
        field(test),
        field(component),
        field(reason)
    )
}

/// A log field: tabs and line breaks become spaces (they separate fields and lines).
fn field(s: &str) -> String {
    s.replace(['\t', '\n', '\r'], " ")
}

/// Append `line` with a single `write` on an `O_APPEND` descriptor (atomic for a short line).
fn append(path: &Path, line: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)?;
    let n = f.write(line.as_bytes())?;
    if n < line.len() {
        // Only on a full disk or a signal; finish the line rather than leave half of it.
        f.write_all(&line.as_bytes()[n..])?;
    }
    Ok(())
}

/// The running test as `package/target::test` (`package::test` for a library's own unit
/// tests): the package from cargo's `CARGO_PKG_NAME` (set while `cargo test` runs the test),
/// the target from the test executable's name, the test from the harness's name of the test's
/// thread. Parts that are unknown are left out (`?` when nothing is known).
pub fn test_name() -> String {
    let thread = std::thread::current();
    let test = thread.name().filter(|n| *n != "main").unwrap_or("?");
    let target = std::env::current_exe().ok().and_then(|p| {
        let stem = p.file_stem()?.to_str()?.to_string();
        // target/debug/deps/<target>-<16 hex digits>
        Some(match stem.rsplit_once('-') {
            Some((t, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
                t.to_string()
            }
            _ => stem,
        })
    });
    let package = std::env::var("CARGO_PKG_NAME")
        .ok()
        .filter(|p| !p.is_empty());
    let prefix = match (package, target) {
        (Some(p), Some(t)) if t == p.replace('-', "_") => p,
        (Some(p), Some(t)) => format!("{p}/{t}"),
        (Some(p), None) => p,
        (None, Some(t)) => t,
        (None, None) => return test.to_string(),
    };
    format!("{prefix}::{test}")
}

/// An installed program (`PATH`, then the sbin directories Debian puts its servers in): the
/// engine's one lookup.
pub use preheat_engine::host::find_program;

/// The system C compiler, or `None` when there is none (the skip is reported as `gcc`, naming
/// `what` needed it).
fn c_compiler(what: &Path) -> Option<PathBuf> {
    let cc = find_program("cc").or_else(|| find_program("gcc"));
    if cc.is_none() {
        skip(
            "gcc",
            &format!(
                "{}: no C compiler (cc/gcc) to build the test program",
                what.display()
            ),
        );
    }
    cc
}

/// Compile the C test program `src` into `dir` (same file stem) with the system C compiler, or
/// `None` when there is none (the skip is reported as `gcc`).
pub fn compile_c(src: &Path, dir: &Path) -> Option<PathBuf> {
    let out = dir.join(src.file_stem().unwrap_or(src.as_os_str()));
    match try_compile_c(src, &out, &["-O1", "-pthread"])? {
        Ok(p) => Some(p),
        Err(e) => panic!("compiling {} failed: {e}", src.display()),
    }
}

/// Compile `src` into `out` with `flags` (e.g. `-static`, `-shared -fPIC`): `None` when there
/// is no C compiler (the skip is reported as `gcc`), `Err` with the compiler's messages when it
/// fails (the caller decides whether that is a skip: `-static` without `libc.a`).
pub fn try_compile_c(src: &Path, out: &Path, flags: &[&str]) -> Option<Result<PathBuf, String>> {
    let cc = c_compiler(src)?;
    let o = std::process::Command::new(cc)
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(src)
        .output()
        .expect("running the C compiler");
    Some(if o.status.success() {
        Ok(out.to_path_buf())
    } else {
        Err(String::from_utf8_lossy(&o.stderr).into_owned())
    })
}

/// The Go toolchain: `go` on `PATH`, else the official release's `/usr/local/go/bin/go`;
/// `None` when there is none (the skip is reported as `go`, naming `what` needed it).
pub fn go_toolchain(what: &str) -> Option<PathBuf> {
    let go = find_program("go").or_else(|| {
        let p = PathBuf::from("/usr/local/go/bin/go");
        p.is_file().then_some(p)
    });
    if go.is_none() {
        skip("go", &format!("no Go toolchain (go) to build {what}"));
    }
    go
}

/// Build the Go program `source` (the text of one `package main` file) into `out` with `go
/// build FLAGS` and the environment `env` (e.g. `CGO_ENABLED=0`): `None` when there is no Go
/// toolchain (the skip is reported as `go`), `Err` with go's messages when the build fails.
/// Its module is made in `OUT.src` beside `out` (so it goes with the caller's temporary
/// directory); no module is downloaded (`GOFLAGS=-mod=mod`, no dependencies), nor a toolchain
/// (`GOTOOLCHAIN=local`). Go's build cache is its default (a rebuild takes seconds), or inside
/// `OUT.src` where there is no home directory for it.
pub fn try_go_build(
    source: &str,
    out: &Path,
    env: &[(&str, &str)],
    flags: &[&str],
) -> Option<Result<PathBuf, String>> {
    let go = go_toolchain(&out.display().to_string())?;
    let dir = out.with_extension("src");
    let written = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(dir.join("main.go"), source))
        .and_then(|()| std::fs::write(dir.join("go.mod"), "module preheattest\n\ngo 1.19\n"));
    if let Err(e) = written {
        return Some(Err(format!("writing the module in {}: {e}", dir.display())));
    }
    let mut cmd = std::process::Command::new(go);
    cmd.args(["build", "-o"])
        .arg(out)
        .args(flags)
        .arg(".")
        .current_dir(&dir)
        .stdin(std::process::Stdio::null())
        .env("GOFLAGS", "-mod=mod")
        .env("GOTOOLCHAIN", "local")
        .envs(env.iter().copied());
    let homeless = ["HOME", "XDG_CACHE_HOME"]
        .iter()
        .all(|v| std::env::var_os(v).is_none_or(|h| h.is_empty()));
    if homeless {
        cmd.env("GOCACHE", dir.join("gocache"))
            .env("GOPATH", dir.join("gopath"));
    }
    let o = cmd.output().expect("running go build");
    Some(if o.status.success() {
        Ok(out.to_path_buf())
    } else {
        Err(String::from_utf8_lossy(&o.stderr).into_owned())
    })
}

/// A C server that listens on 127.0.0.1:`argv[1]` and accepts and closes connections until
/// killed: the smallest listening program for the pre-flight's tests (built static or dynamic
/// with [`try_compile_c`]).
pub const ACCEPT_CLOSE_SERVER_C: &str = r#"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons(atoi(argc > 1 ? argv[1] : "0"));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 16)) return 1;
    for (;;) { int c = accept(s, 0, 0); if (c >= 0) close(c); }
}
"#;

/// A Go `net/http` server on 127.0.0.1:`PORT` (its one argument) that answers every request
/// "pong\n". Built with [`try_go_build`] and `CGO_ENABLED=0` it is statically linked, as Go's
/// default for many deployments.
pub const GO_HTTP_SERVER: &str = r#"package main

import (
	"net/http"
	"os"
)

func main() {
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("pong\n")) })
	if err := http.ListenAndServe("127.0.0.1:"+os.Args[1], nil); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(1)
	}
}
"#;

/// [`GO_HTTP_SERVER`] built statically (`CGO_ENABLED=0`) into `dir/go-http-server`; `None`
/// when there is no Go toolchain (the skip is reported as `go`). A failing build panics.
pub fn go_static_http_server(dir: &Path) -> Option<PathBuf> {
    let out = dir.join("go-http-server");
    match try_go_build(GO_HTTP_SERVER, &out, &[("CGO_ENABLED", "0")], &[])? {
        Ok(p) => Some(p),
        Err(e) => panic!("building the Go net/http server failed: {e}"),
    }
}

/// Whether `cond` becomes true within `bound`, asking every 10 ms. For what finishes
/// asynchronously after the call a test made (a joined thread's task is released a moment after
/// `join` returns; a server's agent appears): "eventually", never a timing assertion — keep
/// `bound` seconds. The one such helper of the tests (the agent's and preheatd's use it).
pub fn eventually(bound: std::time::Duration, mut cond: impl FnMut() -> bool) -> bool {
    let t0 = std::time::Instant::now();
    loop {
        if cond() {
            return true;
        }
        if t0.elapsed() > bound {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A free loopback TCP port (the engine's [`preheat_engine::host::free_port`]; good enough for
/// a test server that is started right after: it retries or fails clearly if the port was taken
/// meanwhile).
pub fn free_port() -> u16 {
    preheat_engine::host::free_port().expect("binding a loopback port")
}

/// Wait (up to 20 s) until something accepts connections on 127.0.0.1:`port`, while `child`
/// (the server that should) keeps running; an error says which of the two went wrong.
pub fn wait_port(port: u16, child: &mut std::process::Child) -> Result<u16, String> {
    let t0 = std::time::Instant::now();
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Err(format!("the server for 127.0.0.1:{port} exited: {st}"));
        }
        // Not a bare connect: one to a port nothing listens on yet can connect to itself.
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        if preheat_engine::host::accepts_connections(addr, std::time::Duration::from_secs(1)) {
            return Ok(port);
        }
        if t0.elapsed() > std::time::Duration::from_secs(20) {
            return Err(format!("nothing listens on 127.0.0.1:{port} after 20 s"));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A child `preheat` command stopped as a user would when this goes out of scope, also when the
/// test panics: SIGTERM (its handler stops the processes it started), reaped, and SIGKILL only
/// if it has not exited within 10 s.
pub struct TermOnDrop(pub std::process::Child);

impl Drop for TermOnDrop {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = preheat_engine::os::send_signal(self.0.id(), libc::SIGTERM, false);
        let t0 = std::time::Instant::now();
        while t0.elapsed() < std::time::Duration::from_secs(10) {
            if !matches!(self.0.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A child process killed (SIGKILL) and reaped when this goes out of scope, also when the test
/// panics.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A lighttpd site for a test: `dir/www` holds `files` (name, content), `dir/lighttpd.conf`
/// serves it on 127.0.0.1:`port` with `extra` configuration lines appended. Returns the
/// lighttpd executable and the configuration file, or `None` when lighttpd is not installed
/// (the caller reports the skip). Starting it (`lighttpd -D -f CONF`) is the caller's.
pub fn lighttpd_site(
    dir: &Path,
    port: u16,
    files: &[(&str, &[u8])],
    extra: &str,
) -> Option<(PathBuf, PathBuf)> {
    let exe = ["/usr/sbin/lighttpd", "/usr/bin/lighttpd"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())?;
    let www = dir.join("www");
    std::fs::create_dir_all(&www).expect("creating the site directory");
    for (name, content) in files {
        std::fs::write(www.join(name), content).expect("writing a site file");
    }
    let conf = dir.join("lighttpd.conf");
    std::fs::write(
        &conf,
        format!(
            "server.document-root = \"{}\"\nserver.bind = \"127.0.0.1\"\nserver.port = {port}\n\
             server.errorlog = \"{}\"\nserver.pid-file = \"{}\"\n{extra}",
            www.display(),
            dir.join("error.log").display(),
            dir.join("lighttpd.pid").display()
        ),
    )
    .expect("writing lighttpd.conf");
    Some((exe, conf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_have_four_fields_and_one_line_break() {
        let l = log_line(
            "a::b",
            "memcached",
            "not\tinstalled\r\n(apt-get install memcached)",
        );
        assert_eq!(
            l,
            "rust\ta::b\tmemcached\tnot installed  (apt-get install memcached)\n"
        );
    }

    #[test]
    fn the_test_name_is_the_harness_thread_name() {
        let name = test_name();
        assert!(
            name.ends_with("::tests::the_test_name_is_the_harness_thread_name"),
            "{name}"
        );
        if std::env::var_os("CARGO_PKG_NAME").is_some() {
            assert!(name.starts_with("preheat-testsupport::"), "{name}");
        }
    }

    #[test]
    fn target_dir_holds_the_running_test() {
        // The test binary itself lives under target/<profile>/deps.
        let exe = std::env::current_exe().unwrap().canonicalize().unwrap();
        let target = target_dir().canonicalize().unwrap();
        assert!(exe.starts_with(&target), "{exe:?} not under {target:?}");
        assert_eq!(built("x"), debug_dir().join("x"));
    }
}
