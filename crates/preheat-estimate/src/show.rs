//! What a working-set file contains, with the paper's size metrics (`preheat ws show`; the CLI
//! prints [`Summary`] as text or JSON).

use preheat_model::resolve::hex;
use preheat_model::{Profile, WsStats};
use serde::Serialize;

#[derive(Serialize)]
pub struct RegionSummary {
    pub region: String,
    pub lines: u64,
    pub runs: u64,
}

#[derive(Serialize)]
pub struct ClassSummary {
    pub port: u16,
    pub samples: u32,
    #[serde(flatten)]
    pub stats: WsStats,
    /// encoded / raw (4 bytes per line), the paper's compression figure.
    pub compression: f64,
    pub regions: Vec<RegionSummary>,
}

#[derive(Serialize)]
pub struct Summary<'a> {
    pub file: &'a str,
    pub file_bytes: u64,
    pub format_version: u16,
    pub backend: &'static str,
    pub binary: &'a str,
    pub build_id: String,
    pub k: u32,
    pub n: u32,
    pub gap: u32,
    pub created_unix_s: u64,
    pub classes: Vec<ClassSummary>,
}

/// The summary of profile `p`, read from `path` (`file_bytes` long).
pub fn summarize<'a>(path: &'a str, file_bytes: u64, p: &'a Profile) -> Summary<'a> {
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
