//! What the outside agent's threads share: the configuration, the counters the status reports,
//! the warm-up request, the loaded lines, the probe, and the observer.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};

use preheat_engine::fileview::FileView;
use preheat_model::proto::{LoadedClass, PortStats, PreheatStats, Strategies};
use preheat_model::AbsRun;
use preheat_observe::session::Observer;

use crate::replay::{Conn, WarmUp};
use crate::Config;

/// The probe's view of the server's read-only file-backed memory (or why there is none) and
/// its loopback connection (not the worker's warm-up connection); see [`crate::probe`].
pub struct Probe {
    view: Result<FileView, String>,
    conn: Mutex<Conn>,
}

impl Probe {
    /// Map the read-only file-backed memory of `pid`; a failure is kept, and said by every
    /// request that needs the view.
    pub fn open(pid: u32) -> Probe {
        Probe {
            view: FileView::open(pid).map_err(|e| {
                format!("cannot map pid {pid}'s read-only file-backed memory here: {e}")
            }),
            conn: Mutex::new(Conn::new()),
        }
    }

    pub fn view(&self) -> Result<&FileView, String> {
        self.view.as_ref().map_err(Clone::clone)
    }

    pub fn conn(&self) -> MutexGuard<'_, Conn> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The loaded profile's lines for the port, as runs of the outside agent's view of the server's
/// file-backed memory (`lines` walks them).
#[derive(Debug)]
pub struct Lines {
    pub path: String,
    pub class: LoadedClass,
    pub runs: Vec<AbsRun>,
}

/// Counters and settings, behind one lock (never held across a system call on the worker's
/// path: the worker copies what it needs and lets go).
#[derive(Debug, Default)]
pub struct Inner {
    pub port: PortStats,
    pub preheat: PreheatStats,
    /// A new one per `configure` (the worker opens a new connection for it).
    pub warm_up: Option<Arc<WarmUp>>,
    /// What `auto` does for the port (`SetAuto`); `None`: [`Strategies::AUTO_UNMEASURED`].
    pub auto: Option<Strategies>,
    /// Server threads seen in a busy period.
    pub tids: BTreeSet<u32>,
    /// The loaded profile (`None`: `lines` counts `no_profile`).
    pub lines: Option<Arc<Lines>>,
}

pub struct Shared {
    pub cfg: Config,
    pub stop: AtomicBool,
    pub enabled: AtomicBool,
    /// The probe's view of the server's read-only file-backed memory and its connection.
    pub probe: Probe,
    inner: Mutex<Inner>,
    observer: Mutex<Observer>,
}

impl Shared {
    pub fn new(cfg: Config, observer: Observer) -> Shared {
        let inner = Inner {
            port: PortStats {
                port: cfg.port,
                last_cpu: cfg.cpu as u32,
                ..PortStats::default()
            },
            ..Inner::default()
        };
        Shared {
            probe: Probe::open(cfg.pid),
            cfg,
            stop: AtomicBool::new(false),
            enabled: AtomicBool::new(true),
            inner: Mutex::new(inner),
            observer: Mutex::new(observer),
        }
    }

    /// The counters and settings (a poisoned lock still holds consistent counters: every
    /// update is a few field writes).
    pub fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `Ok` for the port this stand-in preheats; else the error every request for another
    /// port gets.
    pub fn check_port(&self, port: u16) -> Result<(), String> {
        if port == self.cfg.port {
            Ok(())
        } else {
            Err(format!(
                "this outside agent preheats port {} of pid {}, not port {port}",
                self.cfg.port, self.cfg.pid
            ))
        }
    }

    pub fn observer(&self) -> MutexGuard<'_, Observer> {
        self.observer.lock().unwrap_or_else(|p| p.into_inner())
    }
}
