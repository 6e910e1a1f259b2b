//! Running a server under phtrace and reading its busy periods as they are written.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::dump::{parse_dump, BusyPeriod};
use crate::tool::{ensure_tool, TOOL_NAME};
use crate::TraceError;

/// Soft and hard `RLIMIT_NOFILE` the server is started with (when `prlimit` exists): Valgrind
/// reserves descriptors just below the soft limit and misbehaves with very large hard limits.
const NOFILE_SOFT: u64 = 1024;
const NOFILE_HARD: u64 = 20000;

/// How to run the traced server.
#[derive(Debug, Clone, Default)]
pub struct TraceOptions {
    /// Record everything (`--phtrace-all=yes`): each thread's execution is cut into records at
    /// every event-wait system call entry, start-up included, instead of busy periods only.
    pub all: bool,
    /// Directory for `trace.bin` and `valgrind.log`, kept after [`TracedServer::stop`]. `None`:
    /// a fresh temporary directory, removed when the [`TracedServer`] is dropped or stopped.
    pub work_dir: Option<PathBuf>,
    /// Extra Valgrind core options, placed before the client command.
    pub valgrind_args: Vec<String>,
    /// Extra environment variables for the server.
    pub env: Vec<(String, String)>,
}

/// A server running under `valgrind --tool=phtrace`.
#[derive(Debug)]
pub struct TracedServer {
    child: Child,
    _tmp: Option<tempfile::TempDir>,
    dir: PathBuf,
    trace_path: PathBuf,
    log_path: PathBuf,
    read_offset: u64,
    pending: Vec<u8>,
    stopped: bool,
}

/// Current (soft, hard) `RLIMIT_NOFILE` from `/proc/self/limits`.
fn nofile_limits() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    let mut f = line["Max open files".len()..].split_whitespace();
    let parse = |s: &str| {
        if s == "unlimited" {
            Some(u64::MAX)
        } else {
            s.parse().ok()
        }
    };
    Some((parse(f.next()?)?, parse(f.next()?)?))
}

impl TracedServer {
    /// Start `cmd` (program and arguments) under phtrace, building the tool first if needed.
    ///
    /// Valgrind's own output and the server's stdout/stderr go to `valgrind.log` in the work
    /// directory; records are appended to `trace.bin` there. Valgrind takes seconds to start:
    /// wait for the server's own readiness signal before sending requests.
    pub fn spawn(cmd: &[String], opts: &TraceOptions) -> Result<TracedServer, TraceError> {
        if cmd.is_empty() {
            return Err(TraceError::io(
                "starting a traced server",
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command"),
            ));
        }
        let tool = ensure_tool()?;
        let (tmp, dir) = match &opts.work_dir {
            Some(d) => {
                std::fs::create_dir_all(d)
                    .map_err(|e| TraceError::io(format!("creating {}", d.display()), e))?;
                (None, d.clone())
            }
            None => {
                let t = tempfile::Builder::new()
                    .prefix("preheat-trace-")
                    .tempdir()
                    .map_err(|e| TraceError::io("creating a temporary directory", e))?;
                let p = t.path().to_path_buf();
                (Some(t), p)
            }
        };
        let trace_path = dir.join("trace.bin");
        let log_path = dir.join("valgrind.log");
        // A stale trace from an earlier run must not be read as this run's.
        match std::fs::remove_file(&trace_path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(TraceError::io(
                    format!("removing {}", trace_path.display()),
                    e,
                ))
            }
            _ => {}
        }
        let log = File::create(&log_path)
            .map_err(|e| TraceError::io(format!("creating {}", log_path.display()), e))?;
        let log2 = log
            .try_clone()
            .map_err(|e| TraceError::io("duplicating the log file", e))?;

        let mut valgrind_cmd: Vec<std::ffi::OsString> = vec![
            tool.valgrind.clone().into(),
            format!("--tool={TOOL_NAME}").into(),
            {
                let mut s = std::ffi::OsString::from("--phtrace-out=");
                s.push(&trace_path);
                s
            },
        ];
        if opts.all {
            valgrind_cmd.push("--phtrace-all=yes".into());
        }
        valgrind_cmd.extend(opts.valgrind_args.iter().map(Into::into));
        valgrind_cmd.extend(cmd.iter().map(Into::into));

        let wrap = match (
            preheat_engine::host::find_program("prlimit"),
            nofile_limits(),
        ) {
            (Some(p), Some((soft, hard))) if soft > NOFILE_SOFT || hard > NOFILE_HARD => {
                let hard = hard.min(NOFILE_HARD);
                Some((p, NOFILE_SOFT.min(hard), hard))
            }
            _ => None,
        };
        let mut command = match wrap {
            Some((prlimit, soft, hard)) => {
                let mut c = Command::new(prlimit);
                c.arg(format!("--nofile={soft}:{hard}")).arg("--");
                c.args(&valgrind_cmd);
                c
            }
            None => {
                let mut c = Command::new(&valgrind_cmd[0]);
                c.args(&valgrind_cmd[1..]);
                c
            }
        };
        command
            .env("VALGRIND_LIB", &tool.lib_dir)
            .envs(opts.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        let child = command
            .spawn()
            .map_err(|e| TraceError::io(format!("starting valgrind for {}", cmd.join(" ")), e))?;
        Ok(TracedServer {
            child,
            _tmp: tmp,
            dir,
            trace_path,
            log_path,
            read_offset: 0,
            pending: Vec::new(),
            stopped: false,
        })
    }

    /// The Valgrind process's pid; the server's mappings are in `/proc/<pid>/maps` (`prlimit`
    /// and the `valgrind` launcher exec, so the pid stays the same).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The work directory (holds `trace.bin` and `valgrind.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The dump file phtrace appends to.
    pub fn trace_path(&self) -> &Path {
        &self.trace_path
    }

    /// Valgrind's log, which also receives the server's stdout and stderr.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The log's text so far (for diagnostics).
    pub fn log(&self) -> String {
        std::fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Whether the server is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Records appended since the last call, in file order. A partially written trailing record
    /// is kept and returned by a later call once complete.
    pub fn read_new_periods(&mut self) -> Result<Vec<BusyPeriod>, TraceError> {
        let mut f = match File::open(&self.trace_path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(TraceError::io(
                    format!("opening {}", self.trace_path.display()),
                    e,
                ))
            }
        };
        let ctx = || format!("reading {}", self.trace_path.display());
        f.seek(SeekFrom::Start(self.read_offset))
            .map_err(|e| TraceError::io(ctx(), e))?;
        let n = f
            .read_to_end(&mut self.pending)
            .map_err(|e| TraceError::io(ctx(), e))?;
        self.read_offset += n as u64;
        let (periods, used) = parse_dump(&self.pending)?;
        self.pending.drain(..used);
        Ok(periods)
    }

    /// Stop the server: SIGTERM, wait up to 10 s, then SIGKILL.
    pub fn stop(mut self) {
        self.shutdown(Duration::from_secs(10));
    }

    /// Stop the server like [`stop`](Self::stop) and return the records written since the last
    /// [`read_new_periods`](Self::read_new_periods), including the incomplete periods phtrace
    /// writes at exit.
    pub fn finish(mut self) -> Result<Vec<BusyPeriod>, TraceError> {
        self.shutdown(Duration::from_secs(10));
        self.read_new_periods()
    }

    fn shutdown(&mut self, grace: Duration) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        let pid = i32::try_from(self.child.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw);
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for TracedServer {
    fn drop(&mut self) {
        if !self.stopped {
            self.stopped = true;
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nofile_limits() {
        let (soft, hard) = nofile_limits().expect("/proc/self/limits");
        assert!(soft <= hard);
    }
}
