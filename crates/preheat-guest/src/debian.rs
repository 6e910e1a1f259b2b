//! The Debian packages a guest is made of, through apt's ordinary clients: which version apt
//! offers (`apt-cache show`), the package file (`apt-get download`, no installation, works
//! unprivileged in a directory of ours) and the files wanted from it (`dpkg-deb --fsys-tarfile`
//! into `tar`, so a 70 MB kernel package yields only its `vmlinuz`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::Missing;

/// A package at the version apt offers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Package {
    pub name: String,
    pub version: String,
}

/// The metapackage whose dependency names the current kernel package.
pub const KERNEL_METAPACKAGE: &str = "linux-image-amd64";
/// The statically linked busybox.
pub const BUSYBOX_PACKAGE: &str = "busybox-static";

/// `tool`, or [`Missing::Tool`] naming the package that has it.
fn tool(name: &str, package: &str) -> Result<PathBuf> {
    preheat_engine::host::find_program(name).ok_or_else(|| {
        Missing::Tool {
            tool: name.into(),
            package: package.into(),
        }
        .into()
    })
}

/// `apt-cache show --no-all-versions NAME...` (one look-up: apt loads its cache in about 0.6 s):
/// the record of each name's candidate version, in order, or [`Missing::Package`] with apt's
/// words for the first it lacks.
fn show(names: &[&str]) -> Result<Vec<String>> {
    let out = Command::new(tool("apt-cache", "apt")?)
        .args(["show", "--no-all-versions"])
        .args(names)
        .stdin(Stdio::null())
        .output()
        .context("running apt-cache")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let records: Vec<String> = text
        .split("\n\n")
        .filter(|r| r.lines().any(|l| l.starts_with("Version:")))
        .map(str::to_string)
        .collect();
    let mut ordered = Vec::new();
    for name in names {
        match records.iter().find(|r| field(r, "Package") == Some(*name)) {
            Some(r) => ordered.push(r.clone()),
            None => {
                let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
                return Err(Missing::Package {
                    name: (*name).into(),
                    detail: if why.is_empty() || !why.contains(name) {
                        "apt knows no such package".into()
                    } else {
                        why
                    },
                }
                .into());
            }
        }
    }
    Ok(ordered)
}

/// The value of `field` in an apt record.
pub fn field<'a>(record: &'a str, field: &str) -> Option<&'a str> {
    record.lines().find_map(|l| {
        l.strip_prefix(field)?
            .strip_prefix(':')
            .map(str::trim)
            .filter(|v| !v.is_empty())
    })
}

/// The first dependency of a `Depends:` value whose name starts with `prefix`, with its version
/// when the dependency pins one exactly (`name (= version)`).
pub fn first_dependency<'a>(depends: &'a str, prefix: &str) -> Option<(&'a str, Option<&'a str>)> {
    depends.split([',', '|']).find_map(|d| {
        let mut words = d.split_whitespace();
        let name = words.next().filter(|n| n.starts_with(prefix))?;
        let pinned = (words.next() == Some("(=")).then(|| words.next()).flatten();
        Some((name, pinned.map(|v| v.trim_end_matches(')'))))
    })
}

fn package(record: &str) -> Result<Package> {
    Ok(Package {
        name: field(record, "Package")
            .context("apt's record has no Package")?
            .into(),
        version: field(record, "Version")
            .context("apt's record has no Version")?
            .into(),
    })
}

/// The kernel package (`kernel`, else the one [`KERNEL_METAPACKAGE`] depends on) and
/// [`BUSYBOX_PACKAGE`], at the versions apt offers.
pub fn guest_packages(kernel: Option<&str>) -> Result<(Package, Package)> {
    let records = show(&[kernel.unwrap_or(KERNEL_METAPACKAGE), BUSYBOX_PACKAGE])?;
    let busybox = package(&records[1])?;
    if kernel.is_some() {
        return Ok((package(&records[0])?, busybox));
    }
    let (name, pinned) = field(&records[0], "Depends")
        .and_then(|d| first_dependency(d, "linux-image-"))
        .ok_or_else(|| Missing::Package {
            name: KERNEL_METAPACKAGE.into(),
            detail: "its record names no linux-image-* dependency".into(),
        })?;
    let kernel = match pinned {
        Some(v) => Package {
            name: name.into(),
            version: v.into(),
        },
        None => package(&show(&[name])?[0])?,
    };
    Ok((kernel, busybox))
}

/// The package file of `p` in `dir`, downloaded unless it is there already.
pub fn download(p: &Package, dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // apt names the file NAME_VERSION_ARCH.deb with the version's ':' escaped.
    let stem = format!("{}_{}_", p.name, p.version.replace(':', "%3a"));
    let find = || -> Option<PathBuf> {
        std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|f| {
                f.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&stem) && n.ends_with(".deb"))
            })
    };
    if let Some(f) = find() {
        return Ok(f);
    }
    let out = Command::new(tool("apt-get", "apt")?)
        .arg("download")
        .arg(format!("{}={}", p.name, p.version))
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .context("running apt-get download")?;
    if !out.status.success() {
        return Err(Missing::Package {
            name: p.name.clone(),
            detail: format!(
                "apt-get download failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }
        .into());
    }
    find().with_context(|| format!("apt-get download left no {stem}*.deb in {}", dir.display()))
}

/// Extract the members of `deb` matching `pattern` (a `tar` wildcard such as
/// `./boot/vmlinuz-*`) into `dest`.
pub fn extract(deb: &Path, pattern: &str, dest: &Path) -> Result<()> {
    let mut dpkg = Command::new(tool("dpkg-deb", "dpkg")?)
        .arg("--fsys-tarfile")
        .arg(deb)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running dpkg-deb")?;
    let tar_in = dpkg.stdout.take().context("dpkg-deb's stdout")?;
    let tar = Command::new(tool("tar", "tar")?)
        .args(["-x", "--wildcards", "-C"])
        .arg(dest)
        .args(["-f", "-", pattern])
        .stdin(tar_in)
        .output()
        .context("running tar")?;
    let dpkg_out = dpkg.wait_with_output().context("waiting for dpkg-deb")?;
    if !tar.status.success() || !dpkg_out.status.success() {
        bail!(
            "extracting {pattern} from {} failed: {} {}",
            deb.display(),
            String::from_utf8_lossy(&dpkg_out.stderr).trim(),
            String::from_utf8_lossy(&tar.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECORD: &str = "Package: linux-image-amd64\nSource: linux-signed-amd64 (6.1.192+2)\n\
Version: 6.1.192-2\nDepends: linux-image-6.1.0-56-amd64 (= 6.1.192-2)\nDescription: x\n";

    #[test]
    fn reads_apt_records() {
        assert_eq!(field(RECORD, "Version"), Some("6.1.192-2"));
        assert_eq!(field(RECORD, "Conflicts"), None);
        let d = field(RECORD, "Depends").unwrap();
        assert_eq!(
            first_dependency(d, "linux-image-"),
            Some(("linux-image-6.1.0-56-amd64", Some("6.1.192-2")))
        );
        assert_eq!(
            first_dependency(
                "foo (>= 1), linux-image-6.1.0-9-amd64 | bar",
                "linux-image-"
            ),
            Some(("linux-image-6.1.0-9-amd64", None))
        );
        assert_eq!(first_dependency("foo, bar", "linux-image-"), None);
    }
}
