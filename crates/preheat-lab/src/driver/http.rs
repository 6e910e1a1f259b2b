//! HTTP/1.1: `GET PATH` with keep-alive → status line, headers, then a `Content-Length` body, a
//! `Transfer-Encoding: chunked` body (decoded), or a body up to the end of the connection.

use anyhow::{bail, Result};

use std::net::SocketAddr;

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

/// Most HTTP header lines in one response.
const MAX_HEADERS: usize = 128;

/// The HTTP path of a workload key ("" → "/", "index.html" → "/index.html").
pub(super) fn http_path(key: &str) -> String {
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

/// How the body of a response is framed.
enum Framing {
    None,
    Length(usize),
    Chunked,
    ToEof,
}

impl HttpDriver {
    /// Read one response head: (status, framing, server closes after it).
    fn head(&mut self) -> Result<(u16, Framing, bool)> {
        let addr = self.conn.addr;
        let l = self.conn.line()?;
        let status_line = &self.conn.buf[l];
        let mut parts = status_line.splitn(3, |&b| b == b' ');
        let version = parts.next().unwrap_or_default();
        let status = parts
            .next()
            .and_then(|s| std::str::from_utf8(s).ok())
            .and_then(|s| s.parse::<u16>().ok());
        let (Some(status), true) = (status, version.starts_with(b"HTTP/1.")) else {
            bail!(
                "malformed HTTP status line from {addr}: {}",
                excerpt(status_line)
            );
        };
        let http10 = version == b"HTTP/1.0";
        let mut length: Option<usize> = None;
        let mut chunked = false;
        let mut close = http10;
        let mut headers = 0;
        loop {
            let l = self.conn.line()?;
            let line = &self.conn.buf[l];
            if line.is_empty() {
                break;
            }
            headers += 1;
            if headers > MAX_HEADERS {
                bail!("more than {MAX_HEADERS} header lines in an HTTP response from {addr}");
            }
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                bail!("malformed HTTP header line from {addr}: {}", excerpt(line));
            };
            let name = &line[..colon];
            let value = String::from_utf8_lossy(&line[colon + 1..])
                .trim()
                .to_ascii_lowercase();
            if name.eq_ignore_ascii_case(b"content-length") {
                let n = value.parse::<usize>().ok().filter(|&n| n <= MAX_BODY);
                match (n, length) {
                    (Some(n), None) => length = Some(n),
                    (Some(n), Some(m)) if n == m => {}
                    _ => bail!(
                        "invalid or conflicting Content-Length from {addr}: {}",
                        excerpt(line)
                    ),
                }
            } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                let codings: Vec<&str> = value.split(',').map(str::trim).collect();
                if codings.iter().any(|c| *c != "chunked") || codings.last() != Some(&"chunked") {
                    bail!(
                        "unsupported Transfer-Encoding from {addr}: {value:?} (only chunked is \
                         decoded)"
                    );
                }
                chunked = true;
            } else if name.eq_ignore_ascii_case(b"connection") {
                for token in value.split(',').map(str::trim) {
                    match token {
                        "close" => close = true,
                        "keep-alive" if http10 => close = false,
                        _ => {}
                    }
                }
            }
        }
        let framing = if (100..200).contains(&status) || status == 204 || status == 304 {
            Framing::None
        } else if chunked {
            // Transfer-Encoding overrides Content-Length (RFC 9112 §6.3).
            Framing::Chunked
        } else if let Some(n) = length {
            Framing::Length(n)
        } else {
            close = true;
            Framing::ToEof
        };
        Ok((status, framing, close))
    }

    /// Read a chunked body into `self.body`.
    fn chunked_body(&mut self) -> Result<()> {
        let addr = self.conn.addr;
        self.body.clear();
        loop {
            let l = self.conn.line()?;
            let line = &self.conn.buf[l];
            let size = line.split(|&b| b == b';').next().unwrap_or_default();
            let size = std::str::from_utf8(size)
                .ok()
                .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
                .filter(|&n| n <= MAX_BODY);
            let Some(size) = size else {
                bail!("malformed chunk size line from {addr}: {}", excerpt(line));
            };
            if size == 0 {
                break;
            }
            if self.body.len() + size > MAX_BODY {
                bail!("a chunked body from {addr} is larger than {MAX_BODY} bytes");
            }
            let data = self.conn.take_crlf(size, "an HTTP chunk")?;
            self.body.extend_from_slice(&self.conn.buf[data]);
        }
        // Trailer fields, up to the empty line.
        for _ in 0..=MAX_HEADERS {
            let l = self.conn.line()?;
            if l.is_empty() {
                return Ok(());
            }
        }
        bail!("more than {MAX_HEADERS} trailer lines in a chunked body from {addr}")
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
        let (status, framing, close) = loop {
            let (status, framing, close) = self.head()?;
            if status == 101 {
                bail!("{} switched protocols (101) on a plain GET", self.conn.addr);
            }
            // Interim responses (100 Continue, 103 Early Hints) precede the real one.
            if !(100..200).contains(&status) {
                break (status, framing, close);
            }
        };
        let body_ok = match framing {
            Framing::None => matches_expect(&self.expect, b""),
            Framing::Length(n) => {
                let r = self.conn.take(n)?;
                matches_expect(&self.expect, &self.conn.buf[r])
            }
            Framing::Chunked => {
                self.chunked_body()?;
                matches_expect(&self.expect, &self.body)
            }
            Framing::ToEof => {
                let r = self.conn.take_to_eof()?;
                matches_expect(&self.expect, &self.conn.buf[r])
            }
        };
        if close {
            self.closed = true;
        }
        Ok(Outcome {
            kind: "GET",
            ok: status == 200 && body_ok,
        })
    }
}
