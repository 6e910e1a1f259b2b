//! `--observe`: after each reply, the agents of the run directory are asked when the server
//! thread started on the request, and their preheat counters are summed around the run.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use preheat_lab::load::{CsvSink, Record, RecordSink};
use preheat_launch::{agentctl, paths};

/// Records to the CSV file (if any) and, for each, the agents' start of the busy period that
/// served it. Runs on the engine's records thread, so the agents are asked after the reply,
/// never inside a measured interval.
pub(crate) struct ObserveSink {
    pub csv: Option<CsvSink>,
    pub observer: Observer,
    pub starts: Arc<Mutex<Vec<f64>>>,
}

impl RecordSink for ObserveSink {
    fn write(&mut self, r: &Record) -> Result<()> {
        if let Some(c) = self.csv.as_mut() {
            c.write(r)?;
        }
        if let Some(start) = self.observer.start_of(r.granted_ns, r.done_ns) {
            if let Ok(mut s) = self.starts.lock() {
                s.push((start as f64 - r.granted_ns as f64) / 1e3);
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        match self.csv.as_mut() {
            Some(c) => c.flush(),
            None => Ok(()),
        }
    }
}

/// Reads the agents of the run dir, over control connections opened once.
pub(crate) struct Observer {
    agents: Vec<agentctl::AgentClient>,
    port: u16,
}

impl Observer {
    pub(crate) fn new(port: u16) -> Observer {
        let dir = paths::run_dir();
        let agents = agentctl::discover(&dir)
            .into_iter()
            .filter_map(|pid| agentctl::AgentClient::connect(&dir, pid).ok())
            .collect();
        Observer { agents, port }
    }

    /// Status of every agent that still answers (agents that went away are dropped).
    fn statuses(&mut self) -> Vec<preheat_model::proto::Reply> {
        let mut out = Vec::new();
        self.agents
            .retain_mut(|c| match c.call(&preheat_model::proto::Request::Status) {
                Ok(r) => {
                    out.push(r);
                    true
                }
                Err(_) => false,
            });
        out
    }

    /// The start of the busy period for the port that served a request announced for
    /// `arrival_ns` and answered at `done_ns`: the agents' latest start, if it lies in
    /// [arrival − 1 ms, done]. The agent records a period when it ends, so poll briefly; a
    /// start after `done` means a later request already began, and this one is not observable.
    fn start_of(&mut self, arrival_ns: u64, done_ns: u64) -> Option<u64> {
        let t0 = std::time::Instant::now();
        loop {
            let port = self.port;
            let best = self
                .statuses()
                .into_iter()
                .filter_map(|r| match r {
                    preheat_model::proto::Reply::Status { ports, .. } => ports
                        .iter()
                        .find(|p| p.port == port)
                        .map(|p| p.last_start_ns),
                    _ => None,
                })
                .max();
            match best {
                Some(b) if b > done_ns => return None,
                Some(b) if b + 1_000_000 >= arrival_ns => return Some(b),
                _ => {}
            }
            if t0.elapsed() > Duration::from_millis(20) {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Summed agent counters: announcements, preheats, completed, late.
    pub(crate) fn totals(&mut self) -> [u64; 4] {
        let mut t = [0u64; 4];
        for r in self.statuses() {
            if let preheat_model::proto::Reply::Status { preheat, .. } = r {
                t[0] += preheat.announcements;
                t[1] += preheat.preheats;
                t[2] += preheat.completed;
                t[3] += preheat.late;
            }
        }
        t
    }
}
