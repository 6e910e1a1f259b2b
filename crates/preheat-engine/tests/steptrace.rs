//! The step tracer on a real process: a signal raised while it is traced reaches the thread's
//! handler, and a thread that parks on a futex after answering ends the trace there (a pool
//! thread handed the request, as a JVM's executor is).

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use preheat_engine::steptrace::StepTracer;
use preheat_testsupport::KillOnDrop;

#[test]
fn signals_pass_and_a_futex_park_ends_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/steptrace/parker.c");
    let Some(bin) = preheat_testsupport::compile_c(&src, dir.path()) else {
        return; // no C compiler: reported as a skip by compile_c
    };
    let mut child = KillOnDrop(
        Command::new(&bin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stdin = child.0.stdin.take().unwrap();
    let mut stdout = child.0.stdout.take().unwrap();
    let mut b = [0u8; 1];
    stdout.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"r");
    // The child is in (or about to enter) its blocking read.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let mut tracer = match StepTracer::attach(child.0.id()) {
        Ok(t) => t,
        Err(e) => {
            preheat_testsupport::skip("ptrace", &format!("cannot trace a child here: {e}"));
            return;
        }
    };
    let answered = Arc::new(AtomicBool::new(false));
    let a2 = answered.clone();
    let client = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(5));
        stdin.write_all(b"x").unwrap();
        let mut r = [0u8; 1];
        stdout.read_exact(&mut r).unwrap();
        a2.store(true, Ordering::SeqCst);
        r[0]
    });
    let trace = tracer
        .trace_until_wait(2_000_000, &|| answered.load(Ordering::SeqCst))
        .expect("the trace ends at the futex park");
    drop(tracer);
    let reply = client.join().unwrap();
    assert_eq!(
        reply, b'Y',
        "the SIGUSR1 raised under the trace reached its handler"
    );
    assert!(trace.reached_wait, "{} instructions", trace.instructions);
    assert!(trace.instructions > 10 && !trace.lines.is_empty());
}
