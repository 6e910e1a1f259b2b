//! Benchmark (not a pass/fail timing test): wake latency of a thread blocked on a futex on
//! CPU 1, woken from CPU 0 after a 1 ms gap, with no window and with a window (one daemon per
//! mechanism) covering the wakeup. Rounds are interleaved in shuffled order so drift hits every
//! mechanism alike. Run with
//!
//! ```sh
//! cargo test --release -p preheat-wake --test wake_latency -- --ignored --nocapture
//! ```
//!
//! `PREHEAT_WAKE_BENCH_ROUNDS` (default 300 per mechanism), `PREHEAT_WAKE_BENCH_GAP_US`
//! (default 1000) and `PREHEAT_WAKE_BENCH_BUDGET_S` (default 600: how long to wait for quiet
//! chunks) change the run. Quiet gate: rounds run in chunks of 25, each started when CPU 1 was
//! < 5% busy and kept only if it stayed ≤ 15% busy (the spin row's own spinning included).

use preheat_engine::os;
use preheat_engine::time::now_ns;
use preheat_wake::keep_awake::SysPaths;
use preheat_wake::{Config, Daemon, MechChoice, Mechanism, WakeClient};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn env_u64(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn pct(v: &mut [u64], p: f64) -> f64 {
    v.sort_unstable();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i] as f64 / 1e3
}

/// (busy, total) jiffies of `cpuN` from /proc/stat.
fn cpu_jiffies(cpu: u32) -> (u64, u64) {
    let stat =
        preheat_engine::procstat::read(std::path::Path::new("/proc/stat")).unwrap_or_default();
    stat.cpu(cpu).map_or((0, 0), |t| (t.busy(), t.total()))
}

fn busy_pct(a: (u64, u64), b: (u64, u64)) -> f64 {
    let (db, dt) = (b.0 - a.0, b.1 - a.1);
    if dt == 0 {
        0.0
    } else {
        100.0 * db as f64 / dt as f64
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

struct Row {
    name: String,
    client: Option<WakeClient>,
    _daemon: Option<Daemon>,
    _dir: Option<tempfile::TempDir>,
    samples: Vec<u64>,
    /// Rounds whose request was answered too late to cover the wakeup.
    dropped: usize,
}

#[test]
#[ignore = "benchmark: prints wake latency per mechanism"]
fn wake_latency_per_mechanism() {
    let online = SysPaths::default().online_cpus();
    if !(online.contains(&0) && online.contains(&1)) {
        preheat_testsupport::skip!("cpus", "needs CPUs 0 and 1 online (online: {online:?})");
        return;
    }
    let rounds = env_u64("PREHEAT_WAKE_BENCH_ROUNDS", 300) as usize;
    let gap_ns = env_u64("PREHEAT_WAKE_BENCH_GAP_US", 1000) * 1000;
    // The window: from 200 µs before the wakeup to 200 µs after it.
    let (before_ns, after_ns) = (200_000u64, 200_000u64);

    let mut rows = vec![Row {
        name: "default (no window)".into(),
        client: None,
        _daemon: None,
        _dir: None,
        samples: Vec::new(),
        dropped: 0,
    }];
    for (mech, want) in [
        (MechChoice::PmQos, Mechanism::PmQos),
        (MechChoice::Dma, Mechanism::DmaLatency),
        (MechChoice::Spin, Mechanism::Spin),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config::new(dir.path());
        cfg.mech = mech;
        let d = Daemon::start(cfg).unwrap();
        let st = d.status();
        let got = st.cpus.iter().find(|c| c.cpu == 1).unwrap().mechanism;
        if got != want {
            let component = match want {
                Mechanism::PmQos => "pm-qos",
                Mechanism::DmaLatency => "cpu-dma-latency",
                _ => "wake-mechanism",
            };
            preheat_testsupport::skip!(component, "row {want}: unavailable ({:?})", st.notes);
            continue;
        }
        rows.push(Row {
            name: format!("window via {want}"),
            client: Some(WakeClient::connect(dir.path()).unwrap()),
            _daemon: Some(d),
            _dir: Some(dir),
            samples: Vec::new(),
            dropped: 0,
        });
    }

    // The sleeper: pinned to CPU 1, blocked on `word`; reports when it ran.
    let word = Arc::new(AtomicU32::new(0));
    let woke_at = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let sleeper = {
        let (word, woke_at, done) = (word.clone(), woke_at.clone(), done.clone());
        std::thread::spawn(move || {
            os::pin_current_thread(1).unwrap();
            let mut seen = 0;
            while !done.load(Ordering::SeqCst) {
                let v = word.load(Ordering::SeqCst);
                if v == seen {
                    os::futex_wait(&word, v, Some(100_000_000));
                    continue;
                }
                woke_at.store(now_ns(), Ordering::SeqCst);
                seen = v;
            }
        })
    };
    os::pin_current_thread(0).unwrap();
    println!(
        "wake latency, futex on CPU 1 woken from CPU 0 after a {} µs gap; {rounds} rounds per row, interleaved; load average {}",
        gap_ns / 1000,
        loadavg()
    );
    let mut order: Vec<usize> = (0..rows.len()).collect();
    let mut rng = StdRng::seed_from_u64(now_ns());
    let mut next_rand = move || rng.gen::<u64>();
    let mut v = 0u32;
    // Quiet gate: rounds run in chunks; before each chunk wait for CPU 1 to be quiet, and keep
    // a chunk only if CPU 1 stayed quiet while it ran (other work there would put its
    // scheduling delays into the numbers).
    let chunk = 25usize;
    let budget = Instant::now() + Duration::from_secs(env_u64("PREHEAT_WAKE_BENCH_BUDGET_S", 600));
    let (mut kept, mut discarded, mut busy_sum) = (0usize, 0usize, 0.0f64);
    while kept < rounds && Instant::now() < budget {
        loop {
            let a = cpu_jiffies(1);
            std::thread::sleep(Duration::from_millis(200));
            if busy_pct(a, cpu_jiffies(1)) < 5.0 || Instant::now() >= budget {
                break;
            }
        }
        let mut got: Vec<Vec<u64>> = vec![Vec::new(); rows.len()];
        let mut dropped = vec![0usize; rows.len()];
        let before = cpu_jiffies(1);
        for _ in 0..chunk {
            for i in (1..order.len()).rev() {
                order.swap(i, (next_rand() % (i as u64 + 1)) as usize);
            }
            for &r in &order {
                let row = &mut rows[r];
                // Let the previous window end and the sleeper block again.
                std::thread::sleep(Duration::from_micros(300));
                let t_wake = now_ns() + gap_ns;
                if let Some(c) = row.client.as_mut() {
                    let asked = c.request(&preheat_wake::WakeRequest {
                        requester: "bench".into(),
                        cpus: vec![1],
                        start_ns: t_wake - before_ns,
                        duration_ns: before_ns + after_ns,
                    });
                    // The request itself took longer than the gap: no sample.
                    if asked.is_err() || now_ns() > t_wake - before_ns {
                        dropped[r] += 1;
                        std::thread::sleep(Duration::from_micros(
                            before_ns / 1000 + after_ns / 1000,
                        ));
                        continue;
                    }
                }
                while now_ns() < t_wake {
                    std::hint::spin_loop();
                }
                woke_at.store(0, Ordering::SeqCst);
                v += 1;
                let t0 = now_ns();
                word.store(v, Ordering::SeqCst);
                os::futex_wake(&word, 1);
                let deadline = t0 + 200_000_000;
                let mut t1 = 0;
                while now_ns() < deadline {
                    t1 = woke_at.load(Ordering::SeqCst);
                    if t1 != 0 {
                        break;
                    }
                    std::hint::spin_loop();
                }
                if t1 != 0 {
                    got[r].push(t1.saturating_sub(t0));
                }
                // Wait out the window before the next round's gap starts.
                while now_ns() < t_wake + after_ns {
                    std::hint::spin_loop();
                }
            }
        }
        let busy = busy_pct(before, cpu_jiffies(1));
        if busy <= 15.0 {
            kept += chunk;
            busy_sum += busy;
            for (i, row) in rows.iter_mut().enumerate() {
                row.samples.append(&mut got[i]);
                row.dropped += dropped[i];
            }
        } else {
            discarded += 1;
        }
    }
    let cpu1_busy_kept = if kept > 0 {
        busy_sum / (kept / chunk) as f64
    } else {
        0.0
    };
    done.store(true, Ordering::SeqCst);
    word.fetch_add(1, Ordering::SeqCst);
    os::futex_wake(&word, 1);
    sleeper.join().unwrap();

    println!(
        "| config | n | p50 µs | p90 µs | p99 µs | rounds dropped (request answered too late) |"
    );
    println!("|---|---|---|---|---|---|");
    for row in &mut rows {
        let n = row.samples.len();
        if n == 0 {
            continue;
        }
        let (p50, p90, p99) = (
            pct(&mut row.samples, 0.5),
            pct(&mut row.samples, 0.9),
            pct(&mut row.samples, 0.99),
        );
        println!(
            "| {} | {n} | {p50:.1} | {p90:.1} | {p99:.1} | {} |",
            row.name, row.dropped
        );
    }
    for row in &mut rows {
        if let Some(c) = row.client.as_mut() {
            let st = c.status().unwrap();
            let c1 = st.cpus.iter().find(|c| c.cpu == 1).unwrap();
            let mut early: Vec<i64> = st
                .recent
                .iter()
                .filter_map(|w| w.per_cpu.get(&1).copied().flatten())
                .map(|r| r.armed_before_start_ns)
                .collect();
            early.sort_unstable();
            let late = early.iter().filter(|&&e| e < 0).count();
            println!(
                "{}: learned lead {:.1} µs (mean lateness {:.1} µs, {} samples); last {} windows armed {:.1} µs before start (median), {} late",
                row.name,
                c1.lead_ns as f64 / 1e3,
                c1.mean_lateness_ns as f64 / 1e3,
                c1.lead_samples,
                early.len(),
                early.get(early.len() / 2).copied().unwrap_or(0) as f64 / 1e3,
                late
            );
        }
    }
    println!(
        "quiet gate: kept {} chunks of {chunk} rounds (CPU 1 busy {:.0}% on average while they ran, including the spin row's own spinning), discarded {discarded} chunks where CPU 1 was > 15% busy; load average after: {}",
        kept / chunk,
        cpu1_busy_kept,
        loadavg()
    );
}
