//! The `hybrid` recording backend: code lines from the exact native `step` backend, data lines
//! from the flush+reload `probe`, both recorded on the same server process and merged into one
//! profile.
//!
//! Why: the probe over-reports code lines (the instruction prefetcher of our CPUs cannot be
//! turned off, so lines next to executed ones read back as cached; measured code precision
//! 0.30–0.45 against native execution), while `step` sees exactly the instructions the serving
//! thread executes but no data. A line of a file is *code* when it lies in an executable ELF
//! load segment of the file (`crate::compare::CodeLines`, the classification `preheat ws compare`
//! scores with; a file page shared by a read-only and an executable segment is mapped twice,
//! and its lines count as code), a line of anonymous memory when it lies in an executable
//! mapping; everything else is *data*. The probe's code lines are dropped (counted), the step's lines that are not
//! in an executable mapping (none expected) are dropped too (counted).
//!
//! Permission: `step` needs ptrace on the server's serving thread. [`ptrace_denied`] tells
//! beforehand when the kernel's policy forbids it (Yama `ptrace_scope` 3, or 2 without
//! `CAP_SYS_PTRACE`); the attach itself may still fail (containers, seccomp), which `auto` turns
//! into a fallback to the probe's profile with a one-line note and `--backend hybrid` into an
//! error.

use anyhow::{bail, Context, Result};
use preheat_model::{Backend, LineSet, Profile, RegionKey, RegionLine, RegionTable};

use crate::compare::CodeLines;
use crate::exact::record_step;
use crate::params::{HybridStats, RecordParams, Recording};
use crate::profile::{make_profile, write_profile};
use crate::record::record_probe;
use crate::serving::connect_served_by;
use preheat_launch::launch::Server;
use preheat_launch::progress::Progress;
use preheat_launch::servers::Workload;

/// How long the default backend's stepping may take at most (see [`record_step`]), and the
/// whole recording it should fit in; the step's own start (its warm-up, the attach) is
/// reckoned at a few seconds.
const AUTO_STEP_BUDGET: std::time::Duration = std::time::Duration::from_secs(10);
const AUTO_RECORD_GOAL: std::time::Duration = std::time::Duration::from_secs(60);
const AUTO_STEP_START: std::time::Duration = std::time::Duration::from_secs(5);

/// Test hook: pretend Yama's `ptrace_scope` has this value (0–3), so the refusal path can be
/// tested on machines that permit ptrace.
const SCOPE_OVERRIDE_ENV: &str = "PREHEAT_PTRACE_SCOPE";

/// Why ptrace of the server would be refused by policy, `None` when it is permitted (or the
/// policy cannot tell: the attach may still fail).
pub fn ptrace_denied() -> Option<String> {
    let scope = std::env::var(SCOPE_OVERRIDE_ENV)
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok())
        .and_then(|s| s.trim().parse::<u8>().ok());
    let cap = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        })
        .map(|caps| caps & (1 << 19) != 0) // CAP_SYS_PTRACE
        .unwrap_or(false);
    verdict(scope, cap)
}

/// The Yama policy (Documentation/admin-guide/LSM/Yama.rst): 0 and 1 allow tracing our own
/// child (the recorded server is one), 2 needs `CAP_SYS_PTRACE`, 3 forbids all.
fn verdict(scope: Option<u8>, cap_sys_ptrace: bool) -> Option<String> {
    match scope {
        Some(3) => Some("kernel.yama.ptrace_scope is 3 (ptrace disabled for everyone)".into()),
        Some(2) if !cap_sys_ptrace => Some(
            "kernel.yama.ptrace_scope is 2 and this process lacks CAP_SYS_PTRACE (run as root)"
                .into(),
        ),
        _ => None,
    }
}

/// Record with the probe and then with `step` on the same server process, and merge. With
/// `required` false (`--backend auto`), a failing `step` leaves the probe's profile, with a note
/// on stderr.
pub fn record_hybrid(
    server: &Server,
    pid: u32,
    w: &Workload,
    p: &RecordParams,
    required: bool,
    parts: Option<&std::path::Path>,
    progress: &dyn Progress,
) -> Result<Recording> {
    let t0 = std::time::Instant::now();
    // The probe's connection is closed before `step` opens its own (a prefork worker that
    // serves one connection at a time could not take the second).
    let probe = record_probe(
        server,
        pid,
        w,
        p,
        &mut connect_served_by(server, pid, w)?,
        progress,
    )?;
    let write_part = |name: &str, prof: &Profile| -> Result<()> {
        if let Some(dir) = parts {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            write_profile(&dir.join(name), prof)?;
        }
        Ok(())
    };
    write_part("probe.phws", &probe.profile)?;
    // Recorded by default (not `required`), the stepping gets a budget: a managed runtime's
    // request takes seconds to minutes to single-step (after the probe's requests Node.js
    // 0.40 M instructions, 7.4 s, the JVM 0.12 M, 2.3 s; Node.js unwarmed 4.8 M, 93 s), and the
    // recording should end within a minute (what the probe left of it, less the step's own
    // start); a C server's takes well under a second.
    let left = AUTO_RECORD_GOAL.saturating_sub(t0.elapsed() + AUTO_STEP_START);
    let budget = (!required).then_some(AUTO_STEP_BUDGET.min(left));
    if budget.is_some_and(|b| b < AUTO_STEP_BUDGET / 10) {
        eprintln!(
            "preheat: note: the probe took {:.0} s, which leaves no time to single-step within \
             a minute; keeping the probe's profile (its code lines are over-reported; \
             `--backend hybrid` steps anyway)",
            t0.elapsed().as_secs_f64()
        );
        return Ok(probe);
    }
    let mut step = match record_step(server, pid, w, p, budget, progress) {
        Ok(s) => s,
        Err(e) if !required => {
            eprintln!(
                "preheat: note: the step backend failed ({e:#}); keeping the probe's profile (its code lines are over-reported)"
            );
            return Ok(probe);
        }
        Err(e) => return Err(e.context("hybrid backend: recording code lines with step")),
    };
    write_part("step.phws", &step.profile)?;
    let table = RegionTable::build(
        preheat_engine::maps::read_maps(Some(pid)).context("reading the server's mappings")?,
    );
    let (lines, hs) = merge(&step.profile, &probe.profile, &table, server.spec.port)?;
    let mut stats = probe.stats.clone();
    stats.backend = "hybrid".into();
    stats.requests_sent += step.stats.requests_sent;
    stats.seconds += step.stats.seconds;
    stats.unmapped_hits += step.stats.unmapped_hits;
    stats.step_instructions = std::mem::take(&mut step.stats.step_instructions);
    stats.step_seconds = step.stats.step_seconds;
    stats.hybrid = Some(hs);
    Ok(Recording {
        profile: make_profile(
            Backend::Hybrid,
            probe.profile.filter,
            probe.profile.binary.exe.clone(),
            &table,
            server.spec.port,
            &lines,
        ),
        stats,
    })
}

/// The lines of `p`'s class for `port`, relative to `table` (regions matched by key), and how
/// many lines had no region in `table`.
fn lines_in(p: &Profile, port: u16, table: &RegionTable) -> Result<(Vec<RegionLine>, u64)> {
    let class = p
        .class(port)
        .with_context(|| format!("no working set for port {port}"))?;
    let mut out = Vec::new();
    let mut unmapped = 0u64;
    for rr in &class.ws.regions {
        let key = p.regions.get(rr.region as usize);
        let cur = key.and_then(|k| table.regions.iter().position(|r| r == k));
        for run in &rr.runs {
            match cur {
                Some(c) => out.extend((run.start..run.end()).map(|line| RegionLine {
                    region: c as u32,
                    line,
                })),
                None => unmapped += run.len as u64,
            }
        }
    }
    Ok((out, unmapped))
}

/// Whether `l` is code: in a file, a line of an executable ELF load segment (the classification
/// `ws compare` scores with); in anonymous memory, a line of an executable mapping. `None` when
/// it is not mapped. A file without readable ELF segments: by its mapping, as anonymous memory.
fn is_exec(table: &RegionTable, code: &mut CodeLines, l: RegionLine) -> Option<bool> {
    let a = table.to_absolute(l.region, l.line)?;
    let i = table.mapping_of(a)?;
    Some(match &table.regions[l.region as usize] {
        RegionKey::File(f) => code
            .classify(&f.path, l.line)
            .unwrap_or(table.mappings[i].exec),
        RegionKey::Anon { .. } => table.mappings[i].exec,
    })
}

/// Code lines of `code` (executable mappings only) united with data lines of `data`
/// (everything else), relative to `table`.
pub fn merge(
    code: &Profile,
    data: &Profile,
    table: &RegionTable,
    port: u16,
) -> Result<(LineSet, HybridStats)> {
    let mut hs = HybridStats::default();
    let (c, cu) = lines_in(code, port, table).context("step profile")?;
    let (d, du) = lines_in(data, port, table).context("probe profile")?;
    hs.unmapped_dropped = cu + du;
    let mut cl = CodeLines::default();
    let mut keep = Vec::with_capacity(c.len() + d.len());
    for l in c {
        match is_exec(table, &mut cl, l) {
            Some(true) => {
                hs.code_lines += 1;
                keep.push(l);
            }
            Some(false) => hs.step_non_exec_dropped += 1,
            None => hs.unmapped_dropped += 1,
        }
    }
    for l in d {
        match is_exec(table, &mut cl, l) {
            Some(false) => {
                hs.data_lines += 1;
                keep.push(l);
            }
            Some(true) => hs.probe_code_lines_dropped += 1,
            None => hs.unmapped_dropped += 1,
        }
    }
    if hs.code_lines == 0 {
        bail!("hybrid backend: the step recording has no code lines in executable mappings");
    }
    Ok((LineSet::from_lines(keep), hs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use preheat_model::{BinaryIdent, FileIdent, FilterParams, Mapping, RequestClass, WorkingSet};

    fn file(start: u64, end: u64, offset: u64, exec: bool) -> Mapping {
        Mapping {
            start,
            end,
            read: true,
            write: !exec,
            exec,
            shared: false,
            offset,
            name: "/srv/bin".into(),
            file: Some(FileIdent {
                path: "/srv/bin".into(),
                inode: 7,
                build_id: vec![1],
            }),
        }
    }

    fn heap(start: u64, end: u64) -> Mapping {
        Mapping {
            start,
            end,
            read: true,
            write: true,
            exec: false,
            shared: false,
            offset: 0,
            name: "[heap]".into(),
            file: None,
        }
    }

    fn profile(table: &RegionTable, lines: &[(u32, u64)]) -> Profile {
        let set = LineSet::from_lines(lines.iter().map(|(region, line)| RegionLine {
            region: *region,
            line: *line,
        }));
        Profile {
            binary: BinaryIdent {
                exe: FileIdent {
                    path: "/srv/bin".into(),
                    inode: 7,
                    build_id: vec![1],
                },
            },
            backend: Backend::Probe,
            filter: FilterParams::default(),
            created_unix_s: 0,
            regions: table.regions.clone(),
            classes: vec![RequestClass {
                port: 80,
                samples: 8,
                ws: WorkingSet::from_lines(&set, 0),
            }],
        }
    }

    #[test]
    fn merge_takes_code_from_step_and_data_from_probe() {
        // Text at file offset 0 (64 lines), data at file offset 0x1000 (64 lines), a heap.
        let table = RegionTable::build(vec![
            file(0x10000, 0x11000, 0, true),
            file(0x11000, 0x12000, 0x1000, false),
            heap(0x20000, 0x21000),
        ]);
        assert!(matches!(table.regions[0], RegionKey::File(_)));
        // step: code lines 1, 2, 3; the probe: code 1..10 (prefetcher), data 64+5, heap 9.
        let step = profile(&table, &[(0, 1), (0, 2), (0, 3)]);
        let mut probe_lines: Vec<(u32, u64)> = (1..10).map(|l| (0, l)).collect();
        probe_lines.extend([(0, 69), (1, 9)]);
        let probe = profile(&table, &probe_lines);
        let (lines, hs) = merge(&step, &probe, &table, 80).unwrap();
        let got: Vec<(u32, u64)> = lines
            .as_slice()
            .iter()
            .map(|l| (l.region, l.line))
            .collect();
        assert_eq!(got, vec![(0, 1), (0, 2), (0, 3), (0, 69), (1, 9)]);
        assert_eq!(
            hs,
            HybridStats {
                code_lines: 3,
                data_lines: 2,
                probe_code_lines_dropped: 9,
                step_non_exec_dropped: 0,
                unmapped_dropped: 0,
            }
        );
    }

    #[test]
    fn yama_policy() {
        assert_eq!(verdict(None, false), None);
        assert_eq!(verdict(Some(0), false), None);
        assert_eq!(verdict(Some(1), false), None);
        assert_eq!(verdict(Some(2), true), None);
        assert!(verdict(Some(2), false).unwrap().contains("CAP_SYS_PTRACE"));
        assert!(verdict(Some(3), true).unwrap().contains("3"));
    }
}
