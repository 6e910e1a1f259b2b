//! The memcached text protocol: `get KEY\r\n` → `VALUE KEY FLAGS LEN\r\n<LEN bytes>\r\nEND\r\n`
//! or `END\r\n` (a miss).

use anyhow::{bail, Result};

use std::net::SocketAddr;

use super::conn::{conn_driver, excerpt, Conn, MAX_BODY};
use super::{Driver, Outcome, Protocol, Wait, WorkloadSpec};

/// A memcached driver for `w` on `addr`.
pub(super) fn connect(addr: SocketAddr, w: &WorkloadSpec, wait: Wait) -> Result<Box<dyn Driver>> {
    check_memcached_key(&w.key)?;
    let conn = Conn::open(addr, wait)?;
    Ok(Box::new(MemcachedDriver {
        request: get(&w.key),
        key: w.key.clone().into_bytes(),
        expect: w.expect.clone(),
        conn,
    }))
}

/// A memcached `get key` command.
pub(super) fn get(key: &str) -> Vec<u8> {
    format!("get {key}\r\n").into_bytes()
}

fn check_memcached_key(key: &str) -> Result<()> {
    if key.is_empty()
        || key.len() > 250
        || key
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        bail!(
            "invalid memcached key {key:?}: 1..250 bytes without whitespace or control characters"
        );
    }
    Ok(())
}

struct MemcachedDriver {
    conn: Conn,
    request: Vec<u8>,
    key: Vec<u8>,
    expect: Option<Vec<u8>>,
}

conn_driver!(MemcachedDriver, Protocol::Memcached);

impl MemcachedDriver {
    /// Read one whole reply.
    fn parse(&mut self) -> Result<Outcome> {
        let mut ok = true;
        let mut values = 0u32;
        loop {
            let l = self.conn.line()?;
            let line = &self.conn.buf[l];
            if line == b"END" {
                break;
            }
            if let Some(rest) = line.strip_prefix(b"VALUE ") {
                // VALUE <key> <flags> <bytes> [<cas unique>]
                let mut fields = rest.split(|&b| b == b' ').filter(|f| !f.is_empty());
                let key = fields.next();
                let _flags = fields.next();
                let len = fields
                    .next()
                    .and_then(|f| std::str::from_utf8(f).ok())
                    .and_then(|f| f.parse::<usize>().ok())
                    .filter(|&n| n <= MAX_BODY);
                let Some(len) = len else {
                    bail!(
                        "malformed memcached VALUE line from {}: {}",
                        self.conn.addr,
                        excerpt(line)
                    );
                };
                if key != Some(self.key.as_slice()) {
                    ok = false;
                }
                let data = self.conn.take_crlf(len, "a memcached value")?;
                values += 1;
                if let Some(e) = &self.expect {
                    if self.conn.buf[data] != e[..] {
                        ok = false;
                    }
                }
                continue;
            }
            if line == b"ERROR"
                || line.starts_with(b"CLIENT_ERROR")
                || line.starts_with(b"SERVER_ERROR")
            {
                // A complete, but failed, reply.
                return Ok(Outcome {
                    kind: "get",
                    ok: false,
                });
            }
            bail!(
                "unexpected memcached reply line from {}: {}",
                self.conn.addr,
                excerpt(line)
            );
        }
        if values > 1 || (self.expect.is_some() && values == 0) {
            ok = false;
        }
        Ok(Outcome { kind: "get", ok })
    }
}
