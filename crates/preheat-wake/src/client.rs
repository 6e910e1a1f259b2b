//! Client library for the wake daemon, for other crates (the agent, preheatd, benchmarks).
//!
//! ```no_run
//! # fn main() -> Result<(), preheat_wake::ClientError> {
//! use preheat_wake::WakeClient;
//! let mut c = WakeClient::connect(std::path::Path::new("/tmp/preheat"))?;
//! // Keep CPU 1 out of deep idle from 500 µs from now, for 200 µs.
//! let a = c.request_in("ssd-read", &[1], 500_000, 200_000)?;
//! println!("window {} via {}", a.id, a.mechanism);
//! // Keep `c` alive until the window has started: closing the connection cancels the windows
//! // it asked for that have not started yet.
//! # Ok(()) }
//! ```

use crate::plan::WakeRequest;
use crate::proto::{self, AcceptedReply, Status};
use preheat_engine::time::now_ns;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// An accepted window.
pub type Accepted = AcceptedReply;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon refused the request; the text says why.
    #[error("the wake daemon refused: {0}")]
    Rejected(String),
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("bad reply from the wake daemon: {0}")]
    Protocol(String),
}

/// One connection to the daemon. Windows belong to the connection: dropping the client cancels
/// the windows it asked for that have not started yet (running ones end at their end time).
pub struct WakeClient {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// Replies to [`WakeClient::request_nowait`] not read yet.
    unanswered: usize,
}

impl WakeClient {
    /// The daemon's socket in `run_dir`.
    pub fn socket_path(run_dir: &Path) -> PathBuf {
        run_dir.join(proto::SOCKET_NAME)
    }

    /// Connect to the daemon serving `run_dir`. Replies are awaited at most 5 s
    /// ([`WakeClient::set_timeout`]).
    pub fn connect(run_dir: &Path) -> io::Result<WakeClient> {
        let p = Self::socket_path(run_dir);
        let s = UnixStream::connect(&p).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot connect to the wake daemon at {}: {e} (is `preheat wake serve` running?)",
                    p.display()
                ),
            )
        })?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok(WakeClient {
            reader: BufReader::new(s.try_clone()?),
            writer: s,
            unanswered: 0,
        })
    }

    pub fn set_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        self.writer.set_read_timeout(t)
    }

    /// Ask for a window without waiting for the reply (for callers on a latency-critical path:
    /// the round trip to the daemon costs tens of µs here). Returns how many earlier replies
    /// were refusals; call [`WakeClient::collect_replies`] off the critical path.
    pub fn request_nowait(&mut self, req: &WakeRequest) -> Result<(), ClientError> {
        let mut line = serde_json::to_string(&serde_json::json!({
            "requester": req.requester,
            "cpus": req.cpus,
            "start_ns": req.start_ns,
            "duration_ns": req.duration_ns,
        }))
        .map_err(|e| ClientError::Protocol(e.to_string()))?;
        line.push('\n');
        self.writer.write_all(line.as_bytes())?;
        self.unanswered += 1;
        Ok(())
    }

    /// Read the replies of earlier [`WakeClient::request_nowait`] calls; returns how many were
    /// refusals.
    pub fn collect_replies(&mut self) -> Result<usize, ClientError> {
        let mut refused = 0;
        while self.unanswered > 0 {
            self.unanswered -= 1;
            match self.call_raw_reply() {
                Ok(_) => {}
                Err(ClientError::Rejected(_)) => refused += 1,
                Err(e) => return Err(e),
            }
        }
        Ok(refused)
    }

    fn call(&mut self, msg: &serde_json::Value) -> Result<serde_json::Value, ClientError> {
        self.collect_replies()?;
        let mut line =
            serde_json::to_string(msg).map_err(|e| ClientError::Protocol(e.to_string()))?;
        line.push('\n');
        self.writer.write_all(line.as_bytes())?;
        self.call_raw_reply()
    }

    fn call_raw_reply(&mut self) -> Result<serde_json::Value, ClientError> {
        let mut reply = String::new();
        if self.reader.read_line(&mut reply)? == 0 {
            return Err(ClientError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the wake daemon closed the connection",
            )));
        }
        let v: serde_json::Value =
            serde_json::from_str(&reply).map_err(|e| ClientError::Protocol(e.to_string()))?;
        if v.get("ok") == Some(&serde_json::Value::Bool(true)) {
            Ok(v)
        } else {
            Err(ClientError::Rejected(
                v.get("error")
                    .and_then(|e| e.as_str())
                    .unwrap_or("no reason given")
                    .to_string(),
            ))
        }
    }

    /// Send one raw request line (for tests of the protocol); returns the reply.
    pub fn send_raw(&mut self, line: &str) -> Result<serde_json::Value, ClientError> {
        self.writer.write_all(line.trim_end().as_bytes())?;
        self.writer.write_all(b"\n")?;
        self.call_raw_reply()
    }

    /// Ask for a window.
    pub fn request(&mut self, req: &WakeRequest) -> Result<Accepted, ClientError> {
        let v = self.call(&serde_json::json!({
            "requester": req.requester,
            "cpus": req.cpus,
            "start_ns": req.start_ns,
            "duration_ns": req.duration_ns,
        }))?;
        serde_json::from_value(v).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// Ask for a window starting `in_ns` from now (this host's CLOCK_MONOTONIC).
    pub fn request_in(
        &mut self,
        requester: &str,
        cpus: &[u32],
        in_ns: u64,
        duration_ns: u64,
    ) -> Result<Accepted, ClientError> {
        self.request(&WakeRequest {
            requester: requester.to_string(),
            cpus: cpus.to_vec(),
            // A window from now counts from when the daemon gets it: a request that waits for
            // the daemon must not lose (or, for a short hold, be refused for) the wait.
            start_ns: if in_ns == 0 {
                crate::plan::START_ON_RECEIPT
            } else {
                now_ns().saturating_add(in_ns)
            },
            duration_ns,
        })
    }

    /// Cancel window `id` of this connection if it has not started.
    pub fn cancel(&mut self, id: u64) -> Result<(), ClientError> {
        self.call(&serde_json::json!({"cmd": "cancel", "id": id}))
            .map(drop)
    }

    /// The daemon's state.
    pub fn status(&mut self) -> Result<Status, ClientError> {
        let v = self.call(&serde_json::json!({"cmd": "status"}))?;
        let st = v
            .get("status")
            .cloned()
            .ok_or_else(|| ClientError::Protocol("no status in the reply".into()))?;
        serde_json::from_value(st).map_err(|e| ClientError::Protocol(e.to_string()))
    }
}
