//! One client connection's threads: the client reader (frames requests and stages them), the
//! writer (sends released bursts to the backend, opening it at the first), the backend reader
//! (forwards responses at once and times them), and how a connection fails and closes.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{add, lock, spawn_conn_thread, stage, Conn, ConnState, Inflight, Req, Shared};
use crate::framing::{self, Event, FrameError, Framing, ResponseTracker};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ErrorKind {
    /// Backend unreachable or failed (HTTP 502).
    Unavailable,
    /// Request malformed (HTTP 400).
    BadRequest,
    /// Request too large (HTTP 413).
    TooLarge,
}

/// A proxy-generated error reply answering `count` requests.
pub(super) fn error_reply(protocol: Framing, kind: ErrorKind, count: u64, msg: &str) -> Vec<u8> {
    let msg: String = msg
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    match protocol {
        Framing::Memcached => {
            let word = match kind {
                ErrorKind::Unavailable => "SERVER_ERROR",
                ErrorKind::BadRequest | ErrorKind::TooLarge => "CLIENT_ERROR",
            };
            format!("{word} proxy: {msg}\r\n")
                .repeat(count.max(1) as usize)
                .into_bytes()
        }
        Framing::Http => {
            let status = match kind {
                ErrorKind::Unavailable => "502 Bad Gateway",
                ErrorKind::BadRequest => "400 Bad Request",
                ErrorKind::TooLarge => "413 Content Too Large",
            };
            let body = format!("preheat stage: {msg}\n");
            format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        }
    }
}

/// Closes both sides of a connection; `count_dropped` counts still-buffered requests as dropped.
pub(super) fn close_conn(sh: &Shared, conn: &Conn, count_dropped: bool) {
    let mut st = lock(&conn.state);
    if st.closed {
        return;
    }
    st.closed = true;
    if count_dropped {
        let n = (st.staged.len() + st.released.len()) as u64;
        add(&sh.counters.requests_dropped, n);
    }
    st.staged.clear();
    st.released.clear();
    st.buffered_bytes = 0;
    let _ = conn.client.shutdown(Shutdown::Both);
    if let Some(b) = &st.backend {
        let _ = b.shutdown(Shutdown::Both);
    }
    conn.cv.notify_all();
    drop(st);
    add(&sh.counters.connections_closed, 1);
}

/// Answers everything outstanding with a proxy error (unless a response is half forwarded) and
/// closes. Returns the number of requests answered.
pub(super) fn fail_conn(sh: &Shared, conn: &Conn, msg: &str) -> u64 {
    let (outstanding, mid, tracking) = {
        let mut st = lock(&conn.state);
        if st.closed {
            return 0;
        }
        let n = st.outstanding();
        st.staged.clear();
        st.released.clear();
        st.inflight.clear();
        (n, st.mid_response, st.tracking)
    };
    let mut answered = 0;
    if outstanding > 0 && !mid && tracking {
        let reply = error_reply(sh.cfg.protocol, ErrorKind::Unavailable, outstanding, msg);
        if (&conn.client).write_all(&reply).is_ok() {
            answered = outstanding;
            add(&sh.counters.bytes_to_clients, reply.len() as u64);
        }
    }
    add(&sh.counters.requests_failed, answered);
    close_conn(sh, conn, false);
    answered
}

pub(super) fn client_reader(sh: &Arc<Shared>, conn: &Arc<Conn>, mut client: TcpStream) {
    let cfg = &sh.cfg;
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    let mut partial_since: Option<Instant> = None;
    let mut opaque = false;
    loop {
        // Backpressure: stop reading while this connection has too much buffered.
        if !wait_for_room(conn, cfg.max_buffered_per_conn) {
            return;
        }
        let n = match client.read(&mut chunk) {
            Ok(0) => {
                if !buf.is_empty() {
                    add(&sh.counters.client_disconnects_mid_request, 1);
                }
                finish_client(conn, None);
                return;
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                // Reset or shut down by us: the client is gone.
                if !buf.is_empty() {
                    add(&sh.counters.client_disconnects_mid_request, 1);
                }
                close_conn(sh, conn, true);
                return;
            }
        };
        let now = Instant::now();
        add(&sh.counters.bytes_from_clients, n as u64);
        let had_partial = !buf.is_empty();
        buf.extend_from_slice(&chunk[..n]);
        let mut start = if had_partial {
            partial_since.unwrap_or(now)
        } else {
            now
        };
        let mut off = 0;
        while off < buf.len() {
            if opaque {
                let req = Req {
                    arrival: start,
                    bytes: buf[off..].to_vec(),
                    expects: false,
                    head: false,
                };
                off = buf.len();
                if !stage(sh, conn, req, true) {
                    return;
                }
                break;
            }
            match framing::request(cfg.protocol, &buf[off..], &cfg.limits) {
                Ok(Some(f)) => {
                    let req = Req {
                        arrival: start,
                        bytes: buf[off..off + f.len].to_vec(),
                        expects: f.expects_response,
                        head: f.head,
                    };
                    off += f.len;
                    start = now;
                    if !stage(sh, conn, req, false) {
                        return;
                    }
                    if f.opaque_after {
                        // Its response is still framed (up to the 101); later chunks expect none.
                        opaque = true;
                        add(&sh.counters.opaque_connections, 1);
                    }
                }
                Ok(None) => break,
                Err(FrameError::Unsupported(_)) => {
                    opaque = true;
                    add(&sh.counters.opaque_connections, 1);
                    lock(&conn.state).tracking = false;
                }
                Err(e) => {
                    add(&sh.counters.client_protocol_errors, 1);
                    let kind = match e {
                        FrameError::TooLarge(_) => ErrorKind::TooLarge,
                        _ => ErrorKind::BadRequest,
                    };
                    let reply = error_reply(cfg.protocol, kind, 1, &e.to_string());
                    finish_client(conn, Some(reply));
                    return;
                }
            }
        }
        buf.drain(..off);
        partial_since = (!buf.is_empty()).then_some(start);
    }
}

/// Wait until `conn` has at most `max` bytes buffered; false if it was closed meanwhile.
fn wait_for_room(conn: &Conn, max: usize) -> bool {
    let mut st = lock(&conn.state);
    while !st.closed && st.buffered_bytes > max {
        st = conn.cv.wait(st).unwrap_or_else(|e| e.into_inner());
    }
    !st.closed
}

/// No more requests from this client; `terminal` is answered after all earlier responses.
fn finish_client(conn: &Conn, terminal: Option<Vec<u8>>) {
    let mut st = lock(&conn.state);
    st.client_done = true;
    if terminal.is_some() {
        st.terminal = terminal;
    }
    conn.cv.notify_all();
}

pub(super) fn writer(sh: &Arc<Shared>, conn: &Arc<Conn>) {
    let cfg = &sh.cfg;
    loop {
        let (batch, backend) = {
            let mut st = lock(&conn.state);
            loop {
                if st.closed {
                    return;
                }
                if !st.released.is_empty() {
                    break;
                }
                if st.client_done && st.staged.is_empty() {
                    // Everything written: pass the client's end of stream on.
                    match &st.backend {
                        Some(b) => {
                            let _ = b.shutdown(Shutdown::Write);
                            // The backend reader must not wait forever for the backend's end.
                            let _ = b.set_read_timeout(Some(cfg.bound + Duration::from_secs(5)));
                        }
                        None => {
                            let terminal = st.terminal.take();
                            drop(st);
                            if let Some(t) = terminal {
                                if (&conn.client).write_all(&t).is_ok() {
                                    add(&sh.counters.bytes_to_clients, t.len() as u64);
                                }
                            }
                            close_conn(sh, conn, false);
                        }
                    }
                    return;
                }
                st = conn.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            let batch: Vec<Req> = st.released.drain(..).collect();
            // With a backend connection, the batch becomes in flight in the same critical
            // section, so a concurrent backend failure always sees it as outstanding.
            let backend = match st.backend.as_ref().map(TcpStream::try_clone) {
                Some(Ok(b)) => {
                    mark_inflight(&mut st, &batch);
                    Some(b)
                }
                Some(Err(_)) => {
                    drop(st);
                    requeue(conn, batch);
                    add(&sh.counters.backend_failures, 1);
                    fail_conn(sh, conn, "backend connection failed");
                    return;
                }
                None => None,
            };
            (batch, backend)
        };
        let backend = match backend {
            Some(b) => b,
            None => match connect_backend(sh, conn, &batch) {
                Ok(b) => b,
                Err(e) => {
                    add(&sh.counters.backend_connect_failures, 1);
                    requeue(conn, batch);
                    fail_conn(
                        sh,
                        conn,
                        &format!("backend {} unavailable: {e}", cfg.backend),
                    );
                    return;
                }
            },
        };
        let bytes: usize = batch.iter().map(|r| r.bytes.len()).sum();
        let mut out = Vec::with_capacity(bytes);
        for r in &batch {
            out.extend_from_slice(&r.bytes);
        }
        // One write per burst and connection.
        let result = (&backend).write_all(&out);
        {
            let mut st = lock(&conn.state);
            st.buffered_bytes = st.buffered_bytes.saturating_sub(bytes);
            conn.cv.notify_all();
        }
        if result.is_err() {
            // The backend reader sees the failure too and answers what is outstanding.
            let _ = backend.shutdown(Shutdown::Both);
            return;
        }
    }
}

fn mark_inflight(st: &mut ConnState, batch: &[Req]) {
    if !st.tracking {
        return;
    }
    let now = Instant::now();
    for r in batch.iter().filter(|r| r.expects) {
        st.inflight.push_back(Inflight {
            sent: now,
            head: r.head,
        });
    }
}

/// Puts a taken batch back in front so failure handling counts it as outstanding.
fn requeue(conn: &Conn, batch: Vec<Req>) {
    let mut st = lock(&conn.state);
    for r in batch.into_iter().rev() {
        st.released.push_front(r);
    }
}

/// Opens the connection's backend connection, marks `batch` in flight and starts the backend
/// reader.
fn connect_backend(sh: &Arc<Shared>, conn: &Arc<Conn>, batch: &[Req]) -> io::Result<TcpStream> {
    let b = TcpStream::connect_timeout(&sh.cfg.backend, sh.cfg.connect_timeout)?;
    let _ = b.set_nodelay(true);
    let _ = b.set_write_timeout(Some(Duration::from_secs(30)));
    let reader = b.try_clone()?;
    let mine = b.try_clone()?;
    {
        let mut st = lock(&conn.state);
        if st.closed {
            let _ = b.shutdown(Shutdown::Both);
            return Err(io::Error::new(io::ErrorKind::NotConnected, "client gone"));
        }
        st.backend = Some(b);
        mark_inflight(&mut st, batch);
    }
    add(&sh.counters.backend_connects, 1);
    let (s, c) = (sh.clone(), conn.clone());
    if let Err(e) = spawn_conn_thread(sh, "stage-backend", move || backend_reader(&s, &c, reader)) {
        let _ = mine.shutdown(Shutdown::Both);
        lock(&conn.state).inflight.clear();
        return Err(e);
    }
    Ok(mine)
}

fn backend_reader(sh: &Arc<Shared>, conn: &Arc<Conn>, mut backend: TcpStream) {
    let cfg = &sh.cfg;
    let mut tracker = ResponseTracker::new(cfg.protocol, cfg.limits.max_line);
    let mut buf = vec![0u8; 64 * 1024];
    let mut samples: Vec<Duration> = Vec::new();
    let reason = loop {
        let n = match backend.read(&mut buf) {
            Ok(0) => break "backend closed the connection".to_string(),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => break format!("backend connection failed: {e}"),
        };
        if (&conn.client).write_all(&buf[..n]).is_err() {
            add(&sh.counters.client_write_errors, 1);
            close_conn(sh, conn, true);
            return;
        }
        add(&sh.counters.bytes_to_clients, n as u64);
        let now = Instant::now();
        {
            let mut st = lock(&conn.state);
            if st.tracking {
                let mut off = 0;
                while off < n {
                    let head = st.inflight.front().is_some_and(|f| f.head);
                    let (used, event) = tracker.advance(&buf[off..n], head);
                    off += used;
                    match event {
                        Event::NeedMore => {}
                        Event::Complete | Event::Opaque => {
                            match st.inflight.pop_front() {
                                Some(f) => samples.push(now.saturating_duration_since(f.sent)),
                                None => add(&sh.counters.unmatched_responses, 1),
                            }
                            if event == Event::Opaque {
                                st.tracking = false;
                                st.inflight.clear();
                                break;
                            }
                        }
                        Event::Interim => add(&sh.counters.interim_responses, 1),
                        Event::Lost(_) => {
                            add(&sh.counters.response_framing_lost, 1);
                            st.tracking = false;
                            st.inflight.clear();
                            break;
                        }
                    }
                }
            }
            st.mid_response = tracker.mid_response();
        }
        if !samples.is_empty() {
            add(&sh.counters.responses, samples.len() as u64);
            let mut e = lock(&sh.est);
            for s in samples.drain(..) {
                e.sample(s);
            }
        }
    };
    let (closed, client_done, outstanding, terminal, tracking) = {
        let mut st = lock(&conn.state);
        if tracker.eof() {
            if st.tracking && st.inflight.pop_front().is_some() {
                add(&sh.counters.responses, 1);
            }
            st.mid_response = false;
        }
        (
            st.closed,
            st.client_done,
            st.outstanding(),
            st.terminal.take(),
            st.tracking,
        )
    };
    if closed {
        return;
    }
    if outstanding > 0 && tracking {
        add(&sh.counters.backend_failures, 1);
        fail_conn(sh, conn, &reason);
        return;
    }
    if let Some(t) = terminal {
        if (&conn.client).write_all(&t).is_ok() {
            add(&sh.counters.bytes_to_clients, t.len() as u64);
        }
    } else if !client_done {
        add(&sh.counters.backend_closed_idle, 1);
    }
    close_conn(sh, conn, true);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_replies() {
        let r = error_reply(Framing::Memcached, ErrorKind::Unavailable, 2, "down\r\nx");
        assert_eq!(
            r,
            b"SERVER_ERROR proxy: down  x\r\nSERVER_ERROR proxy: down  x\r\n".to_vec()
        );
        let r = error_reply(Framing::Http, ErrorKind::TooLarge, 3, "big");
        let text = String::from_utf8(r).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 413 Content Too Large\r\n"),
            "{text}"
        );
        assert!(text.ends_with("\r\n\r\npreheat stage: big\n"), "{text}");
        assert!(text.contains("Content-Length: 19\r\n"), "{text}");
    }
}
