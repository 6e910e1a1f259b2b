//! Servers in managed runtimes through the any-server demo (issue 23): a Node.js `http` server
//! (`tests/fixtures/node_http.js`: one libuv event loop, keep-alive). Node is dynamically
//! linked against the C library, so the agent loads through `LD_PRELOAD` and finds its busy
//! periods in `epoll_wait`/`read`/`writev` as for a C event loop. Real node on loopback, the
//! real demo and recorder.

use std::path::Path;

use crate::any_server::{
    agent_pids_of, assert_acted, assert_rows, demo, samples, skip_reason, tmpdir,
};
use crate::common::{assert_no_agent_sockets, find_program, run_dir, serial};

/// The Node.js fixture server.
fn node_fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/node_http.js")
}

/// `preheat demo` on the Node.js server: the recording keeps lines, `lines` and `replay` reach
/// the event loop (the agent acted on their announcements), and `auto` ran its pilot and
/// measured whatever it chose in every round.
#[test]
fn demo_on_a_node_http_server() {
    // One at a time: each measures on the same 2 CPUs (parallel demos make announcements late).
    let _one = serial();
    let Some(node) = find_program("node") else {
        return preheat_testsupport::skip("node", "Node.js (node) is not installed");
    };
    let tmp = tmpdir();
    let rd = run_dir(&tmp);
    let port = preheat_testsupport::free_port();
    let fixture = node_fixture();
    let v = demo(
        &rd,
        port,
        "auto,lines,replay",
        &[
            node.to_str().unwrap(),
            fixture.to_str().unwrap(),
            &port.to_string(),
        ],
    );
    // The agent attached to node itself (not to a wrapper).
    assert!(
        !agent_pids_of(&rd, "node").is_empty(),
        "no agent attached to node"
    );
    assert_eq!(skip_reason(&v, "preheat:replay"), None);
    assert_rows(
        &v,
        &[
            "warm",
            "cold-sweep",
            "preheat:auto",
            "preheat:lines",
            "preheat:replay",
        ],
        3,
    );
    assert_acted(&v, "preheat:lines");
    assert_acted(&v, "preheat:replay");
    // The event loop's busy periods were tracked: every warm request has a server start.
    let warm = samples(&v, "warm");
    assert!(
        warm.iter().all(|s| s["server_start_us"].as_f64().is_some()),
        "node's event loop was not tracked: {warm:?}"
    );
    assert_no_agent_sockets(&rd);
}
