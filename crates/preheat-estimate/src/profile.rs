//! Working-set files: reading, atomic writing, and building a profile from recorded lines.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use preheat_model::{
    Backend, BinaryIdent, FileIdent, FilterParams, LineSet, Profile, RegionTable, RequestClass,
    WorkingSet,
};

/// Identity of an executable file given its path.
pub fn file_ident(path: &Path) -> Result<FileIdent> {
    use std::os::unix::fs::MetadataExt;
    let canon = std::fs::canonicalize(path).with_context(|| format!("{}", path.display()))?;
    let md = std::fs::metadata(&canon)?;
    let p = canon.to_string_lossy().into_owned();
    Ok(FileIdent {
        build_id: preheat_engine::maps::elf_build_id(&p).unwrap_or_default(),
        path: p,
        inode: md.ino(),
    })
}

pub(crate) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Keep only the regions the lines use, renumbered.
pub fn make_profile(
    backend: Backend,
    filter: FilterParams,
    exe: FileIdent,
    table: &RegionTable,
    port: u16,
    lines: &LineSet,
) -> Profile {
    let mut used: Vec<u32> = lines.as_slice().iter().map(|l| l.region).collect();
    used.dedup();
    let renumbered =
        LineSet::from_lines(lines.as_slice().iter().map(|l| preheat_model::RegionLine {
            region: used.binary_search(&l.region).unwrap_or(0) as u32,
            line: l.line,
        }));
    Profile {
        binary: BinaryIdent { exe },
        backend,
        filter,
        created_unix_s: now_unix(),
        regions: used
            .iter()
            .map(|r| table.regions[*r as usize].clone())
            .collect(),
        classes: vec![RequestClass {
            port,
            samples: filter.n,
            ws: WorkingSet::from_lines(&renumbered, filter.gap),
        }],
    }
}

/// Whether a profile can be written to `path`, checked before a recording (which takes seconds
/// to minutes) instead of after it.
pub fn check_destination(path: &Path) -> Result<()> {
    preheat_engine::host::check_writable(path)
        .with_context(|| format!("cannot write the profile to {}", path.display()))
}

/// Write a profile atomically: a temporary file in the same directory, fsync, rename.
pub fn write_profile(path: &Path, profile: &Profile) -> Result<()> {
    use std::io::Write;
    let bytes = preheat_model::encode_profile(profile);
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        path.file_name()
            .and_then(|s| s.to_str())
            .unwrap_or("profile"),
        std::process::id()
    ));
    let mut f =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// Read and verify a profile; errors name the file.
pub fn read_profile(path: &Path) -> Result<Profile> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    preheat_model::decode_profile(&bytes)
        .with_context(|| format!("{}: invalid working-set file", path.display()))
}
