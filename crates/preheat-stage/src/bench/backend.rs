//! The backend under test: the bundled preheat-kv or a `--backend-cmd`, started pinned and
//! wrapped so it dies with us; stopped on drop.

use std::ffi::OsString;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use preheat_engine::host::{find_program, free_port};

/// A backend process we started; stopped on drop.
pub(super) struct BackendProc {
    pub(super) child: Child,
    pub(super) ready_file: Option<PathBuf>,
}

impl Drop for BackendProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(f) = &self.ready_file {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// The bundled server: the launcher's companion lookup (`PREHEAT_KV_BIN`, or next to this
/// executable, built with cargo from this checkout when missing).
pub fn kv_binary() -> Result<PathBuf> {
    preheat_launch::paths::kv_bin()
}

/// Wraps a command so it dies with us (`setpriv --pdeathsig KILL`) and runs on `cpu`.
fn wrapped(program: OsString, args: Vec<OsString>, cpu: Option<usize>) -> Command {
    let mut argv: Vec<OsString> = Vec::new();
    if find_program("setpriv").is_some() {
        argv.extend(["setpriv", "--pdeathsig", "KILL"].map(OsString::from));
    }
    if let Some(cpu) = cpu {
        argv.extend([
            OsString::from("taskset"),
            "-c".into(),
            cpu.to_string().into(),
        ]);
    }
    argv.push(program);
    argv.extend(args);
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    cmd
}

pub(super) fn resolve(text: &str) -> Result<SocketAddr> {
    text.to_socket_addrs()
        .with_context(|| format!("resolving {text}"))?
        .next()
        .with_context(|| format!("{text}: no address"))
}

fn wait_connectable(addr: SocketAddr, child: &mut Child, stop: &AtomicBool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if preheat_engine::host::accepts_connections(addr, Duration::from_millis(200)) {
            return Ok(());
        }
        if let Some(st) = child.try_wait()? {
            bail!("the backend exited before accepting connections ({st})");
        }
        if Instant::now() > deadline || stop.load(Ordering::SeqCst) {
            bail!("the backend did not accept connections on {addr} within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts the bundled preheat-kv on a free port (reported through its ready file).
pub(super) fn start_kv(cpu: Option<usize>, stop: &AtomicBool) -> Result<(BackendProc, SocketAddr)> {
    let bin = kv_binary()?;
    let ready = std::env::temp_dir().join(format!(
        "preheat-stage-kv-{}-{}.ready",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    let args: Vec<OsString> = vec![
        "--port".into(),
        "0".into(),
        "--quiet".into(),
        "--ready-file".into(),
        ready.clone().into(),
    ];
    let child = wrapped(bin.clone().into(), args, cpu)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut proc = BackendProc {
        child,
        ready_file: Some(ready.clone()),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = std::fs::read_to_string(&ready) {
            if let Some(port) = text
                .strip_prefix("ready ")
                .and_then(|p| p.trim().parse::<u16>().ok())
            {
                return Ok((proc, SocketAddr::from(([127, 0, 0, 1], port))));
            }
        }
        if let Some(st) = proc.child.try_wait()? {
            bail!("preheat-kv exited at start ({st})");
        }
        if Instant::now() > deadline || stop.load(Ordering::SeqCst) {
            bail!("preheat-kv did not become ready within 10 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts `--backend-cmd` through `sh -c 'exec ...'`, `{port}` replaced by a free port.
pub(super) fn start_cmd(
    cmd: &str,
    backend: Option<&str>,
    cpu: Option<usize>,
    stop: &AtomicBool,
) -> Result<(BackendProc, SocketAddr)> {
    let (cmd, addr) = if cmd.contains("{port}") {
        let port = free_port()?;
        let addr = match backend {
            Some(b) => resolve(b)?,
            None => SocketAddr::from(([127, 0, 0, 1], port)),
        };
        (cmd.replace("{port}", &port.to_string()), addr)
    } else {
        let Some(b) = backend else {
            bail!("--backend-cmd needs a {{port}} placeholder or --backend ADDR to say where the backend listens");
        };
        (cmd.to_string(), resolve(b)?)
    };
    let child = wrapped(
        "sh".into(),
        vec!["-c".into(), format!("exec {cmd}").into()],
        cpu,
    )
    .spawn()
    .with_context(|| format!("starting backend command {cmd:?}"))?;
    let mut proc = BackendProc {
        child,
        ready_file: None,
    };
    wait_connectable(addr, &mut proc.child, stop)?;
    Ok((proc, addr))
}
