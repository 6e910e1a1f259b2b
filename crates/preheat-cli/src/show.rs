//! `preheat ws show`: what a working-set file contains, with the paper's size metrics.

use std::path::Path;

use anyhow::Result;
use preheat_model::resolve::hex;
use preheat_model::{Profile, WsStats};
use serde::Serialize;

#[derive(Serialize)]
struct RegionSummary {
    region: String,
    lines: u64,
    runs: u64,
}

#[derive(Serialize)]
struct ClassSummary {
    port: u16,
    samples: u32,
    #[serde(flatten)]
    stats: WsStats,
    /// encoded / raw (4 bytes per line), the paper's compression figure.
    compression: f64,
    regions: Vec<RegionSummary>,
}

#[derive(Serialize)]
struct Summary<'a> {
    file: &'a str,
    file_bytes: u64,
    format_version: u16,
    backend: &'static str,
    binary: &'a str,
    build_id: String,
    k: u32,
    n: u32,
    gap: u32,
    created_unix_s: u64,
    classes: Vec<ClassSummary>,
}

fn summarize<'a>(path: &'a str, file_bytes: u64, p: &'a Profile) -> Summary<'a> {
    Summary {
        file: path,
        file_bytes,
        format_version: preheat_model::format::VERSION,
        backend: p.backend.name(),
        binary: &p.binary.exe.path,
        build_id: hex(&p.binary.exe.build_id),
        k: p.filter.k,
        n: p.filter.n,
        gap: p.filter.gap,
        created_unix_s: p.created_unix_s,
        classes: p
            .classes
            .iter()
            .map(|c| {
                let stats = c.ws.stats();
                let mut regions: Vec<RegionSummary> =
                    c.ws.regions
                        .iter()
                        .map(|r| RegionSummary {
                            region: p
                                .regions
                                .get(r.region as usize)
                                .map(|k| k.describe())
                                .unwrap_or_default(),
                            lines: r.runs.iter().map(|x| x.len as u64).sum(),
                            runs: r.runs.len() as u64,
                        })
                        .collect();
                regions.sort_by_key(|r| std::cmp::Reverse(r.lines));
                ClassSummary {
                    port: c.port,
                    samples: c.samples,
                    compression: if stats.raw_bytes > 0 {
                        stats.encoded_bytes as f64 / stats.raw_bytes as f64
                    } else {
                        0.0
                    },
                    stats,
                    regions,
                }
            })
            .collect(),
    }
}

pub fn show(path: &Path, json: bool, runs: bool) -> Result<()> {
    let p = crate::record::read_profile(path)?;
    if runs {
        // One line per run: port, region, first line, length (for scripts and debugging).
        for c in &p.classes {
            for rr in &c.ws.regions {
                let name = p
                    .regions
                    .get(rr.region as usize)
                    .map(|k| k.describe())
                    .unwrap_or_default();
                for r in &rr.runs {
                    println!("{}\t{}\t{}\t{}", c.port, name, r.start, r.len);
                }
            }
        }
        return Ok(());
    }
    let file_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let name = path.to_string_lossy();
    let s = summarize(&name, file_bytes, &p);
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    println!(
        "{} ({} bytes, format v{})",
        s.file, s.file_bytes, s.format_version
    );
    println!("  binary   {} (build-id {})", s.binary, s.build_id);
    println!(
        "  backend  {}; filter: lines seen in >= {} of {} samples; gap merge {} lines",
        s.backend, s.k, s.n, s.gap
    );
    for c in &s.classes {
        let st = &c.stats;
        println!("  port {} ({} samples)", c.port, c.samples);
        println!(
            "    {} lines = {:.1} KiB in {} runs over {} regions",
            st.lines, st.kib, st.runs, st.regions
        );
        println!(
            "    description: raw {} B (4 B/line, the paper's metric) -> paper RLE {} B (6 B/run) -> ours {} B ({:.0}% of raw)",
            st.raw_bytes,
            st.rle_bytes_paper,
            st.encoded_bytes,
            c.compression * 100.0
        );
        println!("    (paper, nginx: 14528 B -> 4596 B, 32% of raw)");
        for r in c.regions.iter().take(12) {
            println!(
                "      {:>7} lines {:>6} runs  {}",
                r.lines, r.runs, r.region
            );
        }
        if c.regions.len() > 12 {
            println!("      ... {} more regions", c.regions.len() - 12);
        }
    }
    Ok(())
}
