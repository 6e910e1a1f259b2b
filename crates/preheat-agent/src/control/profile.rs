//! The control thread's configuration side: the loaded profile, the per-port configuration
//! (replay connections, split preheaters), and the [`Plan`] built from both and published to
//! the workers ([`crate::plan`]); broken replay connections are reconnected here.

use std::collections::BTreeMap;
use std::os::fd::{IntoRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use preheat_engine::preheat::{split_runs, ParallelPreheater};
use preheat_engine::{maps, os};
use preheat_model::proto::{LoadedClass, ReplayVia, Reply};
use preheat_model::resolve::check_binary;
use preheat_model::{decode_profile, resolve_class, AbsRun, RegionTable};

use super::Control;
use crate::log::log;
use crate::plan::{self, Plan, PortPlan, ReplayConn, Split, MAX_SPLIT};
use crate::{config, fdreg};

pub(super) struct LoadedProfile {
    pub(super) path: String,
    pub(super) classes: Vec<LoadedClass>,
    pub(super) runs: BTreeMap<u16, Vec<AbsRun>>,
}

#[derive(Default)]
pub(super) struct PortConfig {
    replay: Option<Arc<ReplayConn>>,
    /// Where `replay`'s connection comes from (`None`: this process's loopback).
    replay_via: Option<ReplayVia>,
    split_cpus: Vec<u32>,
    par: Option<Arc<ParallelPreheater>>,
    /// `replay` is a session the caller handed over (`ConfigureSession`): never reopened here.
    session: bool,
}

/// How often the control thread looks at a fresh-connection port's warm-ups while none is open
/// (a worker may have opened one since).
const FRESH_IDLE_REAP_MS: i32 = 200;

impl Control {
    /// The control thread's poll timeout while fresh-connection ports exist: short while
    /// warm-up connections are open, so a sibling worker is not kept waiting on one.
    pub(super) fn fresh_reap_timeout_ms(&self) -> Option<i32> {
        let fresh = self
            .ports
            .values()
            .filter_map(|pc| pc.replay.as_ref()?.fresh.as_ref());
        let mut any = false;
        for f in fresh {
            if f.open() > 0 {
                return Some(crate::fresh::REAP_EVERY_MS);
            }
            any = true;
        }
        any.then_some(FRESH_IDLE_REAP_MS)
    }

    /// Periodic work: drop retired plans nobody uses, reconnect broken replay connections.
    pub(super) fn maintain(&mut self) {
        self.retired.retain(|p| Arc::strong_count(p) > 1);
        if let Some(cfg) = config::config().filter(|c| c.wake_planner) {
            crate::wakeplan::maintain(&cfg.run_dir);
        }
        let due = match self.next_reconnect {
            Some(t) => Instant::now() >= t,
            None => true,
        };
        let mut failed = false;
        for (port, pc) in &self.ports {
            let Some(conn) = &pc.replay else { continue };
            if let Some(f) = &conn.fresh {
                reap_fresh(conn, f);
                continue;
            }
            if !conn.broken.load(Ordering::Acquire) || pc.session {
                continue;
            }
            if !due {
                failed = true;
                continue;
            }
            match connect_replay(*port, pc.replay_via.as_ref(), &conn.request, &conn.until) {
                Ok(ReplayTarget::Fresh(why)) => {
                    failed = true;
                    log(&format!(
                        "replay connection of port {port}: reconnect failed: {why} (a \
                         persistent connection of this process's own is what was configured)"
                    ));
                }
                Ok(ReplayTarget::Persistent(fd)) => {
                    if !conn.replace_fd(fd) {
                        log(&format!(
                            "replay connection of port {port}: a worker held the old one for > 100 ms; leaking its fd"
                        ));
                    }
                    conn.broken.store(false, Ordering::Release);
                    log(&format!("replay connection of port {port}: reconnected"));
                }
                Err(e) => {
                    failed = true;
                    log(&format!(
                        "replay connection of port {port}: reconnect failed: {e}"
                    ));
                }
            }
        }
        self.next_reconnect = failed.then(|| Instant::now() + Duration::from_secs(1));
    }

    pub(super) fn load_profile(&mut self, path: &str) -> Result<Reply, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("cannot read profile {path}: {e}"))?;
        let prof = decode_profile(&bytes).map_err(|e| format!("profile {path}: {e}"))?;
        let exe = maps::exe_ident(None)
            .map_err(|e| format!("cannot identify the running executable: {e}"))?;
        check_binary(&prof, &exe).map_err(|e| format!("profile {path} refused: {e}"))?;
        let table = RegionTable::build(
            maps::read_maps(None).map_err(|e| format!("cannot read /proc/self/maps: {e}"))?,
        );
        let mut classes = Vec::new();
        let mut runs = BTreeMap::new();
        let mut skipped = Vec::new();
        for class in &prof.classes {
            if runs.contains_key(&class.port) {
                skipped.push(format!(
                    "port {}: duplicate class ignored ({} lines)",
                    class.port,
                    class.ws.line_count()
                ));
                continue;
            }
            let r = resolve_class(&prof, class.port, &exe, &table)
                .map_err(|e| format!("profile {path} refused: {e}"))?;
            for s in &r.skipped_regions {
                skipped.push(format!(
                    "port {}: {}: {} ({} lines)",
                    r.port, s.region, s.reason, s.lines
                ));
            }
            classes.push(LoadedClass {
                port: r.port,
                lines: r.lines,
                runs: r.runs.len() as u64,
                skipped_lines: r.skipped_lines,
            });
            runs.insert(r.port, r.runs);
        }
        log(&format!(
            "profile {path} loaded: {} classes, {} lines, {} skipped lines",
            classes.len(),
            classes.iter().map(|c| c.lines).sum::<u64>(),
            classes.iter().map(|c| c.skipped_lines).sum::<u64>()
        ));
        self.profile = Some(LoadedProfile {
            path: path.to_string(),
            classes: classes.clone(),
            runs,
        });
        self.republish();
        Ok(Reply::Loaded {
            path: path.to_string(),
            classes,
            skipped_regions: skipped,
        })
    }

    /// `Request::UnloadProfile`: drop the loaded profile (if any) and publish the plan without it.
    pub(super) fn unload_profile(&mut self) -> Reply {
        if let Some(p) = self.profile.take() {
            log(&format!("profile {} unloaded", p.path));
        }
        self.republish();
        Reply::Ok
    }

    /// `replay`: the warm-up request, its reply's end, and where its connection comes from.
    pub(super) fn configure(
        &mut self,
        port: u16,
        (replay, replay_until, via): (Option<String>, Option<String>, Option<ReplayVia>),
        split_cpus: Vec<u32>,
    ) -> Result<Reply, String> {
        if port == 0 {
            return Err("configure: port 0 is not a port".into());
        }
        let online = os::online_cpus();
        if split_cpus.len() > MAX_SPLIT {
            return Err(format!(
                "configure: at most {MAX_SPLIT} split CPUs (got {})",
                split_cpus.len()
            ));
        }
        if let Some(bad) = split_cpus.iter().find(|&&c| c as usize >= online) {
            return Err(format!(
                "configure: split CPU {bad} does not exist ({online} CPUs online)"
            ));
        }
        let pc = self.ports.entry(port).or_default();
        pc.session = false;
        // Split preheater (created here, in the process that uses it).
        if split_cpus != pc.split_cpus {
            pc.par = if split_cpus.is_empty() {
                None
            } else {
                let cpus: Vec<usize> = split_cpus.iter().map(|&c| c as usize).collect();
                Some(Arc::new(ParallelPreheater::new(&cpus).map_err(|e| {
                    format!("configure: cannot start split preheat workers on {cpus:?}: {e}")
                })?))
            };
            pc.split_cpus = split_cpus;
        }
        // Replay connection.
        let want = replay.filter(|r| !r.is_empty()).map(|r| {
            (
                r.into_bytes(),
                replay_until.unwrap_or_default().into_bytes(),
            )
        });
        let same = match (&want, &pc.replay) {
            (Some((req, until)), Some(c)) => {
                c.request == *req
                    && c.until == *until
                    && pc.replay_via == via
                    && !c.broken.load(Ordering::Acquire)
            }
            (None, None) => true,
            _ => false,
        };
        let mut result = Ok(Reply::Ok);
        if !same {
            if let Some(old) = pc.replay.take() {
                old.replace_fd(-1);
            }
            pc.replay_via = via.clone();
            if let Some((req, until)) = want {
                match connect_replay(port, via.as_ref(), &req, &until) {
                    Ok(ReplayTarget::Persistent(fd)) => {
                        pc.replay = Some(Arc::new(ReplayConn::new(port, req, until, fd)));
                        log(&format!(
                            "port {port}: replay connection open ({})",
                            super::served::describe(port, via.as_ref())
                        ));
                    }
                    Ok(ReplayTarget::Fresh(why)) => {
                        pc.replay = Some(Arc::new(ReplayConn::fresh(port, req, until)));
                        log(&format!(
                            "port {port}: replay on a fresh connection per warm-up, served by \
                             whichever of the server's processes accepts it: {why}"
                        ));
                    }
                    Err(e) => {
                        result = Err(format!(
                            "configure: cannot open the replay connection ({}): {e}",
                            super::served::describe(port, via.as_ref())
                        ))
                    }
                }
            }
        }
        self.republish();
        result
    }

    /// `ConfigureSession`: the connection `fd` the caller passed is `port`'s replay connection,
    /// once `request` sent on it is answered (ending with `until`) and served by this process.
    pub(super) fn configure_session(
        &mut self,
        port: u16,
        request: Vec<u8>,
        until: Vec<u8>,
        fd: Option<std::os::fd::OwnedFd>,
    ) -> Result<Reply, String> {
        let fd = fd.ok_or("configure_session came without a file descriptor (SCM_RIGHTS)")?;
        if port == 0 || request.is_empty() || until.is_empty() {
            return Err(
                "configure_session: a port, a request and its reply's end are needed".into(),
            );
        }
        let fd = own(super::served::adopt_served(fd, port, &request, &until)?);
        let pc = self.ports.entry(port).or_default();
        if let Some(old) = pc.replay.take() {
            old.replace_fd(-1);
        }
        pc.replay_via = None;
        pc.session = true;
        pc.replay = Some(Arc::new(ReplayConn::new(port, request, until, fd)));
        log(&format!(
            "port {port}: replay on a session connection the caller opened ({} bytes per warm-up)",
            pc.replay.as_ref().map_or(0, |c| c.request.len())
        ));
        self.republish();
        Ok(Reply::Ok)
    }

    /// Build a plan from the profile and port configuration and publish it.
    pub(super) fn republish(&mut self) {
        let mut ports: Vec<u16> = self.ports.keys().copied().collect();
        if let Some(p) = &self.profile {
            ports.extend(p.runs.keys().copied());
        }
        ports.sort_unstable();
        ports.dedup();
        let mut plan = Plan::default();
        for port in ports {
            let runs = self
                .profile
                .as_ref()
                .and_then(|p| p.runs.get(&port))
                .cloned()
                .unwrap_or_default();
            let pc = self.ports.get(&port);
            let split = pc.and_then(|pc| pc.par.clone()).map(|par| {
                let mut pieces = split_runs(&runs, par.workers() + 1).into_iter();
                let local = pieces.next().unwrap_or_default();
                Split {
                    par,
                    local,
                    pieces: pieces.collect(),
                }
            });
            plan.ports.push(PortPlan {
                port,
                runs,
                split,
                replay: pc.and_then(|pc| pc.replay.clone()),
            });
        }
        if let Some(old) = plan::publish(Arc::new(plan)) {
            self.retired.push(old);
        }
        self.retired.retain(|p| Arc::strong_count(p) > 1);
    }
}

/// A replay connection's descriptor, registered as the agent's own (the host cannot close it).
fn own(st: std::net::TcpStream) -> RawFd {
    let fd = st.into_raw_fd();
    fdreg::register_fd(fd);
    fd
}

/// Where a port's warm-ups go.
enum ReplayTarget {
    /// A persistent loopback connection this process serves.
    Persistent(RawFd),
    /// A fresh connection per warm-up ([`crate::fresh`]), and why.
    Fresh(&'static str),
}

/// Find where `request` warms this process's port up: the persistent loopback replay connection
/// (non-blocking, no Nagle) that this process serves, on which `request` was answered once (see
/// [`super::served`]) — or, where the server closes every connection after its reply or where
/// only other processes of the server (a prefork server's sibling workers) answer while this
/// one is busy, a fresh connection per warm-up.
fn connect_replay(
    port: u16,
    via: Option<&ReplayVia>,
    request: &[u8],
    until: &[u8],
) -> Result<ReplayTarget, String> {
    match super::served::connect_served(port, via, request, until) {
        Ok(s) => Ok(match s.stream {
            Some(st) => ReplayTarget::Persistent(own(st)),
            None => ReplayTarget::Fresh(
                "the server closes the connection after every reply (HTTP/1.0 or Connection: \
                 close)",
            ),
        }),
        Err(e) if e.answered_elsewhere => Ok(ReplayTarget::Fresh(
            "every connection this process opened was served by another process of the server \
             (a prefork server whose workers serve one connection at a time: this one is busy \
             with its client's); the warm-ups warm what the workers share — code, data from \
             before the fork, the kernel's paths — on the server's CPU",
        )),
        Err(e) => Err(e.message),
    }
}

/// Control thread: read the replies of a port's open warm-up connections and close the
/// finished ones (unless a worker is warming up on it right now: then the next round does).
fn reap_fresh(conn: &ReplayConn, f: &crate::fresh::FreshConns) {
    if conn
        .busy
        .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return;
    }
    if !conn.retired.load(Ordering::SeqCst) {
        f.reap(&conn.until, preheat_engine::time::now_ns());
    }
    conn.busy.store(false, Ordering::SeqCst);
}
