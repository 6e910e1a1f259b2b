//! The agent in hosts that fork, exec and close file descriptors they do not own.

// Test programs signal and inspect the processes they start (kill, geteuid): libc calls.
#![allow(unsafe_code)]

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;

fn sh(script: &str, run_dir: &std::path::Path) -> std::process::Child {
    let mut cmd = Command::new("/bin/sh");
    for k in AGENT_ENV {
        cmd.env_remove(k);
    }
    cmd.args(["-c", script])
        .env("LD_PRELOAD", &artifacts().agent_so)
        .env("PREHEAT_RUN_DIR", run_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting /bin/sh")
}

#[test]
fn agent_survives_the_host_closing_its_fds() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    // A daemon-style "close every fd but 0-2" loop (through close(2)).
    let mut child = sh(
        "for fd in 3 4 5 6 7 8 9; do eval \"exec $fd>&-\"; done; echo closed; sleep 5",
        &run_dir,
    );
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "closed\n");
    let path = preheat_agent::socket_paths(&run_dir, child.id()).control;
    let mut agent = AgentClient::connect(&path).expect("agent socket still served");
    let st = agent.status();
    assert_eq!(st.pid, child.id());
    assert!(st.enabled, "{st:?}");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn fork_and_exec_chains_leave_no_sockets_behind() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let mut child = sh(
        "for i in 1 2 3; do /bin/true; done; (echo sub >/dev/null); x=$(echo y); echo done",
        &run_dir,
    );
    let mut out = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut out)
        .unwrap();
    assert_eq!(out, "done\n");
    assert!(child.wait().unwrap().success());
    let left = || -> Vec<String> {
        std::fs::read_dir(&run_dir)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".sock") || n.ends_with(".trig"))
                    .collect()
            })
            .unwrap_or_default()
    };
    // Processes that end with _exit(2) (shell subshells) cannot remove their sockets; the
    // next agent starting in the run directory removes those of dead pids.
    for name in left() {
        let pid: u32 = name[6..name.len() - 5].parse().unwrap();
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "{name}: its process is still alive"
        );
    }
    let st = Command::new("/bin/true")
        .env_remove("PREHEAT_AGENT_ONLY")
        .env_remove("PREHEAT_AGENT_DISABLE")
        .env("LD_PRELOAD", &artifacts().agent_so)
        .env("PREHEAT_RUN_DIR", &run_dir)
        .status()
        .unwrap();
    assert!(st.success());
    assert!(
        wait_until(Duration::from_secs(5), || left().is_empty()),
        "left behind: {:?}",
        left()
    );
    // Every process of the chain had an agent of its own (one log per pid).
    let logs = std::fs::read_dir(&run_dir).unwrap().count();
    assert!(logs >= 4, "{logs} agent logs");
}

/// A host that blocks a signal in its threads to take it through a signalfd (or `sigwait`) must
/// get it there: the agent's threads block every asynchronous signal, so the kernel never
/// delivers the host's signal to one of them (where its default action would kill the process;
/// it did before the agent's threads blocked signals).
#[test]
fn a_signal_the_host_blocks_reaches_its_signalfd() {
    let dir = tempfile::tempdir().unwrap();
    let Some(prog) = compile_c("host/sigwait", dir.path()) else {
        return;
    };
    let run_dir = dir.path().join("run");
    let mut cmd = Command::new(&prog);
    for k in AGENT_ENV {
        cmd.env_remove(k);
    }
    let mut child = cmd
        .env("LD_PRELOAD", &artifacts().agent_so)
        .env("PREHEAT_RUN_DIR", &run_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting the test program");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "blocked\n");
    // The agent is attached (its threads run) before main starts.
    let sock = preheat_agent::socket_paths(&run_dir, child.id()).control;
    assert!(sock.exists(), "no agent socket {}", sock.display());
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGHUP) };
    let st = child.wait().unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert!(
        st.success() && line == "got SIGHUP\n",
        "{st:?} (signal {:?}), output {line:?}",
        st.signal()
    );
}
