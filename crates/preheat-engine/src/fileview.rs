//! Another process's file-backed, read-only memory seen through mappings of the same files in
//! this process: the same page-cache pages, hence the same physical cache lines. The
//! flush+reload probe ([`crate::probe`]) and the preheat walk ([`crate::preheat`]) work on them
//! from outside the process — how `preheat-outside` records and loads the code and read-only
//! data lines of a server the agent cannot enter (a static binary, a Go program).
//!
//! What it covers, and what not:
//!
//! * Each readable, non-writable, file-backed mapping of the process (text, read-only data) is
//!   mapped here from the same file (`/proc/PID/map_files/…`, the very inode the process maps)
//!   at the same offset. Pages a process wrote (relocated read-only data of a dynamic program:
//!   private copies since) are not the file's: [`FileView::resident`] keeps only pages the
//!   process's page table maps to the page cache (`/proc/PID/pagemap`), present now.
//! * Anonymous memory (heap, stacks, a Go heap) is not reachable this way: its lines can neither
//!   be flushed nor timed from another process.
//! * Our mappings are private and read-only, never written, so they stay the file's pages. A
//!   file truncated below a mapped page while we hold the view makes a load of that page raise
//!   SIGBUS in *this* process (the observed process is unaffected); the executable of a running
//!   program is not normally rewritten in place.
//!
//! Needs the rights to read `/proc/PID/map_files` and `/proc/PID/pagemap` of the process (root,
//! or `CAP_SYS_ADMIN` and ptrace access).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use preheat_model::proto::Range;
use preheat_model::Mapping;

use crate::probe::{self, Phase};

const PAGE: u64 = 4096;

/// One of the process's mappings, mapped here too.
struct View {
    /// The process's mapping (its addresses).
    remote: Mapping,
    /// Where the same file range starts here.
    local: u64,
    /// Bytes mapped here (the remote mapping, clipped to the file's pages).
    len: u64,
}

/// The file-backed, read-only mappings of one process, mapped here (see the module docs).
/// Dropping it unmaps them.
pub struct FileView {
    pid: u32,
    views: Vec<View>,
}

// SAFETY: the views are read-only mappings owned by the FileView (unmapped only on drop); they
// hold addresses, no thread-bound state, and are never written through.
unsafe impl Send for FileView {}
// SAFETY: as above; every method takes `&self` and only reads or flushes the mappings.
unsafe impl Sync for FileView {}

impl FileView {
    /// Map the readable, non-writable, file-backed mappings of `pid` (special mappings such as
    /// `[vdso]` have no file and are left out). Mappings whose file cannot be opened are left out
    /// too; none at all is an error that says why.
    pub fn open(pid: u32) -> io::Result<FileView> {
        let maps = crate::maps::read_maps(Some(pid))?;
        let mut views = Vec::new();
        let mut first_err = None;
        for m in maps {
            if !m.read || m.write || m.file.is_none() || m.is_empty() {
                continue;
            }
            match map_one(pid, &m) {
                Ok(Some((local, len))) => views.push(View {
                    remote: m,
                    local,
                    len,
                }),
                Ok(None) => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if views.is_empty() {
            return Err(first_err.unwrap_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("pid {pid} has no readable, read-only file-backed mapping"),
                )
            }));
        }
        Ok(FileView { pid, views })
    }

    /// Bytes mapped.
    pub fn bytes(&self) -> u64 {
        self.views.iter().map(|v| v.len).sum()
    }

    /// The process's mappings as seen here: each view with *our* addresses and the process's
    /// file offset and identity (what [`preheat_model::RegionTable`] needs to resolve a profile
    /// recorded against the process into runs of our mappings).
    pub fn local_mappings(&self) -> Vec<Mapping> {
        self.views
            .iter()
            .map(|v| Mapping {
                start: v.local,
                end: v.local + v.len,
                ..v.remote.clone()
            })
            .collect()
    }

    /// The process's pages under the views that are present and backed by the page cache now
    /// (`/proc/PID/pagemap`), as ranges of the process's addresses, at most `cap` bytes.
    pub fn resident(&self, cap: u64) -> io::Result<Vec<Range>> {
        let pagemap = File::open(format!("/proc/{}/pagemap", self.pid))?;
        let mut out: Vec<Range> = Vec::new();
        let mut total = 0u64;
        let mut buf = Vec::new();
        for v in &self.views {
            let pages = v.len / PAGE;
            buf.resize(pages as usize * 8, 0u8);
            pagemap.read_exact_at(&mut buf, v.remote.start / PAGE * 8)?;
            // Ranges never span two mappings.
            let first = out.len();
            for (i, e) in buf.chunks_exact(8).enumerate() {
                if total >= cap {
                    return Ok(out);
                }
                let e = u64::from_le_bytes(e.try_into().unwrap_or_default());
                // Bit 63: present; bit 61: a file page (or shared anonymous).
                if (e >> 63) & 1 == 0 || (e >> 61) & 1 == 0 {
                    continue;
                }
                let a = v.remote.start + i as u64 * PAGE;
                total += PAGE;
                let this_view = out.len() > first;
                match out.last_mut() {
                    Some(r) if this_view && r.start + r.len == a => r.len += PAGE,
                    _ => out.push(Range {
                        start: a,
                        len: PAGE,
                    }),
                }
            }
        }
        Ok(out)
    }

    /// `remote` (the process's addresses) as ranges here, with the offset that maps each back
    /// (`remote = local + delta`, wrapping); parts outside every view are left out.
    fn to_local(&self, remote: &[Range]) -> (Vec<Range>, Vec<(u64, u64, u64)>) {
        let mut local = Vec::new();
        let mut back = Vec::new();
        for r in remote {
            let (a, b) = (r.start, r.start.saturating_add(r.len));
            for v in &self.views {
                let lo = a.max(v.remote.start);
                let hi = b.min(v.remote.start + v.len);
                if lo < hi {
                    let l = v.local + (lo - v.remote.start);
                    local.push(Range {
                        start: l,
                        len: hi - lo,
                    });
                    back.push((l, hi - lo, v.remote.start.wrapping_sub(v.local)));
                }
            }
        }
        (local, back)
    }

    /// [`probe::prepare_phase`] on the lines of `remote` (the process's addresses) through the
    /// views.
    pub fn prepare_phase(&self, remote: &[Range], phase: Phase) {
        let (local, _) = self.to_local(remote);
        // SAFETY: `local` lies inside our own read-only private file mappings (clipped to the
        // file's pages at `open`), which stay mapped while `self` lives. Only a file truncated
        // since could fault (SIGBUS, see the module docs).
        let _ = unsafe { probe::prepare_phase(&local, phase) };
    }

    /// [`probe::reload_phase`] on the lines of `remote` through the views; the hits are pushed
    /// to `hits` as the process's addresses. Returns the lines probed.
    pub fn reload_phase(
        &self,
        remote: &[Range],
        threshold: u32,
        window_pages: u32,
        seed: u64,
        phase: Phase,
        hits: &mut Vec<u64>,
    ) -> u64 {
        let (local, back) = self.to_local(remote);
        let from = hits.len();
        // SAFETY: as in `prepare_phase`: our own mappings, alive while `self` lives.
        let probed =
            unsafe { probe::reload_phase(&local, threshold, window_pages, seed, phase, hits) }
                .unwrap_or(0);
        for h in &mut hits[from..] {
            if let Some(&(_, _, delta)) = back.iter().find(|(l, n, _)| *h >= *l && *h < l + n) {
                *h = h.wrapping_add(delta);
            }
        }
        probed
    }
}

impl Drop for FileView {
    fn drop(&mut self) {
        for v in &self.views {
            // SAFETY: `local..local + len` is a mapping made by `map_one` and owned by this
            // view; nothing refers to it after the view is dropped.
            unsafe { libc::munmap(v.local as *mut libc::c_void, v.len as usize) };
        }
    }
}

/// Map `m` of `pid` here from the same file (the inode the process maps, through
/// `/proc/PID/map_files`), clipped to the file's pages; `None` where none of it lies in the
/// file.
fn map_one(pid: u32, m: &Mapping) -> io::Result<Option<(u64, u64)>> {
    let f = File::open(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end))?;
    let size = f.metadata()?.len();
    let file_pages_end = size.div_ceil(PAGE) * PAGE;
    let len = m.len().min(file_pages_end.saturating_sub(m.offset));
    if len == 0 {
        return Ok(None);
    }
    // SAFETY: a new read-only private mapping of an open file at a page-aligned offset (from
    // /proc/PID/maps) chosen by the kernel; it overlaps nothing of ours.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            f.as_raw_fd(),
            m.offset as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(Some((p as u64, len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_this_process_code_as_the_same_file_pages() {
        let pid = std::process::id();
        let v = match FileView::open(pid) {
            Ok(v) => v,
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                return preheat_testsupport::skip!("map_files", "needs CAP_SYS_ADMIN: {e}");
            }
            Err(e) => panic!("{e}"),
        };
        assert!(v.bytes() > 0);
        // This test's own code is in a view: the address of this function, translated, reads
        // the same bytes here as there.
        let f = views_this_process_code_as_the_same_file_pages as *const () as u64;
        let (local, back) = v.to_local(&[Range { start: f, len: 16 }]);
        assert_eq!(local.len(), 1, "the test's code is not in a view");
        assert_eq!(local[0].start.wrapping_add(back[0].2), f);
        // SAFETY: both are 16 readable bytes: our own code and its view.
        let (a, b) = unsafe {
            (
                std::slice::from_raw_parts(f as *const u8, 16),
                std::slice::from_raw_parts(local[0].start as *const u8, 16),
            )
        };
        assert_eq!(a, b);
        // Our mappings carry the process's file identity and offsets.
        let lm = v.local_mappings();
        assert!(lm
            .iter()
            .any(|m| m.file.is_some() && local[0].start >= m.start && local[0].start < m.end));
        // The code page is resident and a file page.
        let res = v.resident(u64::MAX).unwrap();
        assert!(res.iter().any(|r| f >= r.start && f < r.start + r.len));
    }

    /// Cache timing: run alone in the suite's timing pass.
    mod timing {
        use super::super::*;

        #[test]
        fn probing_through_a_view_sees_what_the_process_touched() {
            let pid = std::process::id();
            // Flush, touch and reload on one CPU (another core's cache may read as a miss).
            crate::os::pin_current_thread(0).unwrap();
            let Ok(v) = FileView::open(pid) else {
                return preheat_testsupport::skip!(
                    "map_files",
                    "cannot open a file view of itself"
                );
            };
            let res = v.resident(8 << 20).unwrap();
            let Some(r) = res.iter().find(|r| r.len >= 64 * PAGE).copied() else {
                return preheat_testsupport::skip!(
                    "resident",
                    "no 64 resident file pages in a row"
                );
            };
            let r = Range {
                start: r.start,
                len: 64 * PAGE,
            };
            let cal = probe::calibrate(256);
            // Stride 4 over the 256 KiB: flush the probed lines, touch one of them through the
            // process's own address (not the view), reload through the view.
            let phase = Phase {
                stride: 4,
                phase: 0,
            };
            let touched = r.start + 17 * PAGE + 4 * 64 * 5;
            let mut seen = 0;
            for round in 0..8 {
                v.prepare_phase(&[r], phase);
                // SAFETY: a resident page of this process's read-only file mapping.
                unsafe { std::ptr::read_volatile(touched as *const u8) };
                let mut hits = Vec::new();
                let probed = v.reload_phase(&[r], cal.threshold, 16, round, phase, &mut hits);
                assert_eq!(probed, 64 * PAGE / 64 / 4);
                assert!(hits.iter().all(|h| *h >= r.start && *h < r.start + r.len));
                seen += u32::from(hits.contains(&touched));
            }
            assert!(
                seen >= 6,
                "the touched line read as a hit in {seen} of 8 rounds"
            );
        }
    }
}
