//! A run: check the configuration, start one client thread per connection or the event-loop
//! threads (and the records writer), report progress, and merge what the threads measured into
//! the summary.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use hdrhistogram::Histogram;
use preheat_engine::time::now_ns;

use super::event_loop::mux_thread;
use super::records::write_records;
use super::shared::{histogram, ConnOut, Shared};
use super::thread_per_connection::connection;
use super::{Announce, ClientLoop, LoadConfig, LoadSummary, Mode, Record, RecordSink};
use crate::driver::{Driver, Wait};

/// How often `progress` is called.
const PROGRESS_EVERY: Duration = Duration::from_millis(50);

fn validate(cfg: &LoadConfig) -> Result<()> {
    if cfg.requests.is_none() && cfg.duration.is_none() {
        bail!("a load needs a number of requests or a duration (or both)");
    }
    if cfg.connections == 0 {
        bail!("a load needs at least one connection");
    }
    if cfg.mode == Mode::Open && !(cfg.rate.is_finite() && cfg.rate > 0.0) {
        bail!("open loop needs a positive request rate (got {})", cfg.rate);
    }
    if cfg.threads > cfg.connections {
        bail!(
            "more client threads ({}) than connections ({}): a thread drives at least one connection",
            cfg.threads,
            cfg.connections
        );
    }
    if cfg.wait == Wait::Epoll && cfg.mode == Mode::IdleGap {
        bail!(
            "idle-gap mode is not supported with wait epoll (the event loop); use wait block or spin (one thread per connection, each sleeps its own gap)"
        );
    }
    if multiplexed(cfg) && cfg.mode == Mode::IdleGap {
        bail!(
            "idle-gap mode needs one thread per connection (threads 0 or {}, got {}): each connection sleeps its own gap",
            cfg.connections,
            cfg.threads
        );
    }
    Ok(())
}

/// Client threads of a run.
fn thread_count(cfg: &LoadConfig) -> usize {
    if cfg.threads == 0 {
        cfg.connections
    } else {
        cfg.threads
    }
}

/// The event loop runs: threads drive several connections each, or [`Wait::Epoll`] asks for it.
fn multiplexed(cfg: &LoadConfig) -> bool {
    thread_count(cfg) < cfg.connections || cfg.wait == Wait::Epoll
}

/// Run a load. `connect` opens one driver per connection (and again after a transport error);
/// `announce` (optional) makes one announcer per connection; `stop` ends the run early (the
/// summary covers what was measured); `progress` is called with the number of completed
/// requests now and then.
pub fn run(
    cfg: &LoadConfig,
    connect: &(dyn Fn() -> Result<Box<dyn Driver>> + Sync),
    announce: Option<&(dyn Fn(usize) -> Result<Box<dyn Announce>> + Sync)>,
    sink: Option<Box<dyn RecordSink>>,
    stop: &AtomicBool,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<LoadSummary> {
    validate(cfg)?;
    if cfg.wait == Wait::Epoll && announce.is_some() {
        bail!(
            "announcements are not supported with wait epoll (the event loop); use wait block or spin (one thread per connection, each request is granted its own send time)"
        );
    }
    if multiplexed(cfg) && announce.is_some() {
        bail!(
            "announcements need one thread per connection (threads 0 or {}, got {}): each request is granted its own send time",
            cfg.connections,
            cfg.threads
        );
    }
    let threads = thread_count(cfg);
    let shared = Shared {
        cfg,
        stop,
        abort: AtomicBool::new(false),
        claimed: AtomicU64::new(0),
        completed: AtomicU64::new(0),
        start: OnceLock::new(),
        setup: Barrier::new(threads),
    };
    let (tx, rx) = mpsc::channel::<Record>();
    let (outs, written) = std::thread::scope(|s| {
        let writer = sink.map(|sink| s.spawn(move || write_records(sink, rx)));
        let workers: Vec<_> = (0..threads)
            .map(|i| {
                let tx = writer.as_ref().map(|_| tx.clone());
                let shared = &shared;
                if multiplexed(cfg) {
                    s.spawn(move || mux_thread(i, threads, shared, connect, tx))
                } else {
                    s.spawn(move || connection(i, shared, connect, announce, tx))
                }
            })
            .collect();
        drop(tx);
        let mut last = Instant::now();
        while !workers.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(5));
            if last.elapsed() >= PROGRESS_EVERY {
                last = Instant::now();
                progress(shared.completed.load(Ordering::Relaxed));
            }
        }
        let outs: Vec<Result<ConnOut>> = workers
            .into_iter()
            .enumerate()
            .map(|(i, h)| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("client thread {i} panicked")))
            })
            .collect();
        let written = writer.map(|w| {
            w.join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the records writer panicked")))
        });
        (outs, written)
    });
    progress(shared.completed.load(Ordering::Relaxed));
    let end_fallback = now_ns();
    let mut merged = Vec::with_capacity(outs.len());
    for o in outs {
        merged.push(o?);
    }
    if let Some(w) = written {
        w?;
    }
    Ok(summarize(
        cfg,
        &merged,
        shared.start.get().copied(),
        end_fallback,
    ))
}

fn summarize(cfg: &LoadConfig, outs: &[ConnOut], start: Option<u64>, now: u64) -> LoadSummary {
    let mut latency = histogram();
    let mut late = histogram();
    let (mut errors, mut wrong, mut scheduled, mut unscheduled, mut last_done) = (0, 0, 0, 0, 0);
    let mut reconnects = 0;
    for o in outs {
        latency.add(&o.latency).expect("same bounds");
        late.add(&o.late).expect("same bounds");
        errors += o.errors;
        reconnects += o.reconnects;
        wrong += o.wrong;
        scheduled += o.scheduled;
        unscheduled += o.unscheduled;
        last_done = last_done.max(o.last_done_ns);
    }
    // What the client threads report; every thread of a run runs the same loop.
    let client_loop = if outs.iter().any(|o| o.event_loop) {
        ClientLoop::EventLoop
    } else {
        ClientLoop::ThreadPerConnection
    };
    let requests = latency.len();
    let start = start.unwrap_or(now);
    let end = if requests > 0 { last_done } else { now };
    let duration_s = end.saturating_sub(start) as f64 / 1e9;
    let us = |h: &Histogram<u64>, q: f64| {
        if h.is_empty() {
            0.0
        } else {
            h.value_at_quantile(q) as f64 / 1e3
        }
    };
    LoadSummary {
        label: "measured",
        mode: cfg.mode,
        connections: cfg.connections,
        threads: thread_count(cfg),
        client_loop,
        requests,
        errors,
        reconnects,
        wrong,
        scheduled,
        unscheduled,
        duration_s,
        throughput_rps: if duration_s > 0.0 {
            requests as f64 / duration_s
        } else {
            0.0
        },
        offered_rps: if cfg.mode == Mode::Open {
            cfg.rate
        } else {
            0.0
        },
        p50_us: us(&latency, 0.5),
        p90_us: us(&latency, 0.9),
        p99_us: us(&latency, 0.99),
        p999_us: us(&latency, 0.999),
        max_us: if requests > 0 {
            latency.max() as f64 / 1e3
        } else {
            0.0
        },
        mean_us: if requests > 0 {
            latency.mean() / 1e3
        } else {
            0.0
        },
        send_late_us_p50: us(&late, 0.5),
        send_late_us_p99: us(&late, 0.99),
    }
}
