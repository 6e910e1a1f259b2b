//! The tracepoints' ids and record layouts, from tracefs.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::decode::Ids;

/// Where tracefs is mounted, or is to be mounted.
const TRACEFS: &str = "/sys/kernel/tracing";
const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";

/// tracefs, and whether this call mounted it (then privately: unmounted and its directory
/// removed on drop, so nothing is left mounted).
pub struct Tracefs {
    pub dir: PathBuf,
    pub mounted_now: bool,
}

impl Drop for Tracefs {
    fn drop(&mut self) {
        if self.mounted_now {
            let _ = crate::perf::unmount(&self.dir);
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}

/// Find tracefs; where it is not mounted (and we are root), mount it on a private directory of
/// our own for as long as the caller holds the [`Tracefs`] (the tracepoints' ids and layouts are
/// read once; the events need no mount afterwards). The machine's own mount points are never
/// touched.
pub fn find_or_mount() -> Result<Tracefs> {
    for d in [TRACEFS, DEBUGFS_TRACING] {
        if Path::new(d).join("events/raw_syscalls").is_dir() {
            return Ok(Tracefs {
                dir: d.into(),
                mounted_now: false,
            });
        }
    }
    if !Path::new(TRACEFS).is_dir() {
        bail!("no tracefs: {TRACEFS} does not exist (a kernel without CONFIG_FTRACE?)");
    }
    // One directory per call: observers in one process (tests) mount and unmount apart.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("preheat-tracefs-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let t = Tracefs {
        dir,
        mounted_now: true,
    };
    if let Err(e) = crate::perf::mount_tracefs(&t.dir) {
        let _ = std::fs::remove_dir(&t.dir);
        std::mem::forget(t);
        return Err(anyhow::Error::new(e).context(format!(
            "tracefs is not mounted and mounting it failed (try `mount -t tracefs nodev {TRACEFS}`)"
        )));
    }
    if !t.dir.join("events/raw_syscalls").is_dir() {
        bail!("tracefs has no raw_syscalls events (a kernel without syscall tracepoints: CONFIG_FTRACE_SYSCALLS)");
    }
    Ok(t)
}

/// Offset and size of `field` in a tracepoint `format` file.
pub fn field(format: &str, name: &str) -> Option<(usize, usize)> {
    for line in format.lines() {
        let parts: Vec<&str> = line.trim().split(';').map(str::trim).collect();
        let Some(decl) = parts.first().and_then(|p| p.strip_prefix("field:")) else {
            continue;
        };
        let ident = decl.rsplit([' ', '*']).next().unwrap_or("");
        let ident = ident.split('[').next().unwrap_or("");
        if ident != name {
            continue;
        }
        let num = |key: &str| {
            parts
                .iter()
                .find_map(|p| p.strip_prefix(key).and_then(|v| v.parse::<usize>().ok()))
        };
        return Some((num("offset:")?, num("size:")?));
    }
    None
}

/// Check the layouts [`crate::decode`] assumes.
pub fn check_layout(enter: &str, exit: &str) -> Result<()> {
    let want = [
        (enter, "common_type", (0, 2)),
        (enter, "id", (8, 8)),
        (enter, "args", (16, 48)),
        (exit, "common_type", (0, 2)),
        (exit, "id", (8, 8)),
        (exit, "ret", (16, 8)),
    ];
    for (fmt, name, at) in want {
        if field(fmt, name) != Some(at) {
            bail!(
                "raw_syscalls tracepoint field {name} is not at offset/size {at:?} on this kernel"
            );
        }
    }
    Ok(())
}

/// The ids of `raw_syscalls:sys_enter` and `sys_exit`, their layouts checked.
pub fn raw_syscall_ids(t: &Tracefs) -> Result<Ids> {
    let read = |ev: &str, file: &str| {
        let p = t.dir.join("events/raw_syscalls").join(ev).join(file);
        std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
    };
    check_layout(&read("sys_enter", "format")?, &read("sys_exit", "format")?)?;
    let id = |ev: &str| -> Result<u16> {
        let s = read(ev, "id")?;
        s.trim()
            .parse()
            .with_context(|| format!("tracepoint id of {ev}: {s:?}"))
    };
    Ok(Ids {
        enter: id("sys_enter")?,
        exit: id("sys_exit")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENTER: &str = "name: sys_enter
ID: 443
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:long id;\toffset:8;\tsize:8;\tsigned:1;
\tfield:unsigned long args[6];\toffset:16;\tsize:48;\tsigned:0;
";

    #[test]
    fn fields() {
        assert_eq!(field(ENTER, "args"), Some((16, 48)));
        assert_eq!(field(ENTER, "id"), Some((8, 8)));
        assert_eq!(field(ENTER, "common_pid"), Some((4, 4)));
        assert_eq!(field(ENTER, "ret"), None);
        let exit = ENTER.replace(
            "unsigned long args[6];\toffset:16;\tsize:48",
            "long ret;\toffset:16;\tsize:8",
        );
        assert!(check_layout(ENTER, &exit).is_ok());
        assert!(check_layout(ENTER, ENTER).is_err());
    }
}
