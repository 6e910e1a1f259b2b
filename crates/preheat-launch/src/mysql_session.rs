//! A MySQL session the agent can send warm-ups on: `replay` for MariaDB.
//!
//! A MySQL connection needs a handshake before any query, so the agent cannot open one itself
//! as it does for a text protocol. Here the caller opens it — the handshake as a user without a
//! password (the lab's MariaDB admits root so over TCP), then the warm-up's statements
//! prepared on it (`COM_STMT_PREPARE`, read-only statements only) — and the warm-up is fixed
//! bytes: one `COM_STMT_EXECUTE` per statement, pipelined in one write, the binary path the
//! real client's prepared transactions take. [`Session::learn`] runs it once and returns the
//! bytes its reply ends with (the last statement's final packet, which must occur nowhere else
//! in the reply), so the agent can tell when a warm-up has been answered. The connection is
//! then handed to the agent (`Request::ConfigureSession`).
//!
//! Only what this needs of the protocol (client/server protocol 4.1, no TLS, no compression,
//! `mysql_native_password` with an empty password, EOF packets): the framing and the packet
//! builders are pure functions, tested on bytes.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};

const CLIENT_LONG_PASSWORD: u32 = 0x1;
const CLIENT_CONNECT_WITH_DB: u32 = 0x8;
const CLIENT_PROTOCOL_41: u32 = 0x200;
const CLIENT_TRANSACTIONS: u32 = 0x2000;
const CLIENT_SECURE_CONNECTION: u32 = 0x8000;
const COM_STMT_PREPARE: u8 = 0x16;
const COM_STMT_EXECUTE: u8 = 0x17;
/// `utf8mb4_general_ci`.
const CHARSET: u8 = 45;
const TIMEOUT: Duration = Duration::from_secs(10);

/// One packet's header and payload: `len` (3 bytes, little endian), `seq`, payload.
pub fn packet(seq: u8, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut p = Vec::with_capacity(4 + payload.len());
    p.extend_from_slice(&len.to_le_bytes()[..3]);
    p.push(seq);
    p.extend_from_slice(payload);
    p
}

/// The handshake response (protocol 4.1) of `user` with an empty password, for `database`.
pub fn handshake_response(user: &str, database: &str) -> Vec<u8> {
    let caps = CLIENT_LONG_PASSWORD
        | CLIENT_CONNECT_WITH_DB
        | CLIENT_PROTOCOL_41
        | CLIENT_TRANSACTIONS
        | CLIENT_SECURE_CONNECTION;
    let mut p = Vec::new();
    p.extend_from_slice(&caps.to_le_bytes());
    p.extend_from_slice(&(16u32 << 20).to_le_bytes());
    p.push(CHARSET);
    p.extend_from_slice(&[0u8; 23]);
    p.extend_from_slice(user.as_bytes());
    p.push(0);
    p.push(0); // auth response: 0 bytes (no password)
    p.extend_from_slice(database.as_bytes());
    p.push(0);
    packet(1, &p)
}

/// `COM_STMT_EXECUTE` of statement `id` without parameters.
pub fn execute(id: u32) -> Vec<u8> {
    let mut p = vec![COM_STMT_EXECUTE];
    p.extend_from_slice(&id.to_le_bytes());
    p.push(0); // no cursor
    p.extend_from_slice(&1u32.to_le_bytes()); // iteration count
    packet(0, &p)
}

/// What a packet's first payload byte says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Ok,
    Err,
    /// An EOF packet (0xFE, payload shorter than 9 bytes).
    Eof,
    Other,
}

/// The kind of a payload.
pub fn kind(payload: &[u8]) -> Kind {
    match payload.first() {
        Some(0x00) => Kind::Ok,
        Some(0xff) => Kind::Err,
        Some(0xfe) if payload.len() < 9 => Kind::Eof,
        _ => Kind::Other,
    }
}

/// The message of an ERR payload (after the code and the SQL state).
pub fn error_message(payload: &[u8]) -> String {
    let code = payload
        .get(1..3)
        .map_or(0, |c| u16::from_le_bytes([c[0], c[1]]));
    let text = if payload.get(3) == Some(&b'#') {
        payload.get(9..).unwrap_or_default()
    } else {
        payload.get(3..).unwrap_or_default()
    };
    format!("MySQL error {code}: {}", String::from_utf8_lossy(text))
}

/// Where one execute's response ends in `packets` (starting at `from`): an OK or ERR packet,
/// or — for a result set — the EOF after its rows (the second EOF). `None`: incomplete.
pub fn response_end(packets: &[Vec<u8>], from: usize) -> Option<usize> {
    let first = packets.get(from)?;
    match kind(&first[4..]) {
        Kind::Ok | Kind::Err => Some(from + 1),
        _ => {
            let mut eofs = 0;
            for (i, p) in packets.iter().enumerate().skip(from + 1) {
                if kind(&p[4..]) == Kind::Eof {
                    eofs += 1;
                    if eofs == 2 {
                        return Some(i + 1);
                    }
                } else if kind(&p[4..]) == Kind::Err {
                    return Some(i + 1);
                }
            }
            None
        }
    }
}

/// A handshaken connection with its prepared warm-up statements.
pub struct Session {
    stream: TcpStream,
    ids: Vec<u32>,
}

impl Session {
    /// Connect to `addr` as `user` (no password), use `database`, prepare `statements`.
    pub fn open(addr: SocketAddr, user: &str, database: &str, statements: &[&str]) -> Result<Self> {
        let stream = TcpStream::connect_timeout(&addr, TIMEOUT)
            .with_context(|| format!("connecting to MySQL at {addr}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        let mut s = Session {
            stream,
            ids: Vec::new(),
        };
        let greeting = s.read_packet().context("reading the server's greeting")?;
        ensure!(
            greeting.get(4) == Some(&10),
            "not a MySQL protocol 10 greeting"
        );
        s.stream.write_all(&handshake_response(user, database))?;
        let mut reply = s.read_packet().context("reading the login's answer")?;
        if reply.get(4) == Some(&0xfe) {
            // An authentication method switch: the answer for an empty password is empty too.
            s.stream.write_all(&packet(reply[3].wrapping_add(1), &[]))?;
            reply = s.read_packet()?;
        }
        match kind(&reply[4..]) {
            Kind::Ok => {}
            Kind::Err => bail!("logging in as {user}: {}", error_message(&reply[4..])),
            _ => bail!("logging in as {user}: an answer neither OK nor an error"),
        }
        for sql in statements {
            let id = s
                .prepare(sql)
                .with_context(|| format!("preparing {sql:?}"))?;
            s.ids.push(id);
        }
        Ok(s)
    }

    fn read_packet(&mut self) -> Result<Vec<u8>> {
        let mut h = [0u8; 4];
        self.stream.read_exact(&mut h)?;
        let len = u32::from_le_bytes([h[0], h[1], h[2], 0]) as usize;
        let mut p = h.to_vec();
        p.resize(4 + len, 0);
        self.stream.read_exact(&mut p[4..])?;
        Ok(p)
    }

    fn prepare(&mut self, sql: &str) -> Result<u32> {
        let mut cmd = vec![COM_STMT_PREPARE];
        cmd.extend_from_slice(sql.as_bytes());
        self.stream.write_all(&packet(0, &cmd))?;
        let ok = self.read_packet()?;
        let p = &ok[4..];
        if kind(p) == Kind::Err {
            bail!("{}", error_message(p));
        }
        ensure!(
            p.len() >= 12 && p[0] == 0,
            "an unexpected answer to a prepare"
        );
        let id = u32::from_le_bytes([p[1], p[2], p[3], p[4]]);
        let columns = u16::from_le_bytes([p[5], p[6]]);
        let params = u16::from_le_bytes([p[7], p[8]]);
        ensure!(params == 0, "a warm-up statement must have no parameters");
        if columns > 0 {
            // The column definitions, then an EOF.
            for _ in 0..=columns {
                self.read_packet()?;
            }
        }
        Ok(id)
    }

    /// The warm-up's bytes: an execute of every prepared statement, pipelined.
    pub fn request(&self) -> Vec<u8> {
        self.ids.iter().flat_map(|&id| execute(id)).collect()
    }

    /// Send the warm-up once and read its whole reply; the bytes it ends with (its last
    /// packet), which must occur only there. An error reply or an ambiguous end fails.
    pub fn learn(&mut self) -> Result<Vec<u8>> {
        self.stream.write_all(&self.request())?;
        let mut packets = Vec::new();
        let mut at = 0;
        for _ in 0..self.ids.len() {
            let end = loop {
                if let Some(e) = response_end(&packets, at) {
                    break e;
                }
                packets.push(self.read_packet()?);
            };
            if let Some(err) = packets[at..end].iter().find(|p| kind(&p[4..]) == Kind::Err) {
                bail!("the warm-up failed: {}", error_message(&err[4..]));
            }
            at = end;
        }
        let all: Vec<u8> = packets.concat();
        let until = packets.last().context("no reply")?.clone();
        let occurrences = all.windows(until.len()).filter(|w| *w == until).count();
        ensure!(
            occurrences == 1,
            "the warm-up's last reply packet occurs {occurrences} times in its reply: its end \
             cannot be told"
        );
        Ok(until)
    }

    /// The connection, to hand to the agent.
    pub fn into_stream(self) -> TcpStream {
        self.stream
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_have_a_little_endian_length_and_a_sequence() {
        assert_eq!(packet(3, b"ab"), vec![2, 0, 0, 3, b'a', b'b']);
        let e = execute(0x0102_0304);
        assert_eq!(e, vec![10, 0, 0, 0, 0x17, 4, 3, 2, 1, 0, 1, 0, 0, 0]);
    }

    #[test]
    fn the_handshake_response_logs_in_without_a_password() {
        let r = handshake_response("root", "tpcc");
        assert_eq!(r[3], 1, "sequence 1, after the greeting");
        let p = &r[4..];
        let caps = u32::from_le_bytes([p[0], p[1], p[2], p[3]]);
        assert!(caps & CLIENT_PROTOCOL_41 != 0 && caps & CLIENT_CONNECT_WITH_DB != 0);
        assert_eq!(&p[32..], b"root\0\0tpcc\0");
        assert_eq!(u32::from_le_bytes([r[0], r[1], r[2], 0]) as usize, p.len());
    }

    #[test]
    fn a_response_ends_at_ok_err_or_the_eof_after_the_rows() {
        let ok = packet(1, &[0, 0, 0, 2, 0, 0, 0]);
        let err = packet(
            1,
            &[0xff, 0x28, 0x04, b'#', b'4', b'2', b'0', b'0', b'0', b'x'],
        );
        let eof = |seq| packet(seq, &[0xfe, 0, 0, 2, 0]);
        let set = vec![
            packet(1, &[1]),
            packet(2, b"coldef"),
            eof(3),
            packet(4, &[0, 0, 1]),
            eof(5),
        ];
        assert_eq!(response_end(std::slice::from_ref(&ok), 0), Some(1));
        assert_eq!(response_end(std::slice::from_ref(&err), 0), Some(1));
        assert_eq!(response_end(&set, 0), Some(5));
        assert_eq!(response_end(&set[..4], 0), None);
        let two = [set.clone(), vec![ok.clone()]].concat();
        assert_eq!(response_end(&two, 5), Some(6));
        assert_eq!(kind(&err[4..]), Kind::Err);
        assert_eq!(error_message(&err[4..]), "MySQL error 1064: x");
        // A row that starts with 0xfe but is long is no EOF.
        assert_eq!(kind(&[0xfe, 1, 2, 3, 4, 5, 6, 7, 8, 9]), Kind::Other);
    }
}
