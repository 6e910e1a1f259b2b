//! The `replay` warm-up from outside: the configured request on a loopback connection of the
//! outside agent's own, its whole reply read before the worker goes on (as the agent's worker
//! does), so the server has finished the warm-up when the worker spins or sleeps again.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// How long a connection attempt may take (loopback: far less).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(200);

/// The `replay` warm-up: the request and the bytes its reply ends with.
#[derive(Debug, PartialEq, Eq)]
pub struct WarmUp {
    pub request: Vec<u8>,
    pub until: Vec<u8>,
}

/// A warm-up connection, opened on first use and again after the server closed it.
#[derive(Debug, Default)]
pub struct Conn {
    stream: Option<TcpStream>,
    buf: Vec<u8>,
    /// Connections opened (the first one included).
    pub opened: u64,
}

impl Conn {
    pub fn new() -> Conn {
        Conn {
            stream: None,
            buf: vec![0; 16 * 1024],
            opened: 0,
        }
    }

    /// Forget the connection (the next exchange opens another).
    pub fn drop_connection(&mut self) {
        self.stream = None;
    }

    /// Send `w.request` to `port` on 127.0.0.1 and read until the reply ends with `w.until`,
    /// within `timeout`. A connection the server closed since the last exchange (its reply said
    /// `Connection: close`, or a keep-alive timeout) is replaced once.
    pub fn exchange(&mut self, port: u16, w: &WarmUp, timeout: Duration) -> Result<()> {
        let reused = self.stream.is_some();
        match self.exchange_once(port, w, timeout) {
            Err(e) if reused && closed(&e) => {
                self.stream = None;
                self.exchange_once(port, w, timeout)
            }
            r => r,
        }
    }

    fn exchange_once(&mut self, port: u16, w: &WarmUp, timeout: Duration) -> Result<()> {
        if self.stream.is_none() {
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            let s = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
                .with_context(|| format!("connecting to {addr} for the warm-up"))?;
            s.set_nodelay(true)?;
            self.opened += 1;
            self.stream = Some(s);
        }
        let r = self.send_and_drain(w, timeout);
        if r.is_err() {
            self.stream = None;
        }
        r
    }

    fn send_and_drain(&mut self, w: &WarmUp, timeout: Duration) -> Result<()> {
        let Some(s) = self.stream.as_mut() else {
            bail!("no warm-up connection");
        };
        s.set_read_timeout(Some(timeout.max(Duration::from_micros(1))))?;
        s.write_all(&w.request).context("sending the warm-up")?;
        // Only the reply's tail matters: keep the last `until.len()` bytes seen.
        let mut tail: Vec<u8> = Vec::with_capacity(w.until.len() * 2);
        loop {
            let n = match s.read(&mut self.buf) {
                Ok(0) => bail!("the server closed the warm-up connection"),
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e).context("reading the warm-up's reply"),
            };
            tail.extend_from_slice(&self.buf[..n]);
            if tail.ends_with(&w.until) {
                return Ok(());
            }
            let keep = w.until.len();
            if tail.len() > keep {
                tail.drain(..tail.len() - keep);
            }
        }
    }
}

/// Whether `e` says the peer had closed the connection (worth one retry on a new one).
fn closed(e: &anyhow::Error) -> bool {
    if e.to_string().contains("closed the warm-up connection") {
        return true;
    }
    e.chain()
        .filter_map(|c| c.downcast_ref::<std::io::Error>())
        .any(|io| {
            matches!(
                io.kind(),
                ErrorKind::BrokenPipe | ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A server that answers each `ping\n` with `pong-end\n`, closing after `per_conn` replies.
    fn server(per_conn: usize, conns: usize) -> (u16, std::thread::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let h = std::thread::spawn(move || {
            for _ in 0..conns {
                let (mut c, _) = l.accept().unwrap();
                for _ in 0..per_conn {
                    let mut b = [0u8; 5];
                    if c.read_exact(&mut b).is_err() {
                        break;
                    }
                    // The reply in two writes: the tail spans reads.
                    c.write_all(b"po").unwrap();
                    c.write_all(b"ng-end\n").unwrap();
                }
            }
        });
        (port, h)
    }

    fn warm_up() -> WarmUp {
        WarmUp {
            request: b"ping\n".to_vec(),
            until: b"-end\n".to_vec(),
        }
    }

    #[test]
    fn keeps_one_connection_while_the_server_keeps_it() {
        let (port, h) = server(3, 1);
        let mut c = Conn::new();
        for _ in 0..3 {
            c.exchange(port, &warm_up(), Duration::from_secs(5))
                .unwrap();
        }
        assert_eq!(c.opened, 1);
        drop(c);
        h.join().unwrap();
    }

    #[test]
    fn opens_a_new_connection_after_the_server_closed_one() {
        let (port, h) = server(1, 3);
        let mut c = Conn::new();
        for _ in 0..3 {
            c.exchange(port, &warm_up(), Duration::from_secs(5))
                .unwrap();
        }
        assert_eq!(c.opened, 3);
        h.join().unwrap();
    }

    #[test]
    fn a_reply_that_never_ends_times_out() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let h = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut b = [0u8; 5];
            c.read_exact(&mut b).unwrap();
            c.write_all(b"partial").unwrap();
            std::thread::sleep(Duration::from_millis(300));
        });
        let mut c = Conn::new();
        let e = c
            .exchange(port, &warm_up(), Duration::from_millis(50))
            .unwrap_err();
        assert!(
            format!("{e:#}").contains("reading the warm-up's reply"),
            "{e:#}"
        );
        h.join().unwrap();
    }
}
