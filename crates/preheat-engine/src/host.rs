//! The host's programs, directories and loopback ports: the one lookup of an installed program
//! (on `PATH` and in the sbin directories Debian installs daemons in, which a non-root `PATH`
//! often lacks), the one cache directory ([`cache_dir`]), the one free-port helper, and what the
//! kernel weighs when it decides whether running a file raises privileges (secure execution,
//! `AT_SECURE`): this process's ids ([`Creds`]), a file's capabilities ([`has_file_caps`]) and
//! its mount's `nosuid` flag ([`on_nosuid_mount`]).

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Searched after `PATH`.
pub const SBIN_DIRS: [&str; 3] = ["/usr/sbin", "/usr/local/sbin", "/sbin"];

/// The directories [`find_program`] searches: `PATH`, then those of [`SBIN_DIRS`] it lacks.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for d in SBIN_DIRS.map(PathBuf::from) {
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs
}

/// Whether `p` is a file someone may execute.
pub fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The first executable file called `name` in `dirs`.
pub fn find_in(name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter().map(|d| d.join(name)).find(|p| is_executable(p))
}

/// An installed program: the first executable `name` in [`search_dirs`].
pub fn find_program(name: &str) -> Option<PathBuf> {
    find_in(name, &search_dirs())
}

/// The one cache directory of things built on first use (the trace tool, guest images):
/// `PREHEAT_CACHE_DIR`, else `$XDG_CACHE_HOME/preheat`, else `$HOME/.cache/preheat`, else
/// `preheat-cache` in the temp dir (empty variables count as unset). Not created here.
pub fn cache_dir() -> PathBuf {
    let var = |name| {
        std::env::var_os(name)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = var("PREHEAT_CACHE_DIR") {
        return d;
    }
    if let Some(d) = var("XDG_CACHE_HOME") {
        return d.join("preheat");
    }
    if let Some(h) = var("HOME") {
        return h.join(".cache/preheat");
    }
    std::env::temp_dir().join("preheat-cache")
}

/// A loopback TCP port that is free right now (bound and released at once: a server started
/// right after gets it unless something else took it meanwhile). Never one this process was
/// handed before: the kernel may give a released port out again at once, and two callers in
/// one process (tests running in parallel) would then start their servers on the same port.
pub fn free_port() -> io::Result<u16> {
    static HANDED: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    for _ in 0..64 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut handed = HANDED.lock().unwrap_or_else(|e| e.into_inner());
        if !handed.contains(&port) {
            handed.push(port);
            return Ok(port);
        }
    }
    Err(io::Error::other(
        "no loopback port this process was not handed before (64 tries)",
    ))
}

/// Whether a file can be written at `path`, checked before long work whose result goes there
/// (a recording, a demo's rounds) instead of after it: its directory exists and takes a new
/// file (one is created beside `path` and removed again; a file already at `path` is left
/// alone), and `path` is no directory.
pub fn check_writable(path: &Path) -> io::Result<()> {
    if path.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "it is a directory: give a file name",
        ));
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|s| s.to_str()).unwrap_or("out");
    let probe = dir.join(format!(".{name}.check-{}", std::process::id()));
    std::fs::File::create(&probe)?;
    std::fs::remove_file(&probe)
}

/// Whether something accepts TCP connections at `addr` (a connection within `timeout`). A
/// connect to a loopback port nothing listens on can still succeed: when the kernel picks that
/// very port as the connection's own ephemeral source port, the socket connects to itself (TCP
/// simultaneous open). Such a connection is no listener and counts as none — without this, a
/// wait for a starting server's port could end before the server listened.
pub fn accepts_connections(addr: std::net::SocketAddr, timeout: std::time::Duration) -> bool {
    std::net::TcpStream::connect_timeout(&addr, timeout).is_ok_and(|s| reached_a_listener(&s))
}

/// Whether a connected stream reached another socket (not itself).
fn reached_a_listener(s: &std::net::TcpStream) -> bool {
    matches!((s.local_addr(), s.peer_addr()), (Ok(l), Ok(p)) if l != p)
}

/// This process's real and effective user and group ids and its `no_new_privs` flag (under
/// which the kernel ignores set-id bits and file capabilities).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Creds {
    pub ruid: u32,
    pub euid: u32,
    pub rgid: u32,
    pub egid: u32,
    pub no_new_privs: bool,
}

impl Creds {
    /// Ours, from `/proc/self/status`.
    pub fn current() -> io::Result<Creds> {
        let s = std::fs::read_to_string("/proc/self/status")?;
        Creds::parse(&s).ok_or_else(|| io::Error::other("no Uid/Gid lines in /proc/self/status"))
    }

    /// From the text of a `/proc/PID/status` file.
    pub fn parse(status: &str) -> Option<Creds> {
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|r| r.split_whitespace().filter_map(|x| x.parse::<u32>().ok()))
        };
        let mut uid = field("Uid:")?;
        let mut gid = field("Gid:")?;
        Some(Creds {
            ruid: uid.next()?,
            euid: uid.next()?,
            rgid: gid.next()?,
            egid: gid.next()?,
            no_new_privs: field("NoNewPrivs:").and_then(|mut v| v.next()) == Some(1),
        })
    }
}

/// The entries of `dir` named `<prefix><pid>` or `<prefix><pid>-…` whose process no longer
/// runs — what a command killed outright left behind (scratch directories, journals,
/// namespaces) — with those pids. Empty where `dir` cannot be read.
pub fn left_by_the_dead(dir: &Path, prefix: &str) -> Vec<(std::path::PathBuf, u32)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name
                .strip_prefix(prefix)?
                .split('-')
                .next()?
                .parse::<u32>()
                .ok()?;
            (!Path::new(&format!("/proc/{pid}")).exists()).then(|| (e.path(), pid))
        })
        .collect()
}

/// Remove the directories [`left_by_the_dead`] finds (scratch directories of commands killed
/// outright).
pub fn remove_left_by_the_dead(dir: &Path, prefix: &str) {
    for (path, _) in left_by_the_dead(dir, prefix) {
        let _ = std::fs::remove_dir_all(path);
    }
}

/// Our effective uid (`None` if `/proc/self/status` cannot be read).
pub fn effective_uid() -> Option<u32> {
    Creds::current().ok().map(|c| c.euid)
}

fn c_path(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other)
}

/// Whether the file at `p` has file capabilities (a `security.capability` extended attribute).
pub fn has_file_caps(p: &Path) -> io::Result<bool> {
    let path = c_path(p)?;
    let name = c"security.capability";
    // SAFETY: both strings are NUL-terminated and live across the call; a null buffer of size 0
    // only asks for the attribute's size.
    let n = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    if n >= 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENODATA) | Some(libc::ENOTSUP) => Ok(false),
        _ => Err(e),
    }
}

/// Whether the file system holding `p` is mounted `nosuid` (set-id bits and file capabilities
/// are ignored there).
pub fn on_nosuid_mount(p: &Path) -> io::Result<bool> {
    let path = c_path(p)?;
    // SAFETY: statvfs is plain old data; all-zero is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `st` a valid, writable statvfs.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_flag & libc::ST_NOSUID != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_destination_is_checked_without_touching_what_is_there() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("out.json");
        check_writable(&f).unwrap();
        assert_eq!(
            std::fs::read_dir(d.path()).unwrap().count(),
            0,
            "left a file behind"
        );
        std::fs::write(&f, b"kept").unwrap();
        check_writable(&f).unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"kept");
        assert!(check_writable(d.path()).is_err(), "a directory");
        assert!(check_writable(&d.path().join("no/such/dir/x")).is_err());
    }

    /// A socket bound to a port and connected to that same port connects to itself; a
    /// connection to a listener does not.
    #[test]
    fn a_self_connection_is_no_listener() {
        use std::os::fd::FromRawFd;
        let port = free_port().unwrap();
        let addr = crate::os::loopback_sockaddr_in(port);
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: a new socket; `addr` is a valid sockaddr_in of `len` bytes for bind and
        // connect; the fd is owned by the TcpStream made from it (closed on its drop).
        let stream = unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            assert!(fd >= 0);
            let sa = &addr as *const libc::sockaddr_in as *const libc::sockaddr;
            assert_eq!(libc::bind(fd, sa, len), 0, "{}", io::Error::last_os_error());
            assert_eq!(
                libc::connect(fd, sa, len),
                0,
                "{}",
                io::Error::last_os_error()
            );
            std::net::TcpStream::from_raw_fd(fd)
        };
        assert!(
            !reached_a_listener(&stream),
            "a self-connection counted as a listener"
        );
        drop(stream);
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let to = l.local_addr().unwrap();
        assert!(accepts_connections(to, std::time::Duration::from_secs(2)));
        drop(l);
        assert!(!accepts_connections(to, std::time::Duration::from_secs(2)));
    }

    #[test]
    fn left_by_the_dead_names_only_entries_of_gone_processes() {
        let dir = tempfile::tempdir().unwrap();
        // No process has pid u32::MAX - 1 (pid_max is at most 2^22); we run.
        let dead = u32::MAX - 1;
        let me = std::process::id();
        for name in [
            format!("p-{dead}"),
            format!("p-{dead}-x"),
            format!("p-{me}-x"),
            format!("q-{dead}"),
            "p-abc".to_string(),
        ] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
        }
        let mut found = left_by_the_dead(dir.path(), "p-");
        found.sort();
        let want = [format!("p-{dead}"), format!("p-{dead}-x")].map(|n| (dir.path().join(n), dead));
        assert_eq!(found, want);
        assert!(left_by_the_dead(&dir.path().join("none"), "p-").is_empty());
    }

    #[test]
    fn finds_only_executable_files_in_order() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let write = |dir: &Path, mode: u32| {
            let p = dir.join("prog");
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            p
        };
        write(a.path(), 0o644);
        let exe = write(b.path(), 0o755);
        let dirs = [a.path().to_path_buf(), b.path().to_path_buf()];
        assert_eq!(find_in("prog", &dirs), Some(exe));
        assert_eq!(find_in("other", &dirs), None);
        std::fs::create_dir(a.path().join("dir")).unwrap();
        assert_eq!(find_in("dir", &dirs), None, "a directory is no program");
    }

    #[test]
    fn sbin_dirs_come_after_path_once() {
        let dirs = search_dirs();
        for d in SBIN_DIRS {
            assert!(dirs.iter().any(|x| x.as_os_str() == d), "{d} searched");
        }
        assert!(find_program("sh").is_some());
    }

    #[test]
    fn reads_our_ids_and_parses_a_status_file() {
        let me = Creds::current().unwrap();
        let text = std::fs::read_to_string("/proc/self/status").unwrap();
        assert_eq!(Creds::parse(&text), Some(me));
        let c = Creds::parse("Uid:\t1000\t0\t0\t0\nGid:\t100\t101\t0\t0\nNoNewPrivs:\t1\n");
        assert_eq!(
            c,
            Some(Creds {
                ruid: 1000,
                euid: 0,
                rgid: 100,
                egid: 101,
                no_new_privs: true
            })
        );
        assert_eq!(Creds::parse("Name: x\n"), None);
    }

    #[test]
    fn file_caps_and_nosuid_of_ordinary_files() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        std::fs::write(&f, "x").unwrap();
        assert!(!has_file_caps(&f).unwrap());
        assert!(has_file_caps(&d.path().join("missing")).is_err());
        // Which mounts are nosuid differs between machines: only that the answer comes.
        on_nosuid_mount(d.path()).unwrap();
        assert!(on_nosuid_mount(&d.path().join("missing")).is_err());
    }

    #[test]
    fn a_free_port_can_be_bound() {
        let p = free_port().unwrap();
        assert!(p > 0);
        std::net::TcpListener::bind(("127.0.0.1", p)).unwrap();
    }

    #[test]
    fn a_free_port_is_never_handed_out_twice() {
        let mut seen: Vec<u16> = (0..300).map(|_| free_port().unwrap()).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 300);
    }
}
