//! `preheat ws show` and `preheat ws compare`: printing what `preheat-estimate` computes.

use std::path::Path;

use anyhow::Result;
use preheat_estimate::compare::compare as score;
use preheat_estimate::read_profile;
use preheat_estimate::show::summarize;

pub fn show(path: &Path, json: bool, runs: bool) -> Result<()> {
    let p = read_profile(path)?;
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

pub fn compare(tested: &Path, truth: &Path, port: Option<u16>, json: bool) -> Result<()> {
    let a = read_profile(tested)?;
    let b = read_profile(truth)?;
    let c = score(&a, &b, port)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&c)?);
        return Ok(());
    }
    println!(
        "{} ({}) against {} ({}) as ground truth, port {}, file-backed lines:",
        tested.display(),
        a.backend.name(),
        truth.display(),
        b.backend.name(),
        c.port
    );
    println!(
        "  precision {:.3} ({} of {} tested lines are in the truth)",
        c.all.precision, c.all.true_positives, c.all.tested
    );
    println!(
        "  recall    {:.3} ({} of {} truth lines were found)",
        c.all.recall, c.all.true_positives, c.all.truth
    );
    for (what, sc) in [("code", c.code), ("data", c.data)] {
        println!(
            "    {what}: precision {:.3} recall {:.3} ({} tested, {} truth, {} both)",
            sc.precision, sc.recall, sc.tested, sc.truth, sc.true_positives
        );
    }
    println!(
        "  anonymous lines (not comparable across backends, not scored): tested {}, truth {}",
        c.tested_anon_lines, c.truth_anon_lines
    );
    Ok(())
}
