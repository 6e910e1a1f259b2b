//! One connection's driver, reopened after transport failures (with a short backoff), and the
//! point where the engine gives up on a server that is gone. A keep-alive connection the server
//! ends in the normal way (it said so with the last reply, or it closed a connection that had
//! served requests before answering the next: [`crate::driver::Stale`]) is reopened as real
//! clients do and counted in `reconnects`, not in `errors`.

use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::pacing::sleep_for;
use crate::driver::{is_stale, Driver, Outcome};

/// Reconnect attempts after a transport failure before giving up.
const RECONNECTS: u32 = 3;
/// Requests failing in a row (each on a fresh connection) before giving up.
const FAILS_IN_ROW: u32 = 3;

pub(super) type Connect<'a> = &'a (dyn Fn() -> Result<Box<dyn Driver>> + Sync);

/// One connection's driver, reconnected after transport failures.
pub(super) struct Conn<'a> {
    pub(super) id: usize,
    pub(super) driver: Box<dyn Driver>,
    connect: Connect<'a>,
    pub(super) errors: u64,
    /// Keep-alive connections the server ended normally, reopened (not errors).
    pub(super) reconnects: u64,
    pub(super) fails_in_row: u32,
}

impl<'a> Conn<'a> {
    pub(super) fn open(id: usize, connect: Connect<'a>) -> Result<Conn<'a>> {
        let driver = connect().with_context(|| format!("connection {id}: connecting"))?;
        Ok(Conn {
            id,
            driver,
            connect,
            errors: 0,
            reconnects: 0,
            fails_in_row: 0,
        })
    }

    /// Reopen the connection if the server said it closes it after the last reply (call it
    /// before timing a request). `Ok(true)`: reopened. `Err`: the server is gone for good.
    pub(super) fn ready(&mut self, cancel: &dyn Fn() -> bool) -> Result<bool> {
        if !self.driver.closing() {
            return Ok(false);
        }
        self.reconnects += 1;
        self.reconnect(
            anyhow::anyhow!("the server closed the keep-alive connection"),
            cancel,
        )?;
        Ok(true)
    }

    /// One request. `Ok(None)`: a transport failure, counted, and the connection was reopened
    /// (or `cancel` is set). `Err`: the server is gone for good.
    pub(super) fn request(&mut self, cancel: &dyn Fn() -> bool) -> Result<Option<Outcome>> {
        self.ready(cancel)?;
        match self.driver.request() {
            Ok(o) => {
                self.fails_in_row = 0;
                Ok(Some(o))
            }
            Err(e) => {
                self.failed(e, cancel)?;
                Ok(None)
            }
        }
    }

    /// A transport failure: count it and reopen the connection (unless `cancel` is set).
    /// `Err`: the server is gone for good.
    pub(super) fn failed(&mut self, e: anyhow::Error, cancel: &dyn Fn() -> bool) -> Result<()> {
        if is_stale(&e) {
            // Not answered and not a failure: reopen. A fresh connection that fails the same
            // way is not stale (it served nothing), so this cannot loop.
            self.reconnects += 1;
            return self.reconnect(e, cancel);
        }
        self.errors += 1;
        self.fails_in_row += 1;
        if self.fails_in_row >= FAILS_IN_ROW {
            return Err(e.context(format!(
                "connection {}: {} requests in a row failed, each on a fresh connection; giving up (is the server overloaded or closing connections?)",
                self.id, self.fails_in_row
            )));
        }
        self.reconnect(e, cancel)
    }

    fn reconnect(&mut self, cause: anyhow::Error, cancel: &dyn Fn() -> bool) -> Result<()> {
        let backoff = [
            Duration::ZERO,
            Duration::from_millis(10),
            Duration::from_millis(50),
        ];
        let mut last = None;
        for pause in backoff.iter().take(RECONNECTS as usize) {
            if !sleep_for(*pause, cancel) {
                return Ok(());
            }
            match (self.connect)() {
                Ok(d) => {
                    self.driver = d;
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
        }
        let last = last.map(|e| format!("{e:#}")).unwrap_or_default();
        bail!(
            "connection {}: the connection failed ({cause:#}) and {RECONNECTS} reconnects in a row failed (last: {last}); is the server still running?",
            self.id
        )
    }
}
