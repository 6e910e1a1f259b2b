//! Which of a process's fds belong to a TCP port at attach: `/proc/PID/fd` links
//! (`socket:[INODE]`) joined with `/proc/PID/net/tcp` and `tcp6` (the process's network
//! namespace). Later connections are followed by the tracker (`accept`'s return values).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};

/// TCP state `LISTEN` in `/proc/net/tcp`.
const TCP_LISTEN: u8 = 0x0a;

/// A socket of a `/proc/net/tcp` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSocket {
    pub local_port: u16,
    pub state: u8,
}

/// The sockets of one `/proc/net/tcp` or `tcp6` table by inode (lines that do not parse are
/// skipped: the header, and any format this does not know).
pub fn parse_tcp_table(text: &str) -> BTreeMap<u64, TcpSocket> {
    let mut out = BTreeMap::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(local), Some(st), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
            continue;
        };
        let port = local
            .rsplit_once(':')
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
        let state = u8::from_str_radix(st, 16).ok();
        if let (Some(local_port), Some(state), Ok(inode)) = (port, state, inode.parse::<u64>()) {
            if inode != 0 {
                out.insert(inode, TcpSocket { local_port, state });
            }
        }
    }
    out
}

/// The inode of an fd link `socket:[INODE]`.
pub fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// The port's sockets among a process's fds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortFds {
    pub listening: Vec<u64>,
    pub connections: Vec<u64>,
}

/// Split `fds` (fd → socket inode) by `port` in `table`.
pub fn port_fds(fds: &BTreeMap<u64, u64>, table: &BTreeMap<u64, TcpSocket>, port: u16) -> PortFds {
    let mut out = PortFds::default();
    for (fd, inode) in fds {
        match table.get(inode) {
            Some(s) if s.local_port == port && s.state == TCP_LISTEN => out.listening.push(*fd),
            Some(s) if s.local_port == port => out.connections.push(*fd),
            _ => {}
        }
    }
    out
}

/// The sockets of process `pid` on `port`, read from `proc_root` (`/proc`).
pub fn snapshot(proc_root: &Path, pid: u32, port: u16) -> Result<PortFds> {
    let dir = proc_root.join(pid.to_string());
    let mut fds = BTreeMap::new();
    let entries = std::fs::read_dir(dir.join("fd"))
        .with_context(|| format!("reading {}/fd", dir.display()))?;
    for e in entries.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<u64>().ok()) else {
            continue;
        };
        if let Some(inode) = std::fs::read_link(e.path())
            .ok()
            .and_then(|l| l.to_str().and_then(socket_inode))
        {
            fds.insert(fd, inode);
        }
    }
    let mut table = BTreeMap::new();
    for name in ["tcp", "tcp6"] {
        if let Ok(text) = std::fs::read_to_string(dir.join("net").join(name)) {
            table.extend(parse_tcp_table(&text));
        }
    }
    Ok(port_fds(&fds, &table, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F90 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 2222 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:D2F0 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 3333 1 0000000000000000 20 4 30 10 -1
   3: garbage
";

    #[test]
    fn table_and_links() {
        let t = parse_tcp_table(TCP);
        assert_eq!(t.len(), 3);
        assert_eq!(
            t[&1111],
            TcpSocket {
                local_port: 8080,
                state: 0x0a
            }
        );
        assert_eq!(socket_inode("socket:[2222]"), Some(2222));
        assert_eq!(socket_inode("pipe:[2222]"), None);
        let fds = BTreeMap::from([(3, 1111), (5, 2222), (6, 3333), (7, 9999)]);
        let p = port_fds(&fds, &t, 8080);
        assert_eq!(
            p,
            PortFds {
                listening: vec![3],
                connections: vec![5]
            }
        );
    }

    #[test]
    fn tcp6_addresses() {
        let line = "  sl local rem st\n   0: 00000000000000000000000001000000:1F91 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1\n";
        assert_eq!(parse_tcp_table(line)[&4444].local_port, 8081);
    }
}
