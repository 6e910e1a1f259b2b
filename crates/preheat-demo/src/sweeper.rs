//! The cold-making sweep, run by a thread of its own pinned to the server's CPU.
//!
//! The demo's client used to move itself onto the server's CPU to sweep and move back, while
//! its own CPU idled (see [`crate::measure`] for what that cost the client; the paper's client
//! runs on cores with a last-level cache of their own and only flushes the server's). A sweeper
//! thread keeps the client where it is: the client asks and spins until the sweeper, on the
//! server's CPU, has walked the eviction buffer.

use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::thread::JoinHandle;

use anyhow::{anyhow, Context, Result};
use preheat_engine::sweep::EvictionBuffer;

/// A thread pinned to one CPU that sweeps an eviction buffer on request. Dropping it ends the
/// thread.
pub(crate) struct Sweeper {
    ask: Option<Sender<()>>,
    done: Receiver<u64>,
    thread: Option<JoinHandle<()>>,
}

impl Sweeper {
    /// Start the sweeper on `cpu` with `buf`; fails if it cannot be pinned there.
    pub(crate) fn start(buf: EvictionBuffer, cpu: usize) -> Result<Sweeper> {
        let (ask, asked) = channel::<()>();
        let (finished, done) = channel::<u64>();
        let (ready_tx, ready) = channel::<std::io::Result<()>>();
        let thread = std::thread::Builder::new()
            .name("preheat-sweep".into())
            .spawn(move || {
                let pinned = preheat_engine::os::pin_current_thread(cpu);
                let ok = pinned.is_ok();
                let _ = ready_tx.send(pinned);
                if !ok {
                    return;
                }
                while asked.recv().is_ok() {
                    if finished.send(buf.sweep()).is_err() {
                        return;
                    }
                }
            })
            .context("starting the sweeper thread")?;
        let mut s = Sweeper {
            ask: Some(ask),
            done,
            thread: Some(thread),
        };
        match ready.recv() {
            Ok(Ok(())) => Ok(s),
            Ok(Err(e)) => {
                s.stop();
                Err(anyhow!(e).context(format!("pinning the sweeper to CPU {cpu}")))
            }
            Err(_) => {
                s.stop();
                Err(anyhow!("the sweeper thread ended before it started"))
            }
        }
    }

    /// Sweep once on the sweeper's CPU and spin until it is done, calling `waiting` meanwhile,
    /// at least once (the caller's CPU stays awake and its path warm: [`crate::measure`],
    /// [`crate::warmth`]); its duration, ns.
    pub(crate) fn sweep(&self, mut waiting: impl FnMut() -> Result<()>) -> Result<u64> {
        let ask = self
            .ask
            .as_ref()
            .ok_or_else(|| anyhow!("the sweeper was stopped"))?;
        ask.send(())
            .map_err(|_| anyhow!("the sweeper thread ended"))?;
        loop {
            // At least once, however fast the sweep.
            waiting()?;
            match self.done.try_recv() {
                Ok(ns) => return Ok(ns),
                Err(TryRecvError::Empty) => std::hint::spin_loop(),
                Err(TryRecvError::Disconnected) => {
                    return Err(anyhow!("the sweeper thread ended during a sweep"))
                }
            }
        }
    }

    fn stop(&mut self) {
        self.ask = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_on_request_and_stops_when_dropped() {
        let s = Sweeper::start(EvictionBuffer::new(1 << 20), 0).unwrap();
        let mut calls = 0;
        assert!(s.sweep(|| Ok(())).unwrap() > 0);
        assert!(
            s.sweep(|| {
                calls += 1;
                Ok(())
            })
            .unwrap()
                > 0
        );
        assert!(calls > 0, "nothing done while waiting");
        drop(s);
    }

    #[test]
    fn a_cpu_that_does_not_exist_is_an_error() {
        let e = Sweeper::start(EvictionBuffer::new(4096), 4096)
            .err()
            .expect("pinned to CPU 4096");
        assert!(format!("{e:#}").contains("CPU 4096"), "{e:#}");
    }
}
