//! `preheat groups`: the group detection of Busse et al., *Partial Coscheduling of Virtual
//! Machines Based on Memory Access Patterns* (SAC'15), §3 — a dependency tree over a
//! communication matrix (eq. 1) and the coscheduling sets split off it at threshold t. The
//! algorithm lives in `preheat-group`; this is its front door (read, print).

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use preheat_group::render::join;
use preheat_group::{group, CommMatrix, Grouping};
use serde::Serialize;

#[derive(clap::Args)]
pub struct GroupsArgs {
    /// The communication matrix as JSON (an array of rows, or an object with a "matrix"
    /// field); `-` reads standard input.
    matrix: PathBuf,
    /// Split threshold: a node splits when a child's d is more than t times its own
    /// (0: every task alone; inf: one set).
    #[arg(long, default_value_t = preheat_group::DEFAULT_T)]
    t: f64,
    /// Print one JSON object: t, sets, set_nodes, tree, labels.
    #[arg(long)]
    json: bool,
}

/// The `--json` object.
#[derive(Serialize)]
struct Report<'a> {
    #[serde(flatten)]
    grouping: &'a Grouping,
    labels: &'a [String],
}

pub fn run(a: GroupsArgs) -> Result<()> {
    let (name, text) = read(&a.matrix)?;
    let m = CommMatrix::from_json_str(&text).with_context(|| name.clone())?;
    let g = group(&m, a.t).context("--t")?;
    if a.json {
        let report = Report {
            grouping: &g,
            labels: m.labels(),
        };
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    let labels = m.labels();
    println!("{name}: {} tasks", m.len());
    println!("dependency tree (d: eq. 1 between a node's two children; leaves 0):");
    print!("{}", g.render_tree(labels));
    println!(
        "sets at t = {} (a node splits when a child's d is more than t times its own): {}",
        g.t,
        g.sets.len()
    );
    for (k, set) in g.sets.iter().enumerate() {
        if set.iter().all(|&x| labels[x] == x.to_string()) {
            println!("  set {}: {{{}}}", k + 1, join(set));
        } else {
            let named: Vec<&str> = set.iter().map(|&x| labels[x].as_str()).collect();
            println!("  set {}: {{{}}}  ({})", k + 1, join(set), named.join(", "));
        }
    }
    Ok(())
}

/// The matrix text and the name to use for it in messages.
fn read(path: &Path) -> Result<(String, String)> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading the matrix from standard input")?;
        return Ok(("standard input".into(), text));
    }
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {name}"))?;
    Ok((name, text))
}
