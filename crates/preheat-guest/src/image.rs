//! The guest image: a Debian kernel and an initramfs of busybox, `/init` and the statically
//! linked `preheat-npb`, built on first use and cached.
//!
//! Cached under [`cache_root`] (`guest/` in the one cache directory,
//! `preheat_engine::host::cache_dir`), keyed by what went in: the kernel package and version,
//! busybox-static's version, the `preheat-npb` binary's and `/init`'s bytes and the image format.
//! A newer kernel from apt, a rebuilt `preheat-npb` or a changed `/init` is a new image; an
//! unchanged one is found again in milliseconds plus apt's look-up (~0.7 s). Package files are
//! kept in `guest/debs/`, and the three newest images. An image is built in a private directory
//! and renamed into place, under a lock on `guest/.lock`, so concurrent builders never see half
//! an image.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::console::INIT;
use crate::cpio::{self, Entry};
use crate::debian::{self, Package};
use crate::pvh;

/// Bumped when the image's layout changes (2: the kernel unpacked for its PVH entry).
const FORMAT: u32 = 2;
/// Images kept in the cache (the newest built); each is about 70 MB with an unpacked kernel.
const KEEP_IMAGES: usize = 3;

/// What to build the image from.
#[derive(Debug, Clone, Default)]
pub struct ImageSpec {
    /// The kernel package (default: the one `linux-image-amd64` depends on).
    pub kernel_package: Option<String>,
    /// A statically linked `preheat-npb` (default: `preheat_launch::paths::npb_static_bin`).
    pub npb: Option<PathBuf>,
}

/// What an image is made of (`manifest.json` in its directory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub kernel: Package,
    /// The kernel release (`vmlinuz-<release>`).
    pub kernel_release: String,
    /// How QEMU starts the kernel.
    pub kernel_entry: KernelEntry,
    /// Why the kernel is not started at its PVH entry, if it is not.
    pub kernel_note: Option<String>,
    pub busybox: Package,
    /// SHA-256 of the `preheat-npb` binary, hex.
    pub npb_sha256: String,
    /// Bytes of the initramfs.
    pub initrd_bytes: u64,
}

/// How QEMU starts an image's kernel (see [`crate::pvh`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KernelEntry {
    /// The unpacked ELF (`vmlinux`) at its PVH entry: no decompression in the guest.
    Pvh,
    /// The bzImage as packaged (`vmlinuz`), through firmware and its own decompressor.
    Bzimage,
}

impl KernelEntry {
    /// The kernel's file name in an image directory.
    pub fn file_name(self) -> &'static str {
        match self {
            KernelEntry::Pvh => "vmlinux",
            KernelEntry::Bzimage => "vmlinuz",
        }
    }
}

/// A built image (`guest build --json` prints it).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Image {
    pub dir: PathBuf,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub manifest: Manifest,
    /// Whether this call built it (false: found in the cache).
    pub built: bool,
}

impl Image {
    /// What the image is made of, for the user; `took`: how long finding or building it took.
    pub fn render(&self, took: std::time::Duration) -> String {
        let m = &self.manifest;
        let how = if self.built {
            "built"
        } else {
            "found in the cache"
        };
        let entry = match (m.kernel_entry, &m.kernel_note) {
            (KernelEntry::Pvh, _) => "unpacked, started at its PVH entry".to_string(),
            (KernelEntry::Bzimage, note) => format!(
                "bzImage, decompressed by the guest ({})",
                note.as_deref().unwrap_or("not unpacked")
            ),
        };
        format!(
            "guest image {how} in {:.1} s (measured, 1 run): {}\n  kernel   {} {} (vmlinuz-{}; {entry})\n  \
             busybox  {} {}\n  preheat-npb (static) sha256 {}\n  initramfs {} KiB\n",
            took.as_secs_f64(),
            self.dir.display(),
            m.kernel.name,
            m.kernel.version,
            m.kernel_release,
            m.busybox.name,
            m.busybox.version,
            m.npb_sha256.get(..16).unwrap_or(&m.npb_sha256),
            m.initrd_bytes / 1024
        )
    }
}

/// Where guest images and package files are cached.
pub fn cache_root() -> PathBuf {
    preheat_engine::host::cache_dir().join("guest")
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The cache key of an image made of these parts (`unxz`: whether `xz` is there to unpack the
/// kernel, so an image built without it is rebuilt once it is installed).
fn key(kernel: &Package, busybox: &Package, npb_sha: &str, unxz: bool) -> String {
    let text = format!(
        "{FORMAT}\n{}={}\n{}={}\n{npb_sha}\n{}\n{unxz}",
        kernel.name,
        kernel.version,
        busybox.name,
        busybox.version,
        sha256_hex(INIT.as_bytes())
    );
    sha256_hex(text.as_bytes())[..16].to_string()
}

/// The image for `spec`: from the cache, or built now (downloading what it needs).
pub fn ensure(spec: &ImageSpec) -> Result<Image> {
    let (kernel, busybox) = debian::guest_packages(spec.kernel_package.as_deref())?;
    let npb_path = match &spec.npb {
        Some(p) => p.clone(),
        None => preheat_launch::paths::npb_static_bin()?,
    };
    let npb =
        std::fs::read(&npb_path).with_context(|| format!("reading {}", npb_path.display()))?;
    let npb_sha256 = sha256_hex(&npb);
    let root = cache_root();
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let lock = File::create(root.join(".lock")).context("creating the image cache's lock")?;
    lock.lock().context("locking the image cache")?;
    let dir = root.join(format!(
        "image-{}",
        key(
            &kernel,
            &busybox,
            &npb_sha256,
            preheat_engine::host::find_program("xz").is_some(),
        )
    ));
    if let Ok(image) = open(&dir) {
        return Ok(image);
    }
    sweep_builds(&root);
    let tmp = root.join(format!("build-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let built = build(&tmp, &root.join("debs"), kernel, busybox, &npb, npb_sha256);
    let renamed = built.and_then(|()| {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&tmp, &dir)
            .with_context(|| format!("moving the image to {}", dir.display()))
    });
    if let Err(e) = renamed {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    prune_images(&root, KEEP_IMAGES);
    Ok(Image {
        built: true,
        ..open(&dir)?
    })
}

/// Remove the `build-<pid>` directories that builders killed outright left (called under the
/// lock, so no build is in progress).
fn sweep_builds(root: &Path) {
    let Ok(rd) = std::fs::read_dir(root) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name
            .strip_prefix("build-")
            .is_some_and(|p| p.parse::<u32>().is_ok())
        {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Keep the `keep` newest `image-*` directories in `root` (by the time their manifest was
/// written), remove the others: a rebuilt `preheat-npb` or a new kernel makes a new image. QEMU
/// reads the kernel and initramfs when it starts, so running guests do not mind.
fn prune_images(root: &Path, keep: usize) {
    let Ok(rd) = std::fs::read_dir(root) else {
        return;
    };
    let mut images: Vec<(std::time::SystemTime, PathBuf)> = rd
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("image-"))
        .map(|e| {
            let written = std::fs::metadata(e.path().join("manifest.json"))
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            (written, e.path())
        })
        .collect();
    images.sort_by_key(|i| std::cmp::Reverse(i.0));
    for (_, dir) in images.into_iter().skip(keep) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A finished image in `dir`.
fn open(dir: &Path) -> Result<Image> {
    let text = std::fs::read_to_string(dir.join("manifest.json"))?;
    let manifest: Manifest = serde_json::from_str(&text)?;
    let (kernel, initrd) = (
        dir.join(manifest.kernel_entry.file_name()),
        dir.join("initrd.cpio"),
    );
    anyhow::ensure!(kernel.is_file() && initrd.is_file(), "incomplete image");
    Ok(Image {
        dir: dir.to_path_buf(),
        kernel,
        initrd,
        manifest,
        built: false,
    })
}

/// Build an image into the empty directory `out`.
fn build(
    out: &Path,
    debs: &Path,
    kernel: Package,
    busybox: Package,
    npb: &[u8],
    npb_sha256: String,
) -> Result<()> {
    let unpack = out.join("unpack");
    std::fs::create_dir_all(&unpack)?;
    debian::extract(
        &debian::download(&kernel, debs)?,
        "./boot/vmlinuz-*",
        &unpack,
    )?;
    debian::extract(&debian::download(&busybox, debs)?, "./bin/busybox", &unpack)?;
    let vmlinuz = std::fs::read_dir(unpack.join("boot"))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
        .with_context(|| format!("{} holds no boot/vmlinuz-*", kernel.name))?;
    let kernel_release =
        vmlinuz.file_name().unwrap_or_default().to_string_lossy()["vmlinuz-".len()..].to_string();
    let (kernel_entry, kernel_note) = match pvh::unpack(&std::fs::read(&vmlinuz)?) {
        Ok(elf) => {
            std::fs::write(out.join(KernelEntry::Pvh.file_name()), elf)?;
            (KernelEntry::Pvh, None)
        }
        Err(why) => {
            std::fs::rename(&vmlinuz, out.join(KernelEntry::Bzimage.file_name()))?;
            (KernelEntry::Bzimage, Some(why))
        }
    };
    let busybox_bytes = std::fs::read(unpack.join("bin/busybox"))?;
    let initrd = initramfs(busybox_bytes, npb.to_vec());
    std::fs::write(out.join("initrd.cpio"), &initrd)?;
    std::fs::remove_dir_all(&unpack)?;
    let manifest = Manifest {
        format: FORMAT,
        kernel,
        kernel_release,
        kernel_entry,
        kernel_note,
        busybox,
        npb_sha256,
        initrd_bytes: initrd.len() as u64,
    };
    std::fs::write(
        out.join("manifest.json"),
        serde_json::to_string_pretty(&manifest)?,
    )?;
    Ok(())
}

/// The initramfs: the directories `/init` mounts on, a console device for the kernel to open
/// before devtmpfs is mounted, busybox, `/init` and `preheat-npb`.
pub fn initramfs(busybox: Vec<u8>, npb: Vec<u8>) -> Vec<u8> {
    let dir = |p: &str| Entry::Dir {
        path: p.into(),
        mode: 0o755,
    };
    cpio::archive(&[
        dir("bin"),
        dir("dev"),
        dir("proc"),
        dir("sys"),
        dir("tmp"),
        Entry::CharDev {
            path: "dev/console".into(),
            mode: 0o600,
            major: 5,
            minor: 1,
        },
        Entry::File {
            path: "bin/busybox".into(),
            mode: 0o755,
            data: busybox,
        },
        Entry::File {
            path: "bin/preheat-npb".into(),
            mode: 0o755,
            data: npb,
        },
        Entry::File {
            path: "init".into(),
            mode: 0o755,
            data: INIT.as_bytes().to_vec(),
        },
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkg(name: &str, version: &str) -> Package {
        Package {
            name: name.into(),
            version: version.into(),
        }
    }

    #[test]
    fn prune_keeps_the_newest() {
        let tmp = tempfile::tempdir().unwrap();
        for (i, name) in ["image-a", "image-b", "image-c", "debs"].iter().enumerate() {
            let d = tmp.path().join(name);
            std::fs::create_dir_all(&d).unwrap();
            let f = std::fs::File::create(d.join("manifest.json")).unwrap();
            let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1000 + i as u64);
            f.set_modified(t).unwrap();
        }
        prune_images(tmp.path(), 2);
        let mut left: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["debs", "image-b", "image-c"]);
    }

    #[test]
    fn key_follows_every_part() {
        let (k, b) = (pkg("linux-image-x", "1"), pkg("busybox-static", "1:1.35"));
        let base = key(&k, &b, "aa", true);
        assert_eq!(base.len(), 16);
        assert_eq!(key(&k, &b, "aa", true), base);
        assert_ne!(key(&pkg("linux-image-x", "2"), &b, "aa", true), base);
        assert_ne!(key(&k, &pkg("busybox-static", "1:1.36"), "aa", true), base);
        assert_ne!(key(&k, &b, "ab", true), base);
        assert_ne!(key(&k, &b, "aa", false), base);
    }
}
