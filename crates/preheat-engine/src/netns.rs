//! A server host on the other end of a veth pair: a network namespace of its own, joined to
//! ours by one veth pair on a private /30, so that a request crosses a network device (veth's
//! transmit, the peer's receive through the backlog, the stack of another namespace) instead of
//! the loopback. `preheat demo --netns` starts its server in one.
//!
//! Built with iproute2 (`ip`; Debian package `iproute2`) and root. The namespace is named
//! `preheat-<our pid>`: dropping [`VethHost`] deletes it (and with it both ends of the pair),
//! and [`sweep_stale`] deletes those whose process is gone (killed outright), so nothing is
//! left behind. A process is placed into it between fork and exec ([`VethHost::enter_on_spawn`]:
//! `setns`), so its pid, environment and mount namespace stay what they would be otherwise
//! (unlike `ip netns exec`, which also remounts `/sys`).

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use crate::host::find_program;

const PREFIX: &str = "preheat-";
/// Where iproute2 keeps named namespaces.
const NETNS_DIR: &str = "/run/netns";

/// A namespace reached over a veth pair (see the module docs). Removed on drop.
#[derive(Debug)]
pub struct VethHost {
    name: String,
    /// Our end's address.
    pub local: Ipv4Addr,
    /// The namespace's end (its servers listen here, or on 0.0.0.0).
    pub remote: Ipv4Addr,
    ns: File,
}

/// The /30 of process `pid`: 10.234.X.Y (.1 ours, .2 the namespace's), distinct for pids that
/// differ below 2^14, so concurrent commands do not collide.
fn addresses(pid: u32) -> (Ipv4Addr, Ipv4Addr) {
    let slot = pid % (1 << 14);
    let (x, y) = ((slot >> 6) as u8, ((slot & 63) * 4) as u8);
    (
        Ipv4Addr::new(10, 234, x, y + 1),
        Ipv4Addr::new(10, 234, x, y + 2),
    )
}

/// This process's namespace name.
fn own_name() -> String {
    format!("{PREFIX}{}", std::process::id())
}

/// Run `ip ARGS` (iproute2); the error names the command and what `ip` said.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let prog = find_program("ip").ok_or(
        "the `ip` program (Debian package iproute2) is not installed; it builds the veth pair",
    )?;
    let o = Command::new(prog)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

impl VethHost {
    /// Create this process's namespace and veth pair, addresses up, the namespace's loopback up
    /// (a server's own connections to 127.0.0.1 stay possible). Needs root.
    pub fn create() -> Result<VethHost, String> {
        if crate::host::effective_uid() != Some(0) {
            return Err("a network namespace needs root".into());
        }
        sweep_stale();
        let pid = std::process::id();
        let name = own_name();
        let (local, remote) = addresses(pid);
        let (a, b) = (format!("phv{pid}h"), format!("phv{pid}n"));
        ip(&["netns", "add", &name])?;
        // From here on, dropping `host` removes what exists.
        let ns = File::open(Path::new(NETNS_DIR).join(&name)).map_err(|e| {
            let _ = ip(&["netns", "del", &name]);
            format!("{NETNS_DIR}/{name}: {e}")
        })?;
        let host = VethHost {
            name,
            local,
            remote,
            ns,
        };
        let n = host.name.as_str();
        let (l, r) = (format!("{local}/30"), format!("{remote}/30"));
        ip(&[
            "link", "add", &a, "type", "veth", "peer", "name", &b, "netns", n,
        ])?;
        ip(&["addr", "add", &l, "dev", &a])?;
        ip(&["link", "set", &a, "up"])?;
        ip(&["-n", n, "addr", "add", &r, "dev", &b])?;
        ip(&["-n", n, "link", "set", &b, "up"])?;
        ip(&["-n", n, "link", "set", "lo", "up"])?;
        Ok(host)
    }

    /// The namespace's name (`ip netns list` shows it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Make the process `cmd` starts join the namespace before it executes.
    pub fn enter_on_spawn(&self, cmd: &mut Command) -> std::io::Result<()> {
        let fd = self.ns.try_clone()?;
        // SAFETY: the closure runs in the forked child before exec; it calls only setns(2), an
        // async-signal-safe system call, on a descriptor the child inherited (`fd` is moved into
        // the closure and outlives it), and allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        Ok(())
    }

    /// Whether process `pid` runs in this namespace.
    pub fn holds(&self, pid: u32) -> bool {
        use std::os::unix::fs::MetadataExt;
        let id = |m: std::fs::Metadata| (m.dev(), m.ino());
        let theirs = std::fs::metadata(format!("/proc/{pid}/ns/net")).map(id);
        matches!((self.ns.metadata().map(id), theirs), (Ok(a), Ok(b)) if a == b)
    }
}

impl Drop for VethHost {
    fn drop(&mut self) {
        // Deleting the namespace deletes its end of the pair, and with it ours.
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Delete this process's namespace, if it made one (the signal handler's cleanup: a
/// [`VethHost`] is not dropped when the process exits from a handler).
pub fn remove_own() {
    let name = own_name();
    if Path::new(NETNS_DIR).join(&name).exists() {
        let _ = ip(&["netns", "del", &name]);
    }
}

/// Delete the `preheat-<pid>` namespaces of processes that no longer run (a command killed
/// outright); quietly does nothing where there are none or `ip` is missing.
pub fn sweep_stale() {
    for (path, _) in crate::host::left_by_the_dead(Path::new(NETNS_DIR), PREFIX) {
        if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_a_private_slash_30_per_pid() {
        for pid in [1u32, 63, 64, 4_194_303, 12_345] {
            let (l, r) = addresses(pid);
            assert_eq!(l.octets()[..2], [10, 234]);
            assert_eq!(u32::from(r), u32::from(l) + 1);
            assert_eq!(u32::from(l) % 4, 1, "{l}: .1 of its /30");
        }
        assert_ne!(addresses(1), addresses(2));
        assert_ne!(addresses(63), addresses(64));
    }
}
