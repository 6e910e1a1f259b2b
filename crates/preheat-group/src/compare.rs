//! How often each [`GroupMethod`] recovers the planted groups of generated noisy block matrices
//! ([`crate::planted`]), per noise level, and that as a small table. **Simulated**: the
//! matrices are generated, not measured.
//!
//! A method recovers a matrix's groups when its sets equal the planted sets exactly. Every
//! method sees the same matrices: seeds `0..seeds` at each noise level, the same planted
//! groups for a seed at every level.

use std::fmt::Write;

use serde::Serialize;

use crate::group_with;
use crate::method::GroupMethod;
use crate::planted::Spec;
use crate::split::DEFAULT_T;

/// The noise levels σ of `preheat groups compare`: none, then where the paper's rule recovers
/// about 9, 8, 4 and 2 in 10 with [`Spec::default`] (`tests/methods.rs` pins the rates).
pub const NOISE_LEVELS: [f64; 5] = [0.0, 0.05, 0.15, 0.3, 0.5];

/// One noise level's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// The noise level σ.
    pub noise: f64,
    /// Matrices generated (one per seed).
    pub samples: u64,
    /// Matrices whose planted groups each method recovered, in the order of
    /// [`Comparison::methods`].
    pub recovered: Vec<u64>,
}

/// The comparison (the JSON of `preheat groups compare --json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// Always true: generated matrices, not measurements.
    pub simulated: bool,
    /// What was generated.
    pub spec: Spec,
    /// Seeds `0..seeds` at every noise level.
    pub seeds: u64,
    /// The paper's threshold used.
    pub t: f64,
    /// The methods compared, the default first.
    pub methods: Vec<GroupMethod>,
    /// One row per noise level.
    pub rows: Vec<Row>,
}

/// Compare all methods (the paper's at threshold `t`) on seeds `0..seeds` of `spec` at each
/// of `noise_levels`.
///
/// # Panics
/// If `spec` cannot generate (see [`Spec::check`]), a noise level is negative, or `t` is not a
/// valid threshold.
pub fn compare(spec: &Spec, seeds: u64, noise_levels: &[f64], t: f64) -> Comparison {
    let methods = GroupMethod::ALL.to_vec();
    let rows = noise_levels
        .iter()
        .map(|&noise| {
            let mut recovered = vec![0; methods.len()];
            for seed in 0..seeds {
                let p = spec.generate(seed, noise);
                for (count, &method) in recovered.iter_mut().zip(&methods) {
                    let g = group_with(&p.matrix, method, t).expect("a valid threshold");
                    *count += u64::from(g.sets == p.sets);
                }
            }
            Row {
                noise,
                samples: seeds,
                recovered,
            }
        })
        .collect();
    Comparison {
        simulated: true,
        spec: *spec,
        seeds,
        t,
        methods,
        rows,
    }
}

/// [`compare`] with the defaults of `preheat groups compare`: [`Spec::default`],
/// [`NOISE_LEVELS`], t = [`DEFAULT_T`].
pub fn compare_default(seeds: u64) -> Comparison {
    compare(&Spec::default(), seeds, &NOISE_LEVELS, DEFAULT_T)
}

impl Comparison {
    /// The table: one line per noise level, each method's recovered/samples and percentage,
    /// under a heading that says the matrices are simulated and how they were made.
    pub fn render(&self) -> String {
        let s = &self.spec;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "simulated: generated noisy block matrices with planted groups (not measurements), \
             {} seeds (0..{}) per noise level",
            self.seeds, self.seeds
        );
        let _ = writeln!(
            out,
            "{}-{} tasks in {}-{} planted groups of >= {}; pair mean {} inside a group, {} across; \
             each count x exp(sigma*Z - sigma^2/2), rounded",
            s.tasks.0,
            s.tasks.1,
            s.groups.0,
            s.groups.1,
            s.min_size,
            s.within,
            s.within * s.background
        );
        let _ = writeln!(out, "planted groups recovered exactly:");
        let names: Vec<String> = self
            .methods
            .iter()
            .map(|m| match m {
                GroupMethod::PaperSplit => format!("paper (t = {})", self.t),
                GroupMethod::Modularity => m.name().to_string(),
            })
            .collect();
        let _ = write!(out, "{:>11}", "noise sigma");
        for name in &names {
            let _ = write!(out, "  {name:>20}");
        }
        out.push('\n');
        for row in &self.rows {
            let _ = write!(out, "{:>11.2}", row.noise);
            for &k in &row.recovered {
                let pct = 100.0 * k as f64 / row.samples.max(1) as f64;
                let cell = format!("{k}/{} {pct:5.1}%", row.samples);
                let _ = write!(out, "  {cell:>20}");
            }
            out.push('\n');
        }
        out
    }
}
