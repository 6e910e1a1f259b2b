//! The observer where the kernel refuses its eBPF programs: `PREHEAT_OBSERVE_NO_BPF` makes
//! it behave so (a test binary of its own: the variable is process-wide), and it must fall
//! back to perf samples, say why, and still find every request.

mod support;
use support::{event_loop_server, permitted, request, N};

use std::net::TcpStream;
use std::time::Duration;

use preheat_observe::{Mechanism, Observer, Options};

#[test]
fn falls_back_to_perf_samples_and_says_why() {
    if !permitted() {
        return;
    }
    std::env::set_var("PREHEAT_OBSERVE_NO_BPF", "1");
    let (s, port) = event_loop_server();
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    request(&mut c);
    let obs = Observer::attach(Options::new(s.0.id(), port)).expect("attaching");
    assert_eq!(obs.mechanism(), Mechanism::SystemWide);
    for _ in 0..N {
        request(&mut c);
    }
    std::thread::sleep(Duration::from_millis(100));
    let r = obs.finish();
    let why = r.fallback.clone().unwrap_or_default();
    assert!(why.contains("PREHEAT_OBSERVE_NO_BPF"), "{why:?}");
    let text = preheat_observe::render::text(&r, false);
    assert!(text.contains("the eBPF observer did not load"), "{text}");
    let reads: usize = r.threads.iter().map(|t| t.requests).sum();
    assert_eq!(reads, N, "{:#?}", r.threads);
}
