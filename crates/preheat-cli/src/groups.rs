//! `preheat groups`: the group detection of Busse et al., *Partial Coscheduling of Virtual
//! Machines Based on Memory Access Patterns* (SAC'15), §3 — a dependency tree over a
//! communication matrix (eq. 1) and the coscheduling sets split off it at threshold t, or (an
//! option) its cut with the highest modularity; `compare` measures both on generated matrices.
//! The algorithm and all text live in `preheat-group`; this is its front door (read, print).

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use preheat_group::{group_with, CommMatrix, GroupMethod, Grouping};
use serde::Serialize;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct GroupsArgs {
    #[command(subcommand)]
    cmd: Option<GroupsCmd>,
    /// The communication matrix as JSON (an array of rows, or an object with a "matrix"
    /// field); `-` reads standard input.
    #[arg(required = true)]
    matrix: Option<PathBuf>,
    /// How to choose the sets from the tree: paper (the split rule at --t, the default) or
    /// modularity (the cut with the highest modularity, no threshold).
    #[arg(long, default_value_t = GroupMethod::PaperSplit)]
    method: GroupMethod,
    /// Split threshold of --method paper: a node splits when a child's d is more than t times
    /// its own (0: every task alone; inf: one set).
    #[arg(long, default_value_t = preheat_group::DEFAULT_T)]
    t: f64,
    /// Print one JSON object: method, t, sets, set_nodes, tree, labels (modularity: its Q).
    #[arg(long)]
    json: bool,
}

#[derive(clap::Subcommand)]
enum GroupsCmd {
    /// How often each method recovers the planted groups of generated noisy block matrices,
    /// per noise level (simulated: no program runs).
    Compare {
        /// Matrices per noise level (seeds 0..N).
        #[arg(long, default_value_t = 200)]
        seeds: u64,
        /// Print the comparison as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// The `--json` object.
#[derive(Serialize)]
struct Report<'a> {
    #[serde(flatten)]
    grouping: &'a Grouping,
    labels: &'a [String],
}

pub fn run(a: GroupsArgs) -> Result<()> {
    if let Some(GroupsCmd::Compare { seeds, json }) = a.cmd {
        let c = preheat_group::compare::compare_default(seeds);
        if json {
            println!("{}", serde_json::to_string(&c)?);
        } else {
            print!("{}", c.render());
        }
        return Ok(());
    }
    let (name, text) = read(&a.matrix.context("a matrix is required")?)?;
    let m = CommMatrix::from_json_str(&text).with_context(|| name.clone())?;
    let g = group_with(&m, a.method, a.t).context("--t")?;
    if a.json {
        let report = Report {
            grouping: &g,
            labels: m.labels(),
        };
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    print!("{}", g.render(&name, m.labels()));
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
