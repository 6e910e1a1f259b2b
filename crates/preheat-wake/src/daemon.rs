//! The wake planner daemon: takes anticipatory-wakeup requests over a Unix socket, keeps the
//! per-CPU sleep plan ([`crate::plan`]) and applies it with the mechanisms of [`crate::keep_awake`].
//!
//! Threads:
//!
//! * one **worker per online CPU**, pinned to it, timer slack 1 ns, `SCHED_IDLE` while it
//!   spins (and throughout when it may not switch back, i.e. unprivileged): sleeps
//!   (futex with timeout) until the next merged interval's `start − lead`, then arms the CPU
//!   *from that CPU* (so the CPU re-enters idle through the governor with the constraint in
//!   place) and, for the spin mechanism, spins through the interval. The time from the planned
//!   arm instant to "mechanism in effect" is a lateness sample for that CPU's lead
//!   ([`crate::lead`]).
//! * the **executor** (`SCHED_OTHER`, unpinned): at every window end it charges awake time,
//!   records finished windows and disarms CPUs no longer needed. Windows always end on their
//!   own: nothing but this timer is needed for it.
//! * the **acceptor** and one thread per **connection** (JSON lines, [`crate::proto`]). When a
//!   connection closes, its windows that have not started are cancelled.
//!
//! All state is in one mutex; a per-CPU futex word ("generation") wakes that CPU's worker when
//! its plan changes, and only that worker, so a request for CPU 1 does not wake CPU 0.
//!
//! Machine state: at start the daemon restores what a crashed predecessor left in the journal;
//! [`Daemon::shutdown`] (also run by `Drop`, i.e. on errors and panics that unwind) restores
//! everything it changed. SIGTERM/SIGINT are turned into a shutdown by [`crate::run`].

use crate::keep_awake::{self, Journal, Machine, MechChoice, Mechanism, SysPaths};
use crate::lead::LeadEstimator;
use crate::plan::{Limits, Plan, Window};
use crate::proto::{self, ArmRecord, Command, FinishedWindow, Status};
use anyhow::{bail, Context, Result};
use preheat_engine::os;
use preheat_engine::pidlock::{LockError, PidLock};
use preheat_engine::time::now_ns;
use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// How many finished windows `status` shows.
const HISTORY: usize = 64;

/// Daemon configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub run_dir: PathBuf,
    pub paths: SysPaths,
    pub mech: MechChoice,
    pub limits: Limits,
    /// Concurrent client connections (default 64).
    pub max_connections: usize,
    /// Mode of the socket file (default 0600: only the daemon's user may ask for wakeups).
    pub socket_mode: u32,
}

impl Config {
    pub fn new(run_dir: impl Into<PathBuf>) -> Config {
        Config {
            run_dir: run_dir.into(),
            paths: SysPaths::default(),
            mech: MechChoice::Auto,
            limits: Limits::default(),
            max_connections: 64,
            socket_mode: 0o600,
        }
    }
}

struct Shared {
    inner: Mutex<Inner>,
    /// Wakes the executor when the plan changed.
    exec_cv: Condvar,
    /// Per online CPU: bumped (and futex-woken) when that CPU's plan changes.
    gens: BTreeMap<u32, AtomicU32>,
    stop: AtomicBool,
    started_ns: u64,
    run_dir: PathBuf,
    startup: Vec<String>,
}

struct Inner {
    plan: Plan,
    machine: Machine,
    leads: BTreeMap<u32, LeadEstimator>,
    online: Vec<u32>,
    history: VecDeque<FinishedWindow>,
    conns: BTreeMap<u64, UnixStream>,
    next_conn: u64,
    accepted: u64,
    rejected: u64,
    cancelled: u64,
    completed: u64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self, cpu: u32) {
        if let Some(g) = self.gens.get(&cpu) {
            g.fetch_add(1, Ordering::SeqCst);
            os::futex_wake(g, i32::MAX);
        }
    }

    fn bump_all(&self) {
        for c in self.gens.keys() {
            self.bump(*c);
        }
    }
}

impl Inner {
    fn lead(&self, cpu: u32) -> u64 {
        self.leads
            .get(&cpu)
            .map_or(LeadEstimator::INITIAL_NS, |l| l.lead_ns())
    }

    /// Must `cpu` be armed at `now`: inside a merged interval, or within the lead before one.
    fn desired(&self, cpu: u32, now: u64) -> bool {
        let lead = self.lead(cpu);
        self.plan
            .cpu_plan(cpu)
            .iter()
            .any(|i| i.end_ns > now && i.start_ns <= now.saturating_add(lead))
    }

    fn record(&mut self, w: &Window, outcome: &str, now: u64) {
        let per_cpu = w
            .cpus
            .iter()
            .map(|&c| {
                let rec = self.machine.armed().get(&c).map(|a| ArmRecord {
                    mechanism: a.mechanism,
                    armed_before_start_ns: w.start_ns as i64 - a.since_ns as i64,
                });
                (c, rec)
            })
            .collect();
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(FinishedWindow {
            id: w.id,
            requester: w.requester.clone(),
            cpus: w.cpus.clone(),
            start_ns: w.start_ns,
            end_ns: w.end_ns,
            outcome: outcome.to_string(),
            ended_late_ns: if outcome == "completed" {
                now.saturating_sub(w.end_ns)
            } else {
                0
            },
            per_cpu,
        });
    }

    /// Charge awake time, record ended windows, disarm CPUs no longer needed.
    fn settle(&mut self, now: u64) {
        for w in self.plan.advance(now) {
            self.completed += 1;
            self.record(&w, "completed", now);
        }
        let armed: Vec<u32> = self.machine.armed().keys().copied().collect();
        for c in armed {
            if !self.desired(c, now) {
                self.machine.disarm(c);
            }
        }
    }

    fn status(&mut self, sh: &Shared) -> Status {
        let now = now_ns();
        self.settle(now);
        let cpus = self
            .online
            .iter()
            .map(|&c| {
                let l = self.leads.get(&c).copied().unwrap_or_default();
                proto::CpuStatus {
                    cpu: c,
                    mechanism: self.machine.mechanism(c),
                    armed: self.machine.armed().get(&c).map(|&a| a.into()),
                    lead_ns: l.lead_ns(),
                    lead_samples: l.samples(),
                    mean_lateness_ns: l.mean_lateness_ns(),
                    last_lateness_ns: l.last_lateness_ns(),
                    plan: self.plan.cpu_plan(c),
                }
            })
            .collect();
        let pending = self
            .plan
            .windows()
            .iter()
            .map(|w| proto::WindowStatus {
                id: w.id,
                requester: w.requester.clone(),
                connection: w.owner,
                cpus: w.cpus.clone(),
                start_ns: w.start_ns,
                end_ns: w.end_ns,
                mechanisms: w
                    .cpus
                    .iter()
                    .map(|&c| (c, self.machine.mechanism(c)))
                    .collect(),
            })
            .collect();
        let awake = self
            .plan
            .awake_ns()
            .iter()
            .map(|(r, m)| {
                (
                    r.clone(),
                    proto::RequesterAwake {
                        total_ns: m.values().sum(),
                        per_cpu: m.clone(),
                    },
                )
            })
            .collect();
        Status {
            pid: std::process::id(),
            run_dir: sh.run_dir.display().to_string(),
            now_ns: now,
            started_ns: sh.started_ns,
            cpus,
            notes: self.machine.notes().to_vec(),
            startup: sh.startup.clone(),
            pending,
            recent: self.history.iter().cloned().collect(),
            awake,
            accepted: self.accepted,
            rejected: self.rejected,
            cancelled: self.cancelled,
            completed: self.completed,
            connections: self.conns.len(),
            changed_now: self.machine.changed_now(),
            journal_entries: self.machine.journal().entries.len(),
        }
    }
}

/// A running daemon. [`Daemon::shutdown`] (or dropping it) stops it and restores every setting
/// it changed.
pub struct Daemon {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    conn_threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    socket: PathBuf,
    _run_lock: PidLock,
    down: bool,
}

impl Daemon {
    /// Start serving in `cfg.run_dir`: restore a crashed predecessor's settings from the journal,
    /// pick the mechanisms, bind `wake.sock`, start the threads.
    pub fn start(cfg: Config) -> Result<Daemon> {
        prepare_run_dir(&cfg.run_dir)?;
        let run_lock = lock_run_dir(&cfg.run_dir)?;
        let journal_path = cfg.run_dir.join(Journal::FILE);
        let mut startup = Vec::new();
        match keep_awake::restore_journal(&cfg.paths, &journal_path) {
            Ok(outcomes) => {
                for o in outcomes {
                    startup.push(format!("journal: {o}"));
                }
            }
            Err(e) => startup.push(format!(
                "journal {}: {e} (left in place)",
                journal_path.display()
            )),
        }
        let mut online = cfg.paths.online_cpus();
        if online.is_empty() {
            online = (0..os::online_cpus() as u32).collect();
        }
        let machine = Machine::open(cfg.paths.clone(), journal_path, cfg.mech, &online);

        let socket = cfg.run_dir.join(proto::SOCKET_NAME);
        // We hold the run-dir lock, so an existing socket is stale.
        let _ = std::fs::remove_file(&socket);
        let listener =
            UnixListener::bind(&socket).with_context(|| format!("binding {}", socket.display()))?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(cfg.socket_mode))
            .with_context(|| format!("chmod {}", socket.display()))?;

        let now = now_ns();
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                plan: Plan::new(cfg.limits, now),
                machine,
                leads: online.iter().map(|&c| (c, LeadEstimator::new())).collect(),
                online: online.clone(),
                history: VecDeque::new(),
                conns: BTreeMap::new(),
                next_conn: 1,
                accepted: 0,
                rejected: 0,
                cancelled: 0,
                completed: 0,
            }),
            exec_cv: Condvar::new(),
            gens: online.iter().map(|&c| (c, AtomicU32::new(0))).collect(),
            stop: AtomicBool::new(false),
            started_ns: now,
            run_dir: cfg.run_dir.clone(),
            startup,
        });
        let mut d = Daemon {
            shared: shared.clone(),
            threads: Vec::new(),
            conn_threads: Arc::new(Mutex::new(Vec::new())),
            socket,
            _run_lock: run_lock,
            down: false,
        };
        for &c in &online {
            let sh = shared.clone();
            d.threads.push(
                std::thread::Builder::new()
                    .name(format!("wake-cpu{c}"))
                    .spawn(move || worker(sh, c))?,
            );
        }
        let sh = shared.clone();
        d.threads.push(
            std::thread::Builder::new()
                .name("wake-exec".into())
                .spawn(move || executor(sh))?,
        );
        let sh = shared.clone();
        let ct = d.conn_threads.clone();
        let max = cfg.max_connections;
        d.threads.push(
            std::thread::Builder::new()
                .name("wake-accept".into())
                .spawn(move || acceptor(sh, listener, ct, max))?,
        );
        Ok(d)
    }

    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// A snapshot of the daemon's state.
    pub fn status(&self) -> Status {
        self.shared.lock().status(&self.shared)
    }

    /// Lines describing the start-up (journal restore, mechanisms and why).
    pub fn startup_report(&self) -> Vec<String> {
        let g = self.shared.lock();
        let mut out = self.shared.startup.clone();
        let mechs: Vec<String> = g
            .machine
            .mechanisms()
            .iter()
            .map(|(c, m)| format!("cpu{c} {m}"))
            .collect();
        out.push(format!("mechanisms: {}", mechs.join(", ")));
        out.extend(g.machine.notes().iter().cloned());
        out
    }

    /// Stop all threads and restore every setting this daemon changed. Returns the settings it
    /// restored (for the log).
    pub fn shutdown(mut self) -> Vec<String> {
        self.stop()
    }

    fn stop(&mut self) -> Vec<String> {
        if self.down {
            return Vec::new();
        }
        self.down = true;
        {
            // Under the lock, so the executor cannot miss it between its check and its wait.
            let _g = self.shared.lock();
            self.shared.stop.store(true, Ordering::SeqCst);
        }
        self.shared.exec_cv.notify_all();
        self.shared.bump_all();
        // Unblock the acceptor's accept(). If that fails (someone removed the socket file),
        // the acceptor stays blocked: leave it behind rather than hang the shutdown.
        let woke_acceptor = UnixStream::connect(&self.socket).is_ok();
        // Workers, executor and acceptor first: after that no new connection can appear.
        for t in self.threads.drain(..) {
            if woke_acceptor || t.thread().name() != Some("wake-accept") {
                let _ = t.join();
            }
        }
        for s in self.shared.lock().conns.values() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        let conns: Vec<_> =
            std::mem::take(&mut *self.conn_threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in conns {
            let _ = t.join();
        }
        let mut g = self.shared.lock();
        let armed: Vec<(u32, Mechanism)> = g
            .machine
            .armed()
            .iter()
            .map(|(c, a)| (*c, a.mechanism))
            .collect();
        g.machine.disarm_all();
        drop(g);
        let _ = std::fs::remove_file(&self.socket);
        armed
            .into_iter()
            .filter(|(_, m)| *m != Mechanism::Spin)
            .map(|(c, m)| format!("cpu{c}: {m} constraint removed"))
            .collect()
    }

    /// Whether the daemon's threads are all still running.
    pub fn is_healthy(&self) -> bool {
        !self.down && self.threads.iter().all(|t| !t.is_finished())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Create the run directory (0700) if needed and refuse one another user could write to.
fn prepare_run_dir(dir: &Path) -> Result<()> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating run directory {}", dir.display()))?;
    }
    let md = std::fs::symlink_metadata(dir).with_context(|| format!("{}", dir.display()))?;
    let euid = keep_awake::effective_uid();
    if !md.is_dir() || Some(md.uid()) != euid || md.mode() & 0o022 != 0 {
        bail!(
            "run directory {} must be a directory owned by uid {} and writable only by it \
             (owner {}, mode {:o}); use --run-dir",
            dir.display(),
            euid.map_or("?".into(), |u| u.to_string()),
            md.uid(),
            md.mode() & 0o7777
        );
    }
    Ok(())
}

/// One daemon per run directory: hold `<run dir>/wake.lock` for our lifetime.
fn lock_run_dir(dir: &Path) -> Result<PidLock> {
    let p = dir.join("wake.lock");
    match PidLock::take_keeping_file(&p) {
        Ok(l) => Ok(l),
        Err(LockError::Held(pid)) => bail!(
            "another wake daemon (pid {}) already serves {}",
            pid.map_or("?".into(), |p| p.to_string()),
            dir.display()
        ),
        Err(LockError::Io(e)) => Err(e).with_context(|| format!("{}", p.display())),
    }
}

/// Per-CPU worker: arm at `start − lead`, spin if the mechanism is spin.
fn worker(sh: Arc<Shared>, cpu: u32) {
    let gen = &sh.gens[&cpu];
    let pinned = os::pin_current_thread(cpu as usize);
    let _ = os::set_timer_slack_ns(1);
    // Spinning is always SCHED_IDLE (any real task preempts it at once). The short timed wake
    // that arms the CPU stays SCHED_OTHER when we may switch back and forth (root), so real
    // work on that CPU neither delays the arming nor pollutes the lateness samples; otherwise
    // the worker is SCHED_IDLE throughout.
    let _ = os::set_sched_idle(true);
    let switchable = os::set_sched_idle(false).is_ok();
    if let Err(e) = pinned {
        sh.lock().machine.notes_push(format!(
            "cpu{cpu}: cannot pin its worker ({e}): arming from elsewhere"
        ));
    }
    // The arm instant we slept until, if the last wake was that timer.
    let mut timed: Option<u64> = None;
    loop {
        if sh.stop.load(Ordering::SeqCst) {
            return;
        }
        let g = gen.load(Ordering::SeqCst);
        let mut inner = sh.lock();
        let now = now_ns();
        let lead = inner.lead(cpu);
        let plan: Vec<_> = inner
            .plan
            .cpu_plan(cpu)
            .into_iter()
            .filter(|i| i.end_ns > now)
            .collect();
        // Inside an interval or within the lead before one: arm (idempotent).
        if let Some(iv) = plan
            .iter()
            .find(|i| i.start_ns.saturating_sub(lead) <= now)
            .copied()
        {
            let m = inner.machine.arm(cpu, now);
            if let Some(planned) = timed.take() {
                let effective = now_ns();
                if let Some(l) = inner.leads.get_mut(&cpu) {
                    l.observe(effective.saturating_sub(planned));
                }
            }
            if m == Mechanism::Spin {
                drop(inner);
                if switchable {
                    let _ = os::set_sched_idle(true);
                }
                // A pure spin: a thread woken here preempts us (we are SCHED_IDLE) after the
                // reschedule IPI. Measured here, yielding every turn instead was slower
                // (26–33 vs 21–26 µs p50): unlike a CPU polling in idle, a busy vCPU needs
                // that IPI (a VM exit) either way.
                while now_ns() < iv.end_ns
                    && gen.load(Ordering::Relaxed) == g
                    && !sh.stop.load(Ordering::Relaxed)
                {
                    std::hint::spin_loop();
                }
                if switchable {
                    let _ = os::set_sched_idle(false);
                }
                continue;
            }
        }
        timed = None;
        // Sleep until the next arm instant (the executor ends intervals; this CPU need not
        // wake for that).
        let wake_at = plan
            .iter()
            .map(|i| i.start_ns.saturating_sub(lead))
            .filter(|&a| a > now)
            .min();
        drop(inner);
        match wake_at {
            None => os::futex_wait(gen, g, None),
            Some(at) => {
                os::futex_wait(gen, g, Some(at - now));
                if gen.load(Ordering::SeqCst) == g && now_ns() >= at {
                    timed = Some(at);
                }
            }
        }
    }
}

/// Ends windows on time, whoever asks.
fn executor(sh: Arc<Shared>) {
    let _ = os::set_timer_slack_ns(1);
    let mut g = sh.lock();
    loop {
        if sh.stop.load(Ordering::SeqCst) {
            return;
        }
        let now = now_ns();
        g.settle(now);
        let next = g
            .plan
            .windows()
            .iter()
            .map(|w| w.end_ns)
            .filter(|&e| e > now)
            .min();
        g = match next {
            Some(t) => {
                sh.exec_cv
                    .wait_timeout(g, Duration::from_nanos(t - now))
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            None => sh.exec_cv.wait(g).unwrap_or_else(|e| e.into_inner()),
        };
    }
}

fn acceptor(
    sh: Arc<Shared>,
    listener: UnixListener,
    conn_threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    max_connections: usize,
) {
    loop {
        let accepted = listener.accept();
        if sh.stop.load(Ordering::SeqCst) {
            return;
        }
        match accepted {
            Ok((stream, _)) => {
                let mut g = sh.lock();
                if g.conns.len() >= max_connections {
                    drop(g);
                    let mut s = stream;
                    let _ = writeln!(
                        s,
                        "{}",
                        serde_json::json!({"ok": false, "error": format!("too many connections (limit {max_connections})")})
                    );
                    continue;
                }
                let id = g.next_conn;
                g.next_conn += 1;
                if let Ok(c) = stream.try_clone() {
                    g.conns.insert(id, c);
                }
                drop(g);
                let sh2 = sh.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("wake-conn{id}"))
                    .spawn(move || connection(sh2, stream, id));
                let mut ct = conn_threads.lock().unwrap_or_else(|e| e.into_inner());
                ct.retain(|t| !t.is_finished());
                match spawned {
                    Ok(t) => ct.push(t),
                    Err(_) => {
                        sh.lock().conns.remove(&id);
                    }
                }
            }
            // EMFILE and the like: back off a little.
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn connection(sh: Arc<Shared>, stream: UnixStream, id: u64) {
    let mut out = match stream.try_clone() {
        Ok(s) => s,
        Err(_) => {
            sh.lock().conns.remove(&id);
            return;
        }
    };
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        let n = match reader
            .by_ref()
            .take(proto::MAX_LINE as u64 + 1)
            .read_line(&mut line)
        {
            Ok(n) => n,
            Err(_) => break,
        };
        if n == 0 || sh.stop.load(Ordering::SeqCst) {
            break;
        }
        if line.len() > proto::MAX_LINE {
            let _ = writeln!(
                out,
                "{}",
                serde_json::json!({"ok": false, "error": format!("request line longer than {} bytes", proto::MAX_LINE)})
            );
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        let reply = handle(&sh, id, &line);
        if writeln!(out, "{reply}").is_err() {
            break;
        }
    }
    // The client went away: cancel its windows that have not started.
    let mut g = sh.lock();
    g.conns.remove(&id);
    let now = now_ns();
    let gone = g.plan.cancel_future(id, now);
    let mut cpus = Vec::new();
    for w in &gone {
        g.cancelled += 1;
        g.record(w, "cancelled: client closed", now);
        cpus.extend(w.cpus.iter().copied());
    }
    g.settle(now);
    drop(g);
    cpus.sort_unstable();
    cpus.dedup();
    for c in cpus {
        sh.bump(c);
    }
    sh.exec_cv.notify_all();
}

fn handle(sh: &Shared, conn: u64, line: &str) -> serde_json::Value {
    let cmd = match proto::parse_line(line) {
        Ok(c) => c,
        Err(e) => {
            sh.lock().rejected += 1;
            return serde_json::json!({"ok": false, "error": e.to_string()});
        }
    };
    match cmd {
        Command::Status => {
            let st = sh.lock().status(sh);
            serde_json::json!({"ok": true, "status": st})
        }
        Command::Cancel(wid) => {
            let mut g = sh.lock();
            let now = now_ns();
            match g.plan.cancel(conn, wid, now) {
                Some(w) => {
                    g.cancelled += 1;
                    g.record(&w, "cancelled", now);
                    g.settle(now);
                    drop(g);
                    for c in &w.cpus {
                        sh.bump(*c);
                    }
                    sh.exec_cv.notify_all();
                    serde_json::json!({"ok": true})
                }
                None => serde_json::json!({"ok": false, "error": format!(
                    "no window {wid} of this connection that has not started yet"
                )}),
            }
        }
        Command::Request(mut req) => {
            let mut g = sh.lock();
            let now = now_ns();
            if req.start_ns == crate::plan::START_ON_RECEIPT {
                req.start_ns = now;
            }
            let online = g.online.clone();
            match g.plan.add(&req, now, &online, conn) {
                Ok(w) => {
                    g.accepted += 1;
                    let mechanisms: BTreeMap<u32, Mechanism> = w
                        .cpus
                        .iter()
                        .map(|&c| (c, g.machine.mechanism(c)))
                        .collect();
                    let lead_ns: BTreeMap<u32, u64> =
                        w.cpus.iter().map(|&c| (c, g.lead(c))).collect();
                    drop(g);
                    for c in &w.cpus {
                        sh.bump(*c);
                    }
                    sh.exec_cv.notify_all();
                    serde_json::to_value(proto::AcceptedReply {
                        ok: true,
                        id: w.id,
                        mechanism: proto::summarize(&mechanisms),
                        mechanisms,
                        start_ns: w.start_ns,
                        end_ns: w.end_ns,
                        lead_ns,
                    })
                    .unwrap_or_else(|e| serde_json::json!({"ok": false, "error": e.to_string()}))
                }
                Err(e) => {
                    g.rejected += 1;
                    serde_json::json!({"ok": false, "error": e.to_string()})
                }
            }
        }
    }
}
