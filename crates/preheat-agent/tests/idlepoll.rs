//! The `wake` strategy by idle polling, end to end: an announcement makes the agent in
//! `preheat-kv` hold the kernel's CPU latency constraint at 0 µs (every CPU polls in idle) for
//! the window, and the agent lifts it again on its own once the window is over. Its own test
//! binary: no other test of this process announces meanwhile.

// The shared test support signals and inspects the processes it starts (kill): libc calls.
#![allow(unsafe_code)]

mod support;

use std::time::{Duration, Instant};

use preheat_model::proto::Strategies;
use support::*;

const WAIT: Duration = Duration::from_secs(10);
const DEVICE: &str = "/dev/cpu_dma_latency";

/// The kernel's aggregate CPU latency constraint, µs (a 4-byte read of the device).
fn constraint_us() -> Option<i32> {
    let mut v = [0u8; 4];
    let mut f = std::fs::File::open(DEVICE).ok()?;
    std::io::Read::read_exact(&mut f, &mut v).ok()?;
    Some(i32::from_ne_bytes(v))
}

#[test]
fn a_wake_window_holds_the_cpus_polling_and_ends_on_its_own() {
    if std::fs::OpenOptions::new()
        .write(true)
        .open(DEVICE)
        .is_err()
    {
        preheat_testsupport::skip(
            "agent idle polling",
            "/dev/cpu_dma_latency is not writable here (not root, or no PM QoS)",
        );
        return;
    }
    if constraint_us() == Some(0) {
        preheat_testsupport::skip(
            "agent idle polling",
            "another process holds the CPU latency constraint at 0 µs already",
        );
        return;
    }
    let srv = start_kv(&[]);
    let mut mc = Mc::connect(srv.port);
    assert_eq!(mc.get("key:1").unwrap(), Some(kv_value(1)));
    let mut agent = srv.agent();
    assert!(agent.wait_status(WAIT, |s| s.busy_periods(srv.port) > 0).0);
    // Arrival 400 ms ahead: the window lasts until then + 200 µs.
    let lead = Duration::from_millis(400);
    let t0 = Instant::now();
    srv.announce(srv.pid(), Strategies::WAKE, lead.as_nanos() as u64, 1);
    let (ok, st) = agent.wait_status(WAIT, |s| s.preheat.wake_polled == 1);
    assert!(ok, "the agent did not poll: {:?}", st.preheat);
    assert!(t0.elapsed() < lead, "too slow to check inside the window");
    assert_eq!(
        constraint_us(),
        Some(0),
        "inside the window the CPUs must poll"
    );
    // No request arrives, so nothing extends the window: it must end by itself.
    std::thread::sleep(lead.saturating_sub(t0.elapsed()));
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut lifted = false;
    while Instant::now() < deadline {
        if constraint_us().is_some_and(|v| v != 0) {
            lifted = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        lifted,
        "the constraint was still 0 µs 2 s after the window's end"
    );
    // The server kept serving.
    assert_eq!(mc.get("key:2").unwrap(), Some(kv_value(2)));
}
