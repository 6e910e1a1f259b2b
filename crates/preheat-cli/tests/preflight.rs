//! What will not work is said at once (issue 23, point 4): the any-server demo and `preheat comm`
//! on a statically linked program fail within seconds with the reason and what to do, instead of
//! waiting for an agent that cannot come, and leave nothing running.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{assert_no_agent_sockets, preheat, run_dir};
use preheat_testsupport::{free_port, skip, try_compile_c};

/// Listens on 127.0.0.1:argv[1], accepts and closes connections until killed.
const SERVER_C: &str = r#"
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

/// The server above, statically linked; `None` (skipped visibly) where it cannot be built.
fn static_server(dir: &tempfile::TempDir) -> Option<PathBuf> {
    let src = dir.path().join("server.c");
    std::fs::write(&src, SERVER_C).unwrap();
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

#[test]
fn a_static_server_is_refused_at_once_with_what_to_do() {
    let tmp = tempfile::Builder::new()
        .prefix("preheat-preflight-cli-")
        .tempdir()
        .unwrap();
    let Some(server) = static_server(&tmp) else {
        return;
    };
    let rd = run_dir(&tmp);
    let port = free_port().to_string();
    let server = server.to_str().unwrap();
    let demo = [
        "demo",
        "--port",
        &port,
        "--protocol",
        "http",
        "--request",
        "/",
        "--",
        server,
        &port,
    ];
    let comm = ["comm", "--", server];
    for args in [&demo[..], &comm[..]] {
        let t0 = Instant::now();
        let o = preheat(args, &rd);
        let took = t0.elapsed();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} failed");
        assert!(
            err.contains("statically linked") && err.contains("LD_PRELOAD"),
            "{args:?} says why: {err}"
        );
        assert!(err.contains("What to do: link it dynamically"), "{err}");
        assert!(took < Duration::from_secs(5), "{args:?} took {took:?}");
    }
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port.parse::<u16>().unwrap())).is_err(),
        "nothing listens on the port"
    );
    assert_no_agent_sockets(&rd);
}
