//! `/proc/PID/maps`, ELF build-ids and resident pages.
use preheat_model::{FileIdent, Mapping};

/// Parse the text of a maps file (no file identity filled in).
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    let _ = text;
    unimplemented!()
}

/// Read `/proc/<pid>/maps` (or `/proc/self/maps` for `None`) and fill in file identities
/// (inode from the maps line, build-id from the ELF notes; cached per path within the call).
pub fn read_maps(pid: Option<u32>) -> std::io::Result<Vec<Mapping>> {
    let _ = pid;
    unimplemented!()
}

/// GNU build-id of an ELF file (`.note.gnu.build-id` / PT_NOTE), `None` if absent or not ELF.
pub fn elf_build_id(path: &str) -> Option<Vec<u8>> {
    let _ = path;
    unimplemented!()
}

/// Identity of the executable of `pid` (`/proc/<pid>/exe`).
pub fn exe_ident(pid: Option<u32>) -> std::io::Result<FileIdent> {
    let _ = pid;
    unimplemented!()
}

/// Resident sub-ranges of `[start, start+len)` in this process (mincore), as (start, len).
pub fn resident_ranges(start: u64, len: u64) -> Vec<(u64, u64)> {
    let _ = (start, len);
    unimplemented!()
}
