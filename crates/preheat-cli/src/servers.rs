//! Servers preheat knows how to start, load and query: the bundled `preheat-kv` and memcached.
//! Any other server can be recorded with an explicit command, port and request.

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::launch::{Client, ServerSpec};
use crate::paths;

/// A request/response pair used for recording, measuring and warm-up replay.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The measured request.
    pub request: Vec<u8>,
    /// The reply ends with these bytes.
    pub until: Vec<u8>,
    /// An idempotent warm-up request for the `replay` strategy, and its reply terminator.
    pub replay: Vec<u8>,
    pub replay_until: Vec<u8>,
    /// Expected reply prefix (checked on every measured request).
    pub expect_prefix: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Known {
    /// The bundled epoll key-value server (memcached text protocol); needs no installs.
    Kv,
    /// memcached from the Debian package `memcached`.
    Memcached,
}

pub const ITEMS: usize = 1000;
pub const VALUE_SIZE: usize = 100;

impl Known {
    pub fn name(self) -> &'static str {
        match self {
            Known::Kv => "preheat-kv",
            Known::Memcached => "memcached",
        }
    }

    pub fn program(self) -> Result<PathBuf> {
        match self {
            Known::Kv => paths::kv_bin(),
            Known::Memcached => paths::find_program("memcached").ok_or_else(|| {
                anyhow::anyhow!("memcached is not installed: `apt-get install memcached` (or use the bundled server: --server kv)")
            }),
        }
    }

    /// The server command for `port` (single worker thread so the served core is predictable).
    pub fn spec(self, port: u16, cpus: Vec<usize>, agent: bool) -> Result<ServerSpec> {
        let prog = self.program()?.to_string_lossy().into_owned();
        let argv: Vec<String> = match self {
            Known::Kv => vec![
                prog,
                "--port".into(),
                port.to_string(),
                "--items".into(),
                ITEMS.to_string(),
                "--value-size".into(),
                VALUE_SIZE.to_string(),
                "--quiet".into(),
            ],
            Known::Memcached => vec![
                prog,
                "-p".into(),
                port.to_string(),
                "-l".into(),
                "127.0.0.1".into(),
                "-U".into(),
                "0".into(),
                "-t".into(),
                "1".into(),
                "-m".into(),
                "64".into(),
                "-u".into(),
                "root".into(),
                "-o".into(),
                "no_lru_crawler,no_lru_maintainer".into(),
            ],
        };
        let base = std::path::Path::new(&argv[0])
            .file_name()
            .map(|s| s.to_string_lossy().into_owned());
        Ok(ServerSpec {
            name: self.name().into(),
            argv,
            port,
            agent,
            cpus,
            env: vec![],
            agent_only: base,
        })
    }

    pub fn workload(self) -> Workload {
        let key = "key:42";
        Workload {
            request: format!("get {key}\r\n").into_bytes(),
            until: b"END\r\n".to_vec(),
            replay: b"get __preheat_warmup__\r\n".to_vec(),
            replay_until: b"END\r\n".to_vec(),
            expect_prefix: format!("VALUE {key} ").into_bytes(),
        }
    }

    /// Load the data set the workload reads (memcached starts empty; preheat-kv preloads).
    pub fn prepare(self, c: &mut Client) -> Result<()> {
        if self == Known::Memcached {
            for i in 0..ITEMS {
                let v = crate::servers::value_for(i);
                let req = format!("set key:{i} 0 0 {}\r\n{}\r\n", v.len(), v);
                let r = c.request(req.as_bytes(), b"\r\n")?;
                if r != b"STORED\r\n" {
                    bail!(
                        "memcached refused set key:{i}: {:?}",
                        String::from_utf8_lossy(r)
                    );
                }
            }
        }
        Ok(())
    }
}

/// Deterministic value for key index `i` (printable, VALUE_SIZE bytes).
pub fn value_for(i: usize) -> String {
    (0..VALUE_SIZE)
        .map(|j| (b'a' + ((i * 31 + j * 7) % 26) as u8) as char)
        .collect()
}
