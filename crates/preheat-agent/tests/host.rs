//! The agent in hosts that fork, exec and close file descriptors they do not own.

// Test programs signal and inspect the processes they start (kill, geteuid): libc calls.
#![allow(unsafe_code)]

mod support;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;

/// `/bin/sh -c script` with the agent, in a process group of its own (see [`KillGroup`]).
fn sh(script: &str, run_dir: &std::path::Path) -> std::process::Child {
    let mut cmd = Command::new("/bin/sh");
    cmd.process_group(0);
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

/// Kills the process group of an [`sh`] child when dropped (the test's end or its panic): the
/// shell's own children carry the agent too and would otherwise outlive the test and write their
/// logs into its removed temporary directory.
struct KillGroup(u32);

impl Drop for KillGroup {
    fn drop(&mut self) {
        let _ = preheat_engine::os::send_signal(self.0, libc::SIGKILL, true);
    }
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
    let _group = KillGroup(child.id());
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

// ------------------------------------------------------------- the agent's own file table

/// The kernel threads of `pid` named `preheat-*` (the agent's).
fn agent_tids(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|tid| {
                    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
                        .is_ok_and(|c| c.starts_with("preheat-"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Where the fds of thread `tid` of `pid` point (`socket:[…]`, paths).
fn fd_links(pid: u32, tid: u32) -> Vec<(u32, String)> {
    let dir = format!("/proc/{pid}/task/{tid}/fd");
    std::fs::read_dir(&dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let n = e.file_name().to_str()?.parse().ok()?;
                    let l = std::fs::read_link(e.path()).ok()?;
                    Some((n, l.to_string_lossy().into_owned()))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether two threads share one file table (`kcmp(KCMP_FILES)`), if the kernel can say.
fn same_table(a: u32, b: u32) -> Option<bool> {
    const KCMP_FILES: libc::c_int = 2;
    // SAFETY: kcmp(2) takes no pointers for KCMP_FILES.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, a, b, KCMP_FILES, 0, 0) };
    (r >= 0).then_some(r == 0)
}

/// The host program of these tests (`host/fdtable.c`), started with the agent, its fd 3 a
/// connected TCP socket whose peer is returned.
fn fdtable_host(
    prog: &std::path::Path,
    run_dir: &std::path::Path,
    shared: bool,
) -> (std::process::Child, std::net::TcpStream) {
    use std::os::fd::AsRawFd;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (host_side, _) = l.accept().unwrap();
    let fd = host_side.as_raw_fd();
    let mut cmd = Command::new(prog);
    for k in AGENT_ENV {
        cmd.env_remove(k);
    }
    if shared {
        cmd.env("PREHEAT_AGENT_SHARED_FDS", "1");
    } else {
        cmd.env_remove("PREHEAT_AGENT_SHARED_FDS");
    }
    cmd.env("LD_PRELOAD", &artifacts().agent_so)
        .env("PREHEAT_RUN_DIR", run_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // SAFETY: between fork and exec only dup2 and fcntl (async-signal-safe) on fds we own.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(fd, 3) < 0 || libc::fcntl(3, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().expect("starting the test program");
    drop(host_side);
    (child, peer)
}

struct Host {
    child: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Host {
    fn ask(&mut self, cmd: &str) -> String {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        line.trim_end().to_string()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A socket inherited by the host and open when the agent started is the host's alone: the
/// host closes it and the peer reads EOF (the FIN went out; a copy of the host's table in the
/// agent's threads would have kept the socket open).
fn host_close_sends_fin(host: &mut Host, peer: &mut std::net::TcpStream) {
    use std::io::Read;
    assert_eq!(host.ask("close"), "closed");
    peer.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(
        peer.read(&mut buf)
            .expect("reading the peer of the host's closed socket"),
        0,
        "the host closed its socket, but the peer did not see EOF"
    );
}

/// The agent's threads run on one file table of their own, not the host's (a single-threaded
/// host keeps an unshared table, so the kernel takes no file reference per fd system call): an
/// fd the host opened is not visible to them and theirs not to the host; the host closes
/// every fd number the agent also uses (`close`, `close_range`, `closefrom`) and they are
/// closed; a host socket open when the agent started sends its FIN when the host closes it; a
/// fork child's agent gets a table of its own too.
#[test]
fn agent_threads_have_a_file_table_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let Some(prog) = compile_c("host/fdtable", dir.path()) else {
        return;
    };
    let run_dir = dir.path().join("run");
    let (mut child, mut peer) = fdtable_host(&prog, &run_dir, false);
    let pid = child.id();
    let mut host = Host {
        out: BufReader::new(child.stdout.take().unwrap()),
        child,
    };
    assert_eq!(host.ask("open"), "opened");
    let path = preheat_agent::socket_paths(&run_dir, pid).control;
    let mut agent = AgentClient::connect(&path).expect("agent socket served");
    assert!(agent.status().enabled);
    let tids = agent_tids(pid);
    assert!(tids.len() >= 3, "agent threads: {tids:?}");
    let host_links = fd_links(pid, pid);
    let host_socket = host_links
        .iter()
        .find(|(n, _)| *n == 3)
        .map(|(_, l)| l.clone())
        .expect("the host's fd 3");
    assert!(host_socket.starts_with("socket:"), "{host_socket}");
    let agent_links = fd_links(pid, tids[0]);
    assert!(
        agent_links.iter().all(|(_, l)| *l != host_socket),
        "the host's socket {host_socket} is in the agent's table: {agent_links:?}"
    );
    assert!(
        agent_links.iter().any(|(n, _)| (4..=31).contains(n)),
        "the agent uses none of the numbers the host closes: {agent_links:?}"
    );
    for (n, l) in &agent_links {
        if l.starts_with("socket:") {
            assert!(
                host_links.iter().all(|(_, h)| h != l),
                "the agent's fd {n} ({l}) is in the host's table: {host_links:?}"
            );
        }
    }
    if let Some(same) = same_table(pid, tids[0]) {
        assert!(
            !same,
            "kcmp: the agent's thread shares the host's file table"
        );
        for &t in &tids[1..] {
            assert_eq!(
                same_table(tids[0], t),
                Some(true),
                "kcmp: the agent's threads {} and {t} have different tables",
                tids[0]
            );
        }
    }
    // The host closes fds 3..31 (its socket, and numbers the agent uses in its own table).
    host_close_sends_fin(&mut host, &mut peer);
    assert_eq!(host.ask("range"), "ranged");
    assert_eq!(host.ask("from"), "closedfrom");
    assert!(agent.status().enabled, "the agent after the host's closes");

    // A fork child's agent: a table of its own as well.
    let line = host.ask("fork");
    let cpid: u32 = line
        .strip_prefix("child ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    struct Kill(u32);
    impl Drop for Kill {
        fn drop(&mut self) {
            // SAFETY: kill(2) of the test host's child.
            unsafe { libc::kill(self.0 as libc::pid_t, libc::SIGKILL) };
        }
    }
    let kill = Kill(cpid);
    let cpath = preheat_agent::socket_paths(&run_dir, cpid).control;
    assert!(
        wait_until(Duration::from_secs(10), || AgentClient::connect(&cpath)
            .is_ok()
            && fd_links(cpid, cpid).iter().any(|(_, l)| l == "/dev/zero")),
        "the fork child's agent did not start"
    );
    let ctids = agent_tids(cpid);
    assert!(!ctids.is_empty());
    let clinks = fd_links(cpid, ctids[0]);
    assert!(
        clinks.iter().all(|(_, l)| l != "/dev/zero"),
        "the child's /dev/zero is in its agent's table: {clinks:?}"
    );
    if let Some(same) = same_table(cpid, ctids[0]) {
        assert!(
            !same,
            "kcmp: the child's agent shares the child's file table"
        );
    }
    // The child holds the host's stdout too: EOF only once it is gone.
    drop(kill);
    assert_eq!(host.ask("quit"), "");
}

/// `PREHEAT_AGENT_SHARED_FDS=1` (and wherever the table cannot be left): the agent's threads
/// share the host's table as before; the host's own socket still sends its FIN.
#[test]
fn agent_threads_share_the_hosts_table_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let Some(prog) = compile_c("host/fdtable", dir.path()) else {
        return;
    };
    let run_dir = dir.path().join("run");
    let (mut child, mut peer) = fdtable_host(&prog, &run_dir, true);
    let pid = child.id();
    let mut host = Host {
        out: BufReader::new(child.stdout.take().unwrap()),
        child,
    };
    assert_eq!(host.ask("open"), "opened");
    let path = preheat_agent::socket_paths(&run_dir, pid).control;
    let mut agent = AgentClient::connect(&path).expect("agent socket served");
    let tids = agent_tids(pid);
    assert!(!tids.is_empty());
    if let Some(same) = same_table(pid, tids[0]) {
        assert!(
            same,
            "kcmp: PREHEAT_AGENT_SHARED_FDS=1, but the tables differ"
        );
    }
    // fd 3 is the host's (the agent's fds, protected in a shared table, come after it): the
    // host closes it and the peer sees EOF; the agent's fds among 4..31 stay open.
    use std::io::Read;
    let reply = host.ask("close");
    assert!(reply.starts_with("FAIL fd "), "{reply}");
    peer.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(peer.read(&mut buf).unwrap(), 0);
    assert!(agent.status().enabled);
    assert_eq!(host.ask("quit"), "");
}
