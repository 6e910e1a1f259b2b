//! redis RESP: `*2 $3 GET $n KEY` → bulk string `$LEN\r\n<LEN bytes>\r\n` or `$-1\r\n` (a miss).

use anyhow::{bail, Result};

use std::net::SocketAddr;

use super::conn::{conn_driver, excerpt, Conn, MAX_BODY};
use super::{Driver, Outcome, Protocol, Wait, WorkloadSpec};

/// A redis driver for `w` on `addr`.
pub(super) fn connect(addr: SocketAddr, w: &WorkloadSpec, wait: Wait) -> Result<Box<dyn Driver>> {
    let conn = Conn::open(addr, wait)?;
    Ok(Box::new(RedisDriver {
        request: resp_get(w.key.as_bytes()),
        expect: w.expect.clone(),
        conn,
    }))
}

/// A RESP `GET key` command.
pub(super) fn resp_get(key: &[u8]) -> Vec<u8> {
    let mut r = format!("*2\r\n$3\r\nGET\r\n${}\r\n", key.len()).into_bytes();
    r.extend_from_slice(key);
    r.extend_from_slice(b"\r\n");
    r
}

struct RedisDriver {
    conn: Conn,
    request: Vec<u8>,
    expect: Option<Vec<u8>>,
}

conn_driver!(RedisDriver, Protocol::Redis);

impl RedisDriver {
    /// Read one whole reply.
    fn parse(&mut self) -> Result<Outcome> {
        let l = self.conn.line()?;
        let line = &self.conn.buf[l];
        let ok = match line.first() {
            Some(b'$') => {
                let len = std::str::from_utf8(&line[1..])
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok());
                match len {
                    Some(-1) => self.expect.is_none(), // a miss
                    Some(n) if n >= 0 && n as u64 <= MAX_BODY as u64 => {
                        let data = self.conn.take_crlf(n as usize, "a redis bulk string")?;
                        match &self.expect {
                            Some(e) => self.conn.buf[data] == e[..],
                            None => true,
                        }
                    }
                    _ => bail!(
                        "malformed redis bulk header from {}: {}",
                        self.conn.addr,
                        excerpt(line)
                    ),
                }
            }
            // An error reply, or a simple string/integer where GET returns a bulk string:
            // complete, but wrong.
            Some(b'-' | b'+' | b':') => false,
            _ => bail!(
                "unexpected redis reply from {} (expected a bulk string): {}",
                self.conn.addr,
                excerpt(line)
            ),
        };
        Ok(Outcome { kind: "GET", ok })
    }
}
