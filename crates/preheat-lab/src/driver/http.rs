//! HTTP/1.1: `GET PATH` with keep-alive → status line, headers, then a `Content-Length` body, a
//! `Transfer-Encoding: chunked` body (decoded), or a body up to the end of the connection. The
//! framing is the workspace's one HTTP framing (`preheat-http`: httparse for the head).

use anyhow::{bail, Result};

use std::net::SocketAddr;

use preheat_http::{response_head, Body, BodyReader, ResponseHead};

use super::conn::{conn_driver, excerpt, matches_expect, Conn, MAX_BODY};
use super::{Driver, Outcome, Protocol, Wait, WorkloadSpec};

/// An HTTP driver for `w` on `addr` (the key is the path).
pub(super) fn connect(addr: SocketAddr, w: &WorkloadSpec, wait: Wait) -> Result<Box<dyn Driver>> {
    let path = http_path(&w.key);
    if path
        .bytes()
        .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        bail!("HTTP path {path:?} contains whitespace or control characters");
    }
    let conn = Conn::open(addr, wait)?;
    Ok(Box::new(HttpDriver {
        request: http_get(&path),
        expect: w.expect.clone(),
        conn,
        closed: false,
        body: Vec::new(),
    }))
}

/// Longest response head (status line and header fields) and chunk-size or trailer line.
const MAX_HEAD: usize = 64 * 1024;

/// The HTTP path of a workload key ("" → "/", "index.html" → "/index.html").
pub fn http_path(key: &str) -> String {
    if key.starts_with('/') {
        key.to_string()
    } else {
        format!("/{key}")
    }
}

/// An HTTP/1.1 keep-alive GET of `path`.
pub(super) fn http_get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n").into_bytes()
}

struct HttpDriver {
    conn: Conn,
    request: Vec<u8>,
    expect: Option<Vec<u8>>,
    /// The server ended the keep-alive connection with the last response.
    closed: bool,
    /// Decoded chunked body (reused).
    body: Vec<u8>,
}

impl HttpDriver {
    /// Read one response head (framed by `preheat-http`, which uses httparse).
    fn head(&mut self) -> Result<ResponseHead> {
        loop {
            match response_head(self.conn.unparsed(), false, MAX_HEAD) {
                Ok(Some(h)) => {
                    self.conn.consume(h.len);
                    return Ok(h);
                }
                Ok(None) => self.conn.fill()?,
                Err(e) => bail!(
                    "{} sent a reply that is not HTTP/1.x: {e}: {}",
                    self.conn.addr,
                    excerpt(self.conn.unparsed())
                ),
            }
        }
    }

    /// Read a chunked body into `self.body` (chunks decoded).
    fn chunked_body(&mut self) -> Result<()> {
        self.body.clear();
        let mut reader = BodyReader::new(Body::Chunked, MAX_HEAD);
        loop {
            let data = self.conn.unparsed();
            let step = reader
                .advance(data)
                .map_err(|e| anyhow::anyhow!("a chunked body from {}: {e}", self.conn.addr))?;
            self.body.extend_from_slice(&data[step.payload.clone()]);
            let all = step.consumed == data.len();
            self.conn.consume(step.consumed);
            if self.body.len() > MAX_BODY {
                bail!(
                    "a chunked body from {} is larger than {MAX_BODY} bytes",
                    self.conn.addr
                );
            }
            if step.done {
                return Ok(());
            }
            if all {
                self.conn.fill()?;
            }
        }
    }
}

conn_driver!(
    HttpDriver,
    Protocol::Http,
    before_send = check_open,
    closing = closed
);

impl HttpDriver {
    fn check_open(&self) -> Result<()> {
        if self.closed {
            bail!(
                "{} closed the keep-alive connection after the last response",
                self.conn.addr
            );
        }
        Ok(())
    }

    /// Read one whole response (the state changes only once it is complete, so an
    /// incomplete parse can be repeated).
    fn parse(&mut self) -> Result<Outcome> {
        let head = loop {
            let head = self.head()?;
            if head.status == 101 {
                bail!("{} switched protocols (101) on a plain GET", self.conn.addr);
            }
            // Interim responses (100 Continue, 103 Early Hints) precede the real one.
            if !(100..200).contains(&head.status) {
                break head;
            }
        };
        let body_ok = match head.body {
            Body::None => matches_expect(&self.expect, b""),
            Body::Length(n) => {
                let Some(n) = usize::try_from(n).ok().filter(|&n| n <= MAX_BODY) else {
                    bail!(
                        "a body from {} is larger than {MAX_BODY} bytes",
                        self.conn.addr
                    );
                };
                let r = self.conn.take(n)?;
                matches_expect(&self.expect, &self.conn.buf[r])
            }
            Body::Chunked => {
                self.chunked_body()?;
                matches_expect(&self.expect, &self.body)
            }
            Body::UntilClose => {
                let r = self.conn.take_to_eof()?;
                matches_expect(&self.expect, &self.conn.buf[r])
            }
        };
        if head.close {
            self.closed = true;
        }
        Ok(Outcome {
            kind: "GET",
            ok: head.status == 200 && body_ok,
        })
    }
}
