//! The open-loop memcached client: `get key:N` requests at the intended times of one Poisson
//! arrival process ([`preheat_lab::load::Poisson`], the project's one), spread round-robin over
//! the connections and pipelined on each; a reader thread per connection frames the responses and
//! records the latency from each request's intended send time.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use preheat_lab::load::Poisson;
use preheat_power::residency::ResidencyDiff;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::window::{quiet_gate, WindowStart};
use crate::cpu_use::CpuUse;
use crate::framing::memcached_response_len;

struct Pending {
    intended: Instant,
    key: u32,
    record: bool,
}

#[derive(Default)]
struct Outstanding {
    n: u64,
}

struct ConnTrack {
    queue: Mutex<VecDeque<Pending>>,
}

/// What came back for the recorded requests: latencies and response counts (of one
/// connection's reader, or of a whole run).
pub(super) struct Answers {
    pub(super) hist: Histogram<u64>,
    pub(super) completed: u64,
    pub(super) hits: u64,
    pub(super) misses: u64,
    /// Error replies, and responses that could not be framed or matched to a request.
    pub(super) errors: u64,
    pub(super) mismatched: u64,
    /// Completed later than the bound after their intended send time.
    pub(super) late: u64,
}

impl Answers {
    pub(super) fn new() -> Answers {
        Answers {
            hist: new_hist(),
            completed: 0,
            hits: 0,
            misses: 0,
            errors: 0,
            mismatched: 0,
            late: 0,
        }
    }

    fn add(&mut self, o: &Answers) {
        self.hist.add(&o.hist).ok();
        self.completed += o.completed;
        self.hits += o.hits;
        self.misses += o.misses;
        self.errors += o.errors;
        self.mismatched += o.mismatched;
        self.late += o.late;
    }
}

pub(super) struct LoadRun {
    pub(super) sent: u64,
    pub(super) answers: Answers,
    pub(super) unanswered: u64,
    pub(super) send_errors: u64,
    pub(super) send_lag_sum_us: u64,
    pub(super) send_lag_max_us: u64,
    pub(super) send_window: Duration,
    pub(super) residency: Result<ResidencyDiff, String>,
    /// Whether the quiet gate was met before the window (true when there is no gate).
    pub(super) gate_met: bool,
    pub(super) cpu_use: Option<CpuUse>,
    /// Voluntary context switches of the backend we started (its wakeups) over the window.
    pub(super) backend_wakeups: Option<u64>,
}

pub(super) fn new_hist() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// (hit, miss, error) for one `get` response.
fn classify(resp: &[u8]) -> (bool, bool, bool) {
    if resp.starts_with(b"VALUE ") {
        (true, false, false)
    } else if resp == b"END\r\n" || resp == b"END\n" {
        (false, true, false)
    } else {
        (false, false, true)
    }
}

fn key_of(resp: &[u8]) -> Option<u32> {
    let line = resp.split(|&b| b == b' ').nth(1)?;
    std::str::from_utf8(line.strip_prefix(b"key:")?)
        .ok()?
        .parse()
        .ok()
}

fn reader(
    mut stream: TcpStream,
    track: Arc<ConnTrack>,
    outstanding: Arc<(Mutex<Outstanding>, Condvar)>,
    bound: Duration,
) -> Answers {
    let mut r = Answers::new();
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    'outer: loop {
        let n = match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let now = Instant::now();
        buf.extend_from_slice(&chunk[..n]);
        let mut off = 0;
        let mut done = 0u64;
        loop {
            match memcached_response_len(&buf[off..]) {
                Ok(Some(len)) => {
                    let resp = &buf[off..off + len];
                    off += len;
                    let Some(p) = track
                        .queue
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .pop_front()
                    else {
                        r.errors += 1;
                        continue;
                    };
                    done += 1;
                    if !p.record {
                        continue;
                    }
                    let lat = now.saturating_duration_since(p.intended);
                    let us = (lat.as_micros() as u64).max(1);
                    let _ = r.hist.record(us.min(60_000_000));
                    r.completed += 1;
                    if lat > bound {
                        r.late += 1;
                    }
                    let (hit, miss, err) = classify(resp);
                    if hit {
                        r.hits += 1;
                        if key_of(resp) != Some(p.key) {
                            r.mismatched += 1;
                        }
                    }
                    r.misses += miss as u64;
                    r.errors += err as u64;
                }
                Ok(None) => break,
                Err(_) => {
                    r.errors += 1;
                    break 'outer;
                }
            }
        }
        buf.drain(..off);
        if done > 0 {
            let (m, cv) = &*outstanding;
            let mut o = m.lock().unwrap_or_else(|e| e.into_inner());
            o.n = o.n.saturating_sub(done);
            if o.n == 0 {
                cv.notify_all();
            }
        }
    }
    r
}

pub(super) struct LoadOpts<'a> {
    pub(super) rate: f64,
    pub(super) duration: Duration,
    pub(super) connections: usize,
    pub(super) keys: u32,
    pub(super) bound: Duration,
    pub(super) settle: Duration,
    pub(super) seed: u64,
    pub(super) machine: &'a preheat_power::residency::MachineRoot,
    /// Our other processes (the backend we started), for [`CpuUse`].
    pub(super) own_pids: &'a [u32],
    /// Wait (≤ 60 s) until every CPU was deep idle at least this share over 0.5 s (0: off).
    pub(super) quiet_gate: f64,
}

/// Waits until no request is outstanding, or the deadline; false on timeout.
fn wait_drained(outstanding: &(Mutex<Outstanding>, Condvar), deadline: Instant) -> bool {
    let (m, cv) = outstanding;
    let mut o = m.lock().unwrap_or_else(|e| e.into_inner());
    while o.n > 0 {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        o = cv
            .wait_timeout(o, deadline - now)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    true
}

pub(super) fn run_load(target: SocketAddr, o: &LoadOpts<'_>, stop: &AtomicBool) -> Result<LoadRun> {
    let outstanding = Arc::new((Mutex::new(Outstanding::default()), Condvar::new()));
    let (conns, readers) = open_conns(target, o, &outstanding)?;
    let send = |i: usize, p: Pending| -> std::io::Result<()> {
        let (s, track) = &conns[i % conns.len()];
        let req = format!("get key:{}\r\n", p.key);
        outstanding.0.lock().unwrap_or_else(|e| e.into_inner()).n += 1;
        track
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(p);
        (&*s).write_all(req.as_bytes())
    };
    // Warm-up: one request per connection (opens the proxy's backend connections, trains its
    // response-time estimate), not recorded.
    for i in 0..conns.len() {
        let p = Pending {
            intended: Instant::now(),
            key: i as u32 % o.keys.max(1),
            record: false,
        };
        send(i, p).context("warm-up request")?;
    }
    if !wait_drained(
        &outstanding,
        Instant::now() + o.bound * 2 + Duration::from_secs(5),
    ) {
        bail!("no answer to warm-up requests from {target}");
    }
    std::thread::sleep(o.settle);
    let gate_met = quiet_gate(o, stop);

    let mut arrivals = Poisson::new(o.rate, o.seed);
    let mut keys = StdRng::seed_from_u64(o.seed);
    let window = WindowStart::read(o);
    let start = Instant::now();
    let end = start + o.duration;
    let mut t = start;
    let (mut sent, mut send_errors, mut lag_sum, mut lag_max) = (0u64, 0u64, 0u64, 0u64);
    loop {
        t += Duration::from_nanos(arrivals.next_gap_ns());
        if t >= end || stop.load(Ordering::SeqCst) {
            break;
        }
        let now = Instant::now();
        if t > now {
            std::thread::sleep(t - now);
        }
        let lag = Instant::now().saturating_duration_since(t).as_micros() as u64;
        lag_sum += lag;
        lag_max = lag_max.max(lag);
        let key = keys.gen_range(0..o.keys.max(1));
        let p = Pending {
            intended: t,
            key,
            record: true,
        };
        match send(sent as usize, p) {
            Ok(()) => sent += 1,
            Err(_) => {
                send_errors += 1;
                break;
            }
        }
    }
    let send_window = Instant::now().saturating_duration_since(start);
    wait_drained(
        &outstanding,
        Instant::now() + o.bound * 2 + Duration::from_secs(2),
    );
    let window = window.finish(o, send_window, gate_met);
    let unanswered = close_conns(&conns);
    let mut run = LoadRun {
        sent,
        unanswered,
        send_errors,
        send_lag_sum_us: lag_sum,
        send_lag_max_us: lag_max,
        ..window
    };
    for h in readers {
        let r = h
            .join()
            .map_err(|_| anyhow::anyhow!("a bench reader thread panicked"))?;
        run.answers.add(&r);
    }
    Ok(run)
}

/// A connection of the load: its stream and the requests it has outstanding.
type LoadConn = (TcpStream, Arc<ConnTrack>);

/// Open `o.connections` connections to `target`, each with a reader thread that takes its
/// answers (counted down in `outstanding`).
fn open_conns(
    target: SocketAddr,
    o: &LoadOpts<'_>,
    outstanding: &Arc<(Mutex<Outstanding>, Condvar)>,
) -> Result<(Vec<LoadConn>, Vec<std::thread::JoinHandle<Answers>>)> {
    let mut conns = Vec::new();
    let mut readers = Vec::new();
    for _ in 0..o.connections.max(1) {
        let s = TcpStream::connect_timeout(&target, Duration::from_secs(2))
            .with_context(|| format!("connecting to {target}"))?;
        s.set_nodelay(true)?;
        let track = Arc::new(ConnTrack {
            queue: Mutex::new(VecDeque::new()),
        });
        let (rs, t, out, bound) = (s.try_clone()?, track.clone(), outstanding.clone(), o.bound);
        readers.push(
            std::thread::Builder::new()
                .name("bench-reader".into())
                .spawn(move || reader(rs, t, out, bound))?,
        );
        conns.push((s, track));
    }
    Ok((conns, readers))
}

/// Shut every connection down; returns the recorded requests still unanswered.
fn close_conns(conns: &[LoadConn]) -> u64 {
    let mut unanswered = 0;
    for (s, track) in conns {
        unanswered += track
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|p| p.record)
            .count() as u64;
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    unanswered
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_classification() {
        assert_eq!(key_of(b"VALUE key:42 0 3\r\nabc\r\nEND\r\n"), Some(42));
        assert_eq!(classify(b"END\r\n"), (false, true, false));
        assert_eq!(classify(b"SERVER_ERROR x\r\n"), (false, false, true));
    }
}
