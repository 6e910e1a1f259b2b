//! Executing one parsed request against the store: the replies (memcached's text protocol,
//! byte for byte where the bundled server implements a command) and the `stats` counters.

use std::fmt::Display;
use std::io::Write as _;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::limits::{MAX_CONNS, MAX_GET_RESPONSE};
use crate::protocol::Request;
use crate::store::{Lookup, Store};

/// The version `version` and `stats` report.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Counters reported by `stats`.
#[derive(Debug)]
pub struct Stats {
    started: Instant,
    pub(crate) curr_connections: u64,
    pub(crate) total_connections: u64,
    pub(crate) rejected_connections: u64,
    cmd_get: u64,
    cmd_set: u64,
    cmd_flush: u64,
    get_hits: u64,
    get_misses: u64,
    get_expired: u64,
    delete_hits: u64,
    delete_misses: u64,
    total_items: u64,
    pub(crate) bytes_read: u64,
    pub(crate) bytes_written: u64,
}

impl Default for Stats {
    fn default() -> Self {
        Self::new()
    }
}

impl Stats {
    pub fn new() -> Stats {
        Stats {
            started: Instant::now(),
            curr_connections: 0,
            total_connections: 0,
            rejected_connections: 0,
            cmd_get: 0,
            cmd_set: 0,
            cmd_flush: 0,
            get_hits: 0,
            get_misses: 0,
            get_expired: 0,
            delete_hits: 0,
            delete_misses: 0,
            total_items: 0,
            bytes_read: 0,
            bytes_written: 0,
        }
    }

    /// `stats reset`: zero the cumulative counters (not the current ones).
    fn reset(&mut self) {
        let (started, curr) = (self.started, self.curr_connections);
        *self = Stats::new();
        self.started = started;
        self.curr_connections = curr;
    }
}

/// What the connection must do after a request was executed.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    Continue,
    /// Discard this many upcoming input bytes (an oversized `set` payload).
    Swallow(usize),
    /// Flush pending replies, then close.
    Quit,
}

/// Executes one request against the store, appending the reply to `out`.
pub fn execute(req: Request<'_>, store: &mut Store, stats: &mut Stats, out: &mut Vec<u8>) -> Next {
    let reply = |out: &mut Vec<u8>, noreply: bool, line: &str| {
        if !noreply {
            out.extend_from_slice(line.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    };
    match req {
        Request::Get(keys) => {
            let start = out.len();
            for key in keys.iter() {
                stats.cmd_get += 1;
                match store.get(key) {
                    Lookup::Hit(item) => {
                        stats.get_hits += 1;
                        out.extend_from_slice(b"VALUE ");
                        out.extend_from_slice(key);
                        let _ = write!(out, " {} {}\r\n", item.flags, item.data.len());
                        out.extend_from_slice(&item.data);
                        out.extend_from_slice(b"\r\n");
                        if out.len() - start > MAX_GET_RESPONSE {
                            out.truncate(start);
                            reply(
                                out,
                                false,
                                "SERVER_ERROR out of memory writing get response",
                            );
                            return Next::Continue;
                        }
                    }
                    Lookup::Expired => {
                        stats.get_expired += 1;
                        stats.get_misses += 1;
                        store.remove_expired(key);
                    }
                    Lookup::Miss => stats.get_misses += 1,
                }
            }
            out.extend_from_slice(b"END\r\n");
        }
        Request::Set {
            key,
            flags,
            exptime,
            data,
            noreply,
        } => {
            stats.cmd_set += 1;
            stats.total_items += 1;
            store.set(key, flags, exptime, data);
            reply(out, noreply, "STORED");
        }
        Request::SetTooLarge {
            key,
            swallow,
            noreply,
        } => {
            // Like memcached: a failed set must not leave the old value behind.
            store.delete(key);
            reply(out, noreply, "SERVER_ERROR object too large for cache");
            return Next::Swallow(swallow);
        }
        Request::BadDataChunk { noreply } => {
            stats.cmd_set += 1;
            reply(out, noreply, "CLIENT_ERROR bad data chunk");
        }
        Request::Delete { key, noreply } => {
            if store.delete(key) {
                stats.delete_hits += 1;
                reply(out, noreply, "DELETED");
            } else {
                stats.delete_misses += 1;
                reply(out, noreply, "NOT_FOUND");
            }
        }
        Request::FlushAll { delay, noreply } => {
            stats.cmd_flush += 1;
            store.flush(delay);
            reply(out, noreply, "OK");
        }
        Request::Stats => write_stats(out, store, stats),
        Request::StatsReset => {
            stats.reset();
            reply(out, false, "RESET");
        }
        Request::Version => reply(out, false, &format!("VERSION preheat-kv {VERSION}")),
        Request::Quit => return Next::Quit,
        Request::Error {
            reply: line,
            noreply,
        } => reply(out, noreply, line),
    }
    Next::Continue
}

fn write_stats(out: &mut Vec<u8>, store: &Store, stats: &Stats) {
    let mut stat = |name: &str, value: &dyn Display| {
        let _ = write!(out, "STAT {name} {value}\r\n");
    };
    let unix_now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    stat("pid", &std::process::id());
    stat("uptime", &stats.started.elapsed().as_secs());
    stat("time", &unix_now);
    stat("version", &VERSION);
    stat("pointer_size", &(usize::BITS));
    stat("max_connections", &MAX_CONNS);
    stat("curr_connections", &stats.curr_connections);
    stat("total_connections", &stats.total_connections);
    stat("rejected_connections", &stats.rejected_connections);
    stat("cmd_get", &stats.cmd_get);
    stat("cmd_set", &stats.cmd_set);
    stat("cmd_flush", &stats.cmd_flush);
    stat("get_hits", &stats.get_hits);
    stat("get_misses", &stats.get_misses);
    stat("get_expired", &stats.get_expired);
    stat("delete_misses", &stats.delete_misses);
    stat("delete_hits", &stats.delete_hits);
    stat("bytes_read", &stats.bytes_read);
    stat("bytes_written", &stats.bytes_written);
    stat("threads", &1);
    stat("bytes", &store.bytes());
    stat("curr_items", &store.len());
    stat("total_items", &stats.total_items);
    stat("evictions", &0);
    out.extend_from_slice(b"END\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{self, Parse};

    /// Feeds `input` through the parser and executor like a connection does.
    fn run(store: &mut Store, stats: &mut Stats, input: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut pos = 0;
        let mut swallow = 0;
        for _ in 0..input.len() + 1 {
            let skip = swallow.min(input.len() - pos);
            pos += skip;
            swallow -= skip;
            match protocol::parse(&input[pos..]) {
                Parse::Complete { request, consumed } => {
                    pos += consumed;
                    match execute(request, store, stats, &mut out) {
                        Next::Continue => {}
                        Next::Swallow(n) => swallow = n,
                        Next::Quit => break,
                    }
                }
                _ => break,
            }
        }
        out
    }

    fn fresh() -> (Store, Stats) {
        (Store::new(), Stats::new())
    }

    #[test]
    fn replies_are_memcached_compatible() {
        let (mut store, mut stats) = fresh();
        let out = run(
            &mut store,
            &mut stats,
            b"get a\r\nset a 9 0 3\r\nabc\r\nget a b a\r\ndelete a\r\ndelete a\r\n\
              set n 0 0 1 noreply\r\nx\r\nflush_all\r\nget n\r\nnope\r\n",
        );
        let expected: &[u8] =
            b"END\r\nSTORED\r\nVALUE a 9 3\r\nabc\r\nVALUE a 9 3\r\nabc\r\nEND\r\n\
              DELETED\r\nNOT_FOUND\r\nOK\r\nEND\r\nERROR\r\n";
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(expected)
        );
        assert_eq!((stats.cmd_get, stats.get_hits, stats.get_misses), (5, 2, 3));
        assert_eq!(
            (stats.cmd_set, stats.delete_hits, stats.delete_misses),
            (2, 1, 1)
        );
    }

    #[test]
    fn version_and_stats() {
        let (mut store, mut stats) = fresh();
        store.preload(3, 10);
        let out = run(&mut store, &mut stats, b"version\r\nget key:1\r\nstats\r\n");
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with(&format!("VERSION preheat-kv {VERSION}\r\n")));
        assert!(text.contains("STAT curr_items 3\r\n"));
        assert!(text.contains("STAT get_hits 1\r\n"));
        assert!(text.contains("STAT cmd_get 1\r\n"));
        assert!(text.ends_with("STAT evictions 0\r\nEND\r\n"));
        let out = run(&mut store, &mut stats, b"stats reset\r\n");
        assert_eq!(out, b"RESET\r\n");
        assert_eq!(stats.cmd_get, 0);
    }

    #[test]
    fn too_large_set_swallows_payload_and_drops_old_value() {
        let (mut store, mut stats) = fresh();
        store.set(b"k", 0, 0, b"old");
        let size = protocol::MAX_VALUE_LEN + 1;
        let mut input = format!("set k 0 0 {size}\r\n").into_bytes();
        input.resize(input.len() + size, b'z');
        input.extend_from_slice(b"\r\nget k\r\n");
        let out = run(&mut store, &mut stats, &input);
        assert_eq!(out, b"SERVER_ERROR object too large for cache\r\nEND\r\n");
    }

    #[test]
    fn oversized_get_reply_is_refused() {
        let (mut store, mut stats) = fresh();
        store.set(b"big", 1, 0, &vec![b'x'; protocol::MAX_VALUE_LEN]);
        let n = MAX_GET_RESPONSE / protocol::MAX_VALUE_LEN + 1;
        let line = format!("get{}\r\nget big\r\n", " big".repeat(n));
        let out = run(&mut store, &mut stats, line.as_bytes());
        let error: &[u8] = b"SERVER_ERROR out of memory writing get response\r\n";
        let next = format!("VALUE big 1 {}\r\n", protocol::MAX_VALUE_LEN);
        assert!(out.starts_with(error));
        assert!(out[error.len()..].starts_with(next.as_bytes()));
    }

    #[test]
    fn noreply_suppresses_errors_too() {
        let (mut store, mut stats) = fresh();
        let out = run(
            &mut store,
            &mut stats,
            b"set k 0 0 2 noreply\r\nabc\r\nset k x 0 1 noreply\r\ndelete k noreply\r\nget k\r\n",
        );
        // "abc\r\n" is a bad chunk ("ab" + "c\r"); the "\n" left over is an
        // empty command line, which gets ERROR.
        assert_eq!(out, b"ERROR\r\nEND\r\n");
    }
}
