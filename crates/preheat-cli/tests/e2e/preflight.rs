//! What will not work is said at once (issue 23, point 4): the any-server demo and `preheat run`
//! with the agent inside (`--agent inside`),
//! `preheat record` and `preheat comm` on a statically linked program — C, or a `CGO_ENABLED=0`
//! Go server — fail within seconds with the reason and what to do, instead of waiting for an
//! agent that cannot come, and leave nothing running.

use crate::common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{assert_no_agent_sockets, preheat, run_dir};
use preheat_testsupport::{free_port, go_static_http_server, skip, try_compile_c};

/// [`preheat_testsupport::ACCEPT_CLOSE_SERVER_C`], statically linked; `None` (skipped visibly) where it cannot be built.
fn static_server(dir: &tempfile::TempDir) -> Option<PathBuf> {
    let src = dir.path().join("server.c");
    std::fs::write(&src, preheat_testsupport::ACCEPT_CLOSE_SERVER_C).unwrap();
    match try_compile_c(&src, &dir.path().join("server-static"), &["-static"])? {
        Ok(p) => Some(p),
        Err(e) => {
            skip(
                "libc6-dev",
                &format!("cannot link a static program here: {e}"),
            );
            None
        }
    }
}

/// "At once": against the 20 s wait for an agent it replaces. A refusal takes milliseconds;
/// the bound leaves room for a loaded 2-CPU machine running other tests.
const AT_ONCE: Duration = Duration::from_secs(3);

/// Every command that starts `server PORT` with the agent — `demo`, `run`, `record` and `comm` —
/// fails within [`AT_ONCE`], naming the program and saying why (`reason`) and what to do
/// (`fix`, or `comm_fix` for `comm`, which needs the agent loaded but not its hooks); nothing
/// is left listening or in the run directory.
fn refused_at_once(server: &std::path::Path, reason: &str, fix: &str, comm_fix: &str) {
    let tmp = tempfile::Builder::new()
        .prefix("preheat-preflight-cli-")
        .tempdir()
        .unwrap();
    let rd = run_dir(&tmp);
    let port = free_port().to_string();
    let out = tmp.path().join("ws.phws");
    let (server, out) = (server.to_str().unwrap(), out.to_str().unwrap());
    let http = ["--port", &port, "--protocol", "http", "--request", "/"];
    // `--agent inside`: by default the demo preheats such a server from outside instead
    // (`runtimes::demo_on_a_static_go_server_from_outside`).
    let demo = [
        &["demo", "--agent", "inside"],
        &http[..],
        &["--", server, &port],
    ]
    .concat();
    // `--agent inside`: by default `run` preheats such a server from outside instead
    // (`runtimes::run_preheats_a_static_go_server_from_outside`).
    let run = [
        "run", "--agent", "inside", "--port", &port, "--", server, &port,
    ];
    let record = [
        "record",
        "--out",
        out,
        "--port",
        &port,
        "--request",
        "GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n",
        "--",
        server,
        &port,
    ];
    let comm = ["comm", "--", server];
    for args in [&demo[..], &run[..], &record[..], &comm[..]] {
        let t0 = Instant::now();
        let o = preheat(args, &rd);
        let took = t0.elapsed();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} failed");
        assert!(
            err.contains(&format!(
                "the agent cannot be loaded into {server}: {server} is"
            )),
            "{args:?} names the program: {err}"
        );
        assert!(
            err.contains(reason) && err.contains("only the dynamic linker reads LD_PRELOAD"),
            "{args:?} says why: {err}"
        );
        let fix = if args[0] == "comm" { comm_fix } else { fix };
        assert!(
            err.contains(&format!("What to do: {fix}")),
            "{args:?} says what to do: {err}"
        );
        assert!(took < AT_ONCE, "{args:?} took {took:?}");
    }
    assert!(
        !preheat_engine::host::accepts_connections(
            ([127, 0, 0, 1], port.parse::<u16>().unwrap()).into(),
            std::time::Duration::from_secs(1)
        ),
        "nothing listens on the port"
    );
    assert!(!std::path::Path::new(out).exists(), "no profile written");
    assert_no_agent_sockets(&rd);
}

#[test]
fn a_static_server_is_refused_at_once_with_what_to_do() {
    let tmp = tempfile::Builder::new()
        .prefix("preheat-preflight-cli-")
        .tempdir()
        .unwrap();
    let Some(server) = static_server(&tmp) else {
        return;
    };
    let c_fix = "link it dynamically";
    refused_at_once(&server, "is statically linked", c_fix, c_fix);
}

/// Issue 23's case: a `CGO_ENABLED=0` Go `net/http` server, which waited 20 s for an agent.
#[test]
fn a_static_go_server_is_refused_at_once_as_go() {
    let tmp = tempfile::Builder::new()
        .prefix("preheat-preflight-go-")
        .tempdir()
        .unwrap();
    let Some(server) = go_static_http_server(tmp.path()) else {
        return;
    };
    refused_at_once(
        &server,
        "is a statically linked Go program (go1.",
        "see a Go server's requests from outside, without the agent: preheat observe --pid",
        "none with the agent yet",
    );
}
