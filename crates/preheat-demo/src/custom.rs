//! Any server in the demo: a command given after `--`, its port and protocol, and the request to
//! measure. The workload is built from one real exchange with the server, so the agent's own
//! requests (the probe's, `replay`'s) know the exact reply: HTTP and RESP replies are framed by
//! their length (`preheat-http` for HTTP), never by guessing their last bytes.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use preheat_engine::netns::VethHost;
use preheat_lab::driver::{http_path, Protocol, WorkloadSpec};

use preheat_launch::launch::{self, Server, ServerSpec};
use preheat_launch::servers::Workload;

/// The protocol of a server given by its command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CustomProtocol {
    /// HTTP/1.1 GET of the request's path (keep-alive).
    Http,
    /// memcached text protocol: `get KEY`.
    Memcached,
    /// redis RESP: `GET KEY`.
    Redis,
    /// Raw bytes (\r \n escapes); the reply ends with the `until` bytes.
    Raw,
}

/// What the demo needs to start and query a server given by its command.
pub(crate) struct CustomServer<'a> {
    pub command: &'a [String],
    pub port: Option<u16>,
    pub protocol: CustomProtocol,
    pub request: Option<&'a str>,
    pub until: &'a str,
}

/// How long a server given by its command gets to listen on its port.
const START_TIMEOUT: Duration = Duration::from_secs(20);

impl CustomServer<'_> {
    /// Start the server pinned to `cpus`, with the agent attached if `agent` (in `netns` if
    /// given: it must listen on 0.0.0.0 or the namespace's address there), and learn its
    /// workload.
    pub fn start(
        &self,
        dir: &Path,
        cpus: Vec<usize>,
        netns: Option<Arc<VethHost>>,
        agent: bool,
    ) -> Result<(Server, Workload)> {
        let Some(port) = self.port else {
            bail!("a server given by its command needs --port (the port it listens on)");
        };
        let Some(request) = self.request else {
            bail!(
                "a server given by its command needs --request (an HTTP path, a memcached or \
                 redis key, or raw request bytes with --protocol raw)"
            );
        };
        let name = Path::new(&self.command[0])
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "server".into());
        let spec = ServerSpec {
            name,
            argv: self.command.to_vec(),
            port,
            agent,
            cpus,
            env: vec![],
            agent_only: None,
            netns,
        };
        let server = launch::start(spec, &preheat_launch::paths::run_dir(), dir, START_TIMEOUT)?;
        let w = self.workload(server.addr(), request)?;
        Ok((server, w))
    }

    fn workload(&self, addr: SocketAddr, request: &str) -> Result<Workload> {
        let spec = |protocol, key: String, expect: Option<Vec<u8>>| WorkloadSpec {
            protocol,
            key,
            expect,
            tpcc: None,
        };
        Ok(match self.protocol {
            CustomProtocol::Raw => Workload::custom(
                launch::unescape(request).into_bytes(),
                launch::unescape(self.until).into_bytes(),
            ),
            CustomProtocol::Memcached => {
                Workload::of_spec(spec(Protocol::Memcached, request.into(), None))
            }
            CustomProtocol::Redis => {
                let value = fetch_redis(addr, request)?;
                Workload::of_spec(spec(Protocol::Redis, request.into(), Some(value)))
            }
            CustomProtocol::Http => {
                let path = http_path(request);
                let body = fetch_http(addr, &path)?;
                if body.is_empty() {
                    bail!(
                        "GET {path} from {addr} returned an empty body: the demo needs a reply it \
                         can check (choose a path with content)"
                    );
                }
                let mut w = Workload::of_spec(spec(Protocol::Http, path, Some(body)));
                // The catalog's warm-up path exists only on the catalog's site: on any other
                // server the warm-up is the measured GET itself (idempotent), so the agent's
                // replay reply is one it can frame.
                if let Some(r) = w.raw.as_mut() {
                    r.replay = r.request.clone();
                    r.replay_until = r.until.clone();
                }
                w
            }
        })
    }
}

/// Read from `s` until `done(buf)` says the reply is complete (or the peer closes).
fn read_reply(
    s: &mut TcpStream,
    addr: SocketAddr,
    mut done: impl FnMut(&[u8]) -> Result<bool>,
) -> Result<Vec<u8>> {
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if done(&buf)? {
            return Ok(buf);
        }
        if Instant::now() > deadline {
            bail!("no complete reply from {addr} within 10 s");
        }
        let n = s
            .read(&mut chunk)
            .with_context(|| format!("reading a reply from {addr}"))?;
        if n == 0 {
            return Ok(buf);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The body of `GET path` (the first exchange with the server, which also checks it speaks
/// HTTP/1.x): status 200 required.
fn fetch_http(addr: SocketAddr, path: &str) -> Result<Vec<u8>> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .with_context(|| format!("connecting to {addr}"))?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())?;
    let limits = preheat_http::Limits::default();
    let mut framed = None;
    let buf = read_reply(&mut s, addr, |b| {
        framed = preheat_http::response_len(b, false, &limits)
            .map_err(|e| anyhow::anyhow!("{addr} did not answer HTTP/1.x: {e}"))?;
        Ok(framed.is_some())
    })?;
    let r = match framed {
        Some(r) => r,
        // A body that runs until the close: the buffer is the whole reply.
        None => match preheat_http::response_head(&buf, false, limits.max_head)
            .map_err(|e| anyhow::anyhow!("{addr} did not answer HTTP/1.x: {e}"))?
        {
            Some(h) if h.body == preheat_http::Body::UntilClose => preheat_http::FramedResponse {
                len: buf.len(),
                payload: buf[h.len..].to_vec(),
                head: h,
            },
            _ => bail!("{addr} closed the connection before the reply to GET {path} was complete"),
        },
    };
    if r.head.status != 200 {
        bail!(
            "GET {path} from {addr} answered status {} (the demo measures a request that \
             succeeds: choose a path that exists)",
            r.head.status
        );
    }
    Ok(r.payload)
}

/// The value of `GET key` over RESP (a miss is an error: the demo measures a hit).
fn fetch_redis(addr: SocketAddr, key: &str) -> Result<Vec<u8>> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .with_context(|| format!("connecting to {addr}"))?;
    s.write_all(format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len()).as_bytes())?;
    let mut value = None;
    read_reply(&mut s, addr, |b| {
        let Some(end) = b.windows(2).position(|w| w == b"\r\n") else {
            return Ok(false);
        };
        let head = std::str::from_utf8(&b[..end]).unwrap_or("");
        let Some(len) = head.strip_prefix('$') else {
            bail!("{addr} did not answer RESP: {head:?}");
        };
        let len: i64 = len
            .parse()
            .map_err(|_| anyhow::anyhow!("{addr}: malformed RESP length {head:?}"))?;
        if len < 0 {
            bail!("redis at {addr} has no key {key:?} (the demo measures a hit)");
        }
        let need = end + 2 + len as usize + 2;
        if b.len() < need {
            return Ok(false);
        }
        value = Some(b[end + 2..end + 2 + len as usize].to_vec());
        Ok(true)
    })?;
    value.with_context(|| format!("{addr} closed the connection before answering GET {key}"))
}
