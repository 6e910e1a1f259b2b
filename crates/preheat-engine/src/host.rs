//! The host's programs and loopback ports: the one lookup of an installed program (on `PATH`
//! and in the sbin directories Debian installs daemons in, which a non-root `PATH` often lacks)
//! and the one free-port helper.

use std::io;
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

/// A loopback TCP port that is free right now (bound and released at once: a server started
/// right after gets it unless something else took it meanwhile).
pub fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_free_port_can_be_bound() {
        let p = free_port().unwrap();
        assert!(p > 0);
        std::net::TcpListener::bind(("127.0.0.1", p)).unwrap();
    }
}
