//! Locating Valgrind and building the phtrace tool on first use.
//!
//! The C source and Makefile are embedded in the crate, so the `preheat` binary works from any
//! directory and `cargo build` works on machines without Valgrind. On first use the tool is built
//! with `make` into a cache directory, `$PREHEAT_CACHE_DIR/phtrace-<hash>` (default
//! `$XDG_CACHE_HOME/preheat`, then `~/.cache/preheat`), where `<hash>` covers the sources, the
//! platform and the installed Valgrind's static libraries, so a Valgrind upgrade rebuilds. That
//! directory doubles as `VALGRIND_LIB`: it holds the tool next to symlinks to every file of the
//! installed Valgrind's library directory (`vgpreload_core-*.so`, `default.supp`, …).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::TraceError;

const SOURCE: &str = include_str!("../valgrind/phtrace.c");
const MAKEFILE: &str = include_str!("../valgrind/Makefile");

/// Valgrind's name of the tool (`valgrind --tool=phtrace`).
pub const TOOL_NAME: &str = "phtrace";

/// Where the built tool is and how to run it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolPaths {
    /// The `valgrind` launcher.
    pub valgrind: PathBuf,
    /// The directory to export as `VALGRIND_LIB`: holds `phtrace-<platform>` and links to the
    /// installed Valgrind's files.
    pub lib_dir: PathBuf,
}

fn missing(what: impl Into<String>, package: &'static str) -> TraceError {
    TraceError::Missing {
        what: what.into(),
        package,
    }
}

/// Valgrind's architecture name for this build.
fn vg_arch() -> Result<&'static str, TraceError> {
    match std::env::consts::ARCH {
        "x86_64" => Ok("amd64"),
        "aarch64" => Ok("arm64"),
        other => Err(TraceError::UnsupportedArch(other)),
    }
}

fn multiarch() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "aarch64-linux-gnu",
        _ => "x86_64-linux-gnu",
    }
}

/// What the tool lookup depends on from the environment (a parameter so tests can vary it).
struct Env {
    path: Option<OsString>,
    valgrind_lib: Option<OsString>,
    cache_root: PathBuf,
}

impl Env {
    fn from_process() -> Env {
        Env {
            path: std::env::var_os("PATH"),
            valgrind_lib: std::env::var_os("VALGRIND_LIB"),
            cache_root: preheat_engine::host::cache_dir(),
        }
    }

    /// First file called `name` on the search path.
    fn which(&self, name: &str) -> Option<PathBuf> {
        let path = self.path.as_ref()?;
        preheat_engine::host::find_in(name, &std::env::split_paths(path).collect::<Vec<_>>())
    }
}

/// The prefix Valgrind was installed under (`/usr` for `/usr/bin/valgrind`).
fn prefix_of(valgrind: &Path) -> PathBuf {
    let real = std::fs::canonicalize(valgrind).unwrap_or_else(|_| valgrind.to_path_buf());
    real.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("/usr"))
}

fn first_with(candidates: &[PathBuf], file: &str) -> Option<PathBuf> {
    candidates.iter().find(|d| d.join(file).is_file()).cloned()
}

/// `valt_load_address` from Valgrind's pkg-config file, else the amd64/arm64 default.
fn load_address(prefix: &Path) -> String {
    let pc_dirs = [
        prefix.join("lib").join(multiarch()).join("pkgconfig"),
        prefix.join("lib/pkgconfig"),
        prefix.join("lib64/pkgconfig"),
        prefix.join("share/pkgconfig"),
    ];
    for d in pc_dirs {
        if let Ok(text) = std::fs::read_to_string(d.join("valgrind.pc")) {
            for line in text.lines() {
                if let Some(v) = line.trim().strip_prefix("valt_load_address=") {
                    let v = v.trim();
                    if v.starts_with("0x") && v.len() > 2 {
                        return v.to_string();
                    }
                }
            }
        }
    }
    "0x58000000".to_string()
}

/// FNV-1a, 64 bit: a stable hash for the cache directory name.
fn fnv1a(h: &mut u64, bytes: &[u8]) {
    for b in bytes {
        *h ^= u64::from(*b);
        *h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
}

fn file_stamp(p: &Path) -> String {
    match std::fs::metadata(p) {
        Ok(m) => {
            let mtime = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            format!("{}:{}:{}", p.display(), m.len(), mtime)
        }
        Err(_) => p.display().to_string(),
    }
}

struct Install {
    valgrind: PathBuf,
    /// Installed directory with `vgpreload_core-<platform>.so` and friends.
    libexec: PathBuf,
    include: PathBuf,
    static_libs: PathBuf,
    arch: &'static str,
    load_address: String,
}

fn locate(env: &Env) -> Result<Install, TraceError> {
    let arch = vg_arch()?;
    let platform = format!("{arch}-linux");
    let valgrind = env
        .which("valgrind")
        .ok_or_else(|| missing("the `valgrind` executable", "valgrind"))?;
    let prefix = prefix_of(&valgrind);
    let lib_candidates = [
        prefix.join("libexec/valgrind"),
        prefix.join("lib").join(multiarch()).join("valgrind"),
        prefix.join("lib/valgrind"),
        prefix.join("lib64/valgrind"),
    ];
    let preload = format!("vgpreload_core-{platform}.so");
    let libexec = env
        .valgrind_lib
        .as_ref()
        .map(PathBuf::from)
        .filter(|d| {
            d.join(&preload).is_file() && !d.join(format!("{TOOL_NAME}-{platform}")).exists()
        })
        .or_else(|| first_with(&lib_candidates, &preload))
        .ok_or_else(|| {
            missing(
                format!("Valgrind's library directory ({preload})"),
                "valgrind",
            )
        })?;
    let include =
        first_with(&[prefix.join("include/valgrind")], "pub_tool_basics.h").ok_or_else(|| {
            missing(
                format!(
                    "the Valgrind tool headers ({}/include/valgrind/pub_tool_basics.h)",
                    prefix.display()
                ),
                "valgrind",
            )
        })?;
    let coregrind = format!("libcoregrind-{platform}.a");
    let static_libs = first_with(&lib_candidates, &coregrind)
        .filter(|d| d.join(format!("libvex-{platform}.a")).is_file())
        .ok_or_else(|| {
            missing(
                format!("Valgrind's static libraries ({coregrind}, libvex-{platform}.a)"),
                "valgrind",
            )
        })?;
    Ok(Install {
        valgrind,
        libexec,
        include,
        static_libs,
        arch,
        load_address: load_address(&prefix),
    })
}

/// Build (once) or locate the phtrace tool.
///
/// Errors with [`TraceError::Missing`] naming the missing piece and its Debian package when
/// `valgrind` (launcher, tool headers or static libraries), `gcc` or `make` is not installed;
/// [`TraceError::is_unavailable`] tells the caller to report the trace backend as unavailable.
pub fn ensure_tool() -> Result<ToolPaths, TraceError> {
    ensure_tool_in(&Env::from_process())
}

fn ensure_tool_in(env: &Env) -> Result<ToolPaths, TraceError> {
    let inst = locate(env)?;
    let platform = format!("{}-linux", inst.arch);
    let tool_file = format!("{TOOL_NAME}-{platform}");

    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for part in [
        SOURCE,
        MAKEFILE,
        &platform,
        &inst.load_address,
        &inst.libexec.display().to_string(),
        &inst.include.display().to_string(),
        &file_stamp(&inst.static_libs.join(format!("libcoregrind-{platform}.a"))),
        &file_stamp(&inst.static_libs.join(format!("libvex-{platform}.a"))),
    ] {
        fnv1a(&mut h, part.as_bytes());
        fnv1a(&mut h, &[0]);
    }
    let root = &env.cache_root;
    let dir = root.join(format!("{TOOL_NAME}-{h:016x}"));
    let done = |d: &Path| d.join(&tool_file).is_file() && d.join(".complete").is_file();
    if done(&dir) {
        return Ok(ToolPaths {
            valgrind: inst.valgrind,
            lib_dir: dir,
        });
    }

    // Only now require the compilers: a cached tool needs none.
    let gcc = env
        .which("gcc")
        .ok_or_else(|| missing("the C compiler `gcc`", "gcc"))?;
    let make = env.which("make").ok_or_else(|| missing("`make`", "make"))?;

    std::fs::create_dir_all(root)
        .map_err(|e| TraceError::io(format!("creating {}", root.display()), e))?;
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = root.join(format!(
        ".{TOOL_NAME}-{h:016x}.tmp.{}.{nonce}",
        std::process::id()
    ));
    let result = build_into(&tmp, &inst, &gcc, &make, &tool_file);
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    // Publish atomically; if another process won the race, use its directory.
    if let Err(e) = std::fs::rename(&tmp, &dir) {
        let _ = std::fs::remove_dir_all(&tmp);
        if !done(&dir) {
            return Err(TraceError::io(
                format!("moving the built tool to {}", dir.display()),
                e,
            ));
        }
    }
    Ok(ToolPaths {
        valgrind: inst.valgrind,
        lib_dir: dir,
    })
}

fn build_into(
    tmp: &Path,
    inst: &Install,
    gcc: &Path,
    make: &Path,
    tool_file: &str,
) -> Result<(), TraceError> {
    let io = |what: &str, e| TraceError::io(format!("{what} in {}", tmp.display()), e);
    std::fs::create_dir_all(tmp).map_err(|e| io("creating the build directory", e))?;
    let src_dir = tmp.join("src");
    std::fs::create_dir_all(&src_dir).map_err(|e| io("creating src", e))?;
    std::fs::write(src_dir.join("phtrace.c"), SOURCE).map_err(|e| io("writing phtrace.c", e))?;
    std::fs::write(src_dir.join("Makefile"), MAKEFILE).map_err(|e| io("writing Makefile", e))?;

    let output = Command::new(make)
        .arg("-C")
        .arg(&src_dir)
        .arg(format!("CC={}", gcc.display()))
        .arg(format!("VG_INCDIR={}", inst.include.display()))
        .arg(format!("VG_LIBDIR={}", inst.static_libs.display()))
        .arg(format!("VG_ARCH={}", inst.arch))
        .arg(format!("VG_LOAD_ADDR={}", inst.load_address))
        .arg(format!("OUT={}", tmp.display()))
        .output()
        .map_err(|e| io("running make", e))?;
    if !output.status.success() || !tmp.join(tool_file).is_file() {
        return Err(TraceError::Build {
            dir: tmp.display().to_string(),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        });
    }
    let _ = std::fs::remove_file(tmp.join("phtrace.o"));

    // Make the directory a complete VALGRIND_LIB.
    let entries = std::fs::read_dir(&inst.libexec)
        .map_err(|e| TraceError::io(format!("listing {}", inst.libexec.display()), e))?;
    for entry in entries {
        let entry =
            entry.map_err(|e| TraceError::io(format!("listing {}", inst.libexec.display()), e))?;
        let name = entry.file_name();
        let name_str = name.to_string_lossy();
        if name_str.starts_with(&format!("{TOOL_NAME}-")) || name_str == "src" {
            continue;
        }
        std::os::unix::fs::symlink(entry.path(), tmp.join(&name))
            .map_err(|e| io(&format!("linking {name_str}"), e))?;
    }
    std::fs::write(tmp.join(".complete"), "phtrace\n").map_err(|e| io("writing .complete", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_with(tools: &[&str], cache: &Path) -> (tempfile::TempDir, Env) {
        let bin = tempfile::tempdir().unwrap();
        let real = Env::from_process();
        for t in tools {
            if let Some(p) = real.which(t) {
                std::os::unix::fs::symlink(p, bin.path().join(t)).unwrap();
            }
        }
        let env = Env {
            path: Some(bin.path().as_os_str().to_owned()),
            valgrind_lib: None,
            cache_root: cache.to_path_buf(),
        };
        (bin, env)
    }

    #[test]
    fn missing_valgrind_is_reported_with_its_package() {
        let cache = tempfile::tempdir().unwrap();
        let (_bin, env) = env_with(&["gcc", "make"], cache.path());
        let err = ensure_tool_in(&env).unwrap_err();
        assert!(err.is_unavailable(), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("`valgrind`") && msg.contains("Debian package `valgrind`"),
            "{msg}"
        );
    }

    #[test]
    fn missing_compiler_or_make_is_reported_when_a_build_is_needed() {
        let real = Env::from_process();
        if real.which("valgrind").is_none() || locate(&real).is_err() {
            preheat_testsupport::skip("valgrind", "valgrind or its tool files are not installed");
            return;
        }
        let cache = tempfile::tempdir().unwrap();
        let (_bin, env) = env_with(&["valgrind", "make"], cache.path());
        let err = ensure_tool_in(&env).unwrap_err();
        assert!(err.is_unavailable());
        assert!(err.to_string().contains("Debian package `gcc`"), "{err}");
        let (_bin, env) = env_with(&["valgrind", "gcc"], cache.path());
        let err = ensure_tool_in(&env).unwrap_err();
        assert!(err.to_string().contains("Debian package `make`"), "{err}");
        // Nothing half-built is left behind.
        assert_eq!(
            std::fs::read_dir(cache.path())
                .map(|d| d.count())
                .unwrap_or(0),
            0
        );
    }

    #[test]
    fn fnv_is_stable() {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        fnv1a(&mut h, b"a");
        assert_eq!(h, 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn embedded_sources_are_the_tool() {
        assert!(SOURCE.contains("VG_DETERMINE_INTERFACE_VERSION"));
        assert!(MAKEFILE.contains("phtrace-$(PLATFORM)"));
    }
}
