//! The human-readable report: one column per mode, then one line per measured window.

use super::report::{BenchReport, ModeReport, Quantile};

fn fmt_q(q: &Quantile) -> String {
    let v = |x: u64| {
        if x >= 10_000 {
            format!("{:.1} ms", x as f64 / 1e3)
        } else {
            format!("{x} µs")
        }
    };
    let lo = q.ci95_lo_us.map_or("?".to_string(), v);
    let hi = q.ci95_hi_us.map_or("?".to_string(), v);
    format!("{} ({lo}–{hi})", v(q.value_us))
}

/// The table's rows: a name, then one cell per mode.
type Rows = Vec<(String, Vec<String>)>;

impl BenchReport {
    /// Human-readable report: one column per mode.
    pub fn render(&self) -> String {
        let mut rows: Rows = Vec::new();
        self.latency_rows(&mut rows);
        self.cost_rows(&mut rows);
        self.per_cpu_rows(&mut rows);
        let mut out = self.header();
        out.push_str(&self.table(&rows));
        out.push_str(&self.samples_line());
        out.push_str(&self.per_window());
        for m in &self.modes {
            if let Some(u) = &m.residency_unavailable {
                out.push_str(&format!("{}: {u}\n", m.mode));
            }
        }
        for note in &self.notes {
            out.push_str(&format!("note: {note}\n"));
        }
        out
    }

    /// Appends the row `name`, its cell for each mode made by `f`.
    fn row(&self, rows: &mut Rows, name: &str, f: &dyn Fn(&ModeReport) -> String) {
        rows.push((name.to_string(), self.modes.iter().map(f).collect()));
    }

    /// The load and latency rows: requests, rate, latency quantiles, over the bound, errors.
    fn latency_rows(&self, rows: &mut Rows) {
        self.row(rows, "requests sent / answered", &|m| {
            format!("{} / {}", m.sent, m.completed)
        });
        self.row(rows, "achieved rate /s", &|m| {
            format!("{:.1}", m.achieved_rate_per_s)
        });
        let lat = |m: &ModeReport, q: &Quantile| {
            if m.latency.samples == 0 {
                "–".to_string()
            } else {
                fmt_q(q)
            }
        };
        self.row(rows, "latency p50 (95% CI)", &|m| lat(m, &m.latency.p50));
        self.row(rows, "latency p99 (95% CI)", &|m| lat(m, &m.latency.p99));
        self.row(rows, "latency p99.9 (95% CI)", &|m| lat(m, &m.latency.p999));
        self.row(rows, "latency max", &|m| {
            if m.latency.samples == 0 {
                "–".to_string()
            } else {
                format!("{:.1} ms", m.latency.max_us as f64 / 1e3)
            }
        });
        self.row(rows, "over the bound", &|m| {
            format!(
                "{} of {} ({:.2}%)",
                m.over_bound.count,
                m.over_bound.samples,
                100.0 * m.over_bound.share
            )
        });
        self.row(rows, "errors / mismatched / unanswered", &|m| {
            format!("{} / {} / {}", m.errors, m.mismatched, m.unanswered)
        });
    }

    /// The stage and cost rows: bursts, time held, deep idle, backend wakeups, CPU time.
    fn cost_rows(&self, rows: &mut Rows) {
        self.row(rows, "bursts (early)", &|m| match &m.stage {
            Some(s) => format!("{} ({}), {:.2}/s", s.bursts, s.bursts_early, s.bursts_per_s),
            None => "–".into(),
        });
        self.row(rows, "held in stage mean / max", &|m| match &m.stage {
            Some(s) => format!(
                "{:.1} / {:.1} ms",
                s.held_mean_us / 1e3,
                s.held_max_us as f64 / 1e3
            ),
            None => "–".into(),
        });
        self.row(
            rows,
            "deep idle (mean over CPUs)",
            &|m| match &m.residency {
                Some(r) => format!("{:.1}%", 100.0 * r.deep_idle_share.value),
                None => "unavailable".into(),
            },
        );
        self.row(
            rows,
            "backend wakeups/s",
            &|m| match m.backend_wakeups_per_s {
                Some(w) => format!("{w:.1}"),
                None => "–".into(),
            },
        );
        self.row(
            rows,
            "CPU time: ours / other processes",
            &|m| match &m.cpu_use {
                Some(u) => format!(
                    "{:.1}% / {:.1}%",
                    100.0 * u.own_share,
                    100.0 * u.others_share
                ),
                None => "–".into(),
            },
        );
    }

    /// One row per CPU of the first mode with residency: its deep idle and wakeups/s.
    fn per_cpu_rows(&self, rows: &mut Rows) {
        let cpus: Vec<u32> = self
            .modes
            .iter()
            .find_map(|m| m.residency.as_ref())
            .map(|r| r.per_cpu.iter().map(|c| c.cpu).collect())
            .unwrap_or_default();
        for cpu in cpus {
            self.row(rows, &format!("cpu{cpu} deep idle / wakeups/s"), &|m| {
                m.residency
                    .as_ref()
                    .and_then(|r| r.per_cpu.iter().find(|c| c.cpu == cpu))
                    .map_or("–".into(), |c| {
                        format!(
                            "{:.1}% / {}",
                            100.0 * c.deep_idle_share.value,
                            per_s(&c.wakeups_per_s)
                        )
                    })
            });
        }
    }

    /// The report's first lines: the load, the backend, the placement, then a blank line.
    fn header(&self) -> String {
        format!(
            "preheat stage bench: {} open-loop Poisson at {}/s, {} s × {} round(s), {} connection(s), period {} ms, bound {} ms\nbackend: {}\nplacement: {}\n\n",
            self.protocol,
            self.rate_per_s,
            self.duration_s,
            self.rounds,
            self.connections,
            self.period_ms,
            self.bound_ms,
            self.backend,
            self.placement
        )
    }

    /// The table: a line of mode names, then `rows`, padded into columns.
    fn table(&self, rows: &Rows) -> String {
        let width = rows.iter().map(|r| r.0.chars().count()).max().unwrap_or(0) + 2;
        let colw = rows
            .iter()
            .flat_map(|r| r.1.iter().map(|c| c.chars().count()))
            .max()
            .unwrap_or(0)
            .max(8)
            + 3;
        let pad =
            |s: &str, w: usize| format!("{s}{}", " ".repeat(w.saturating_sub(s.chars().count())));
        let mut out = pad("", width);
        for m in &self.modes {
            out.push_str(&pad(m.mode, colw));
        }
        out.push('\n');
        for (name, cells) in rows {
            out.push_str(&pad(name, width));
            for c in cells {
                out.push_str(&pad(c, colw));
            }
            out.push('\n');
        }
        out
    }

    /// The paragraph saying what was measured, with each mode's sample counts.
    fn samples_line(&self) -> String {
        let n: Vec<String> = self
            .modes
            .iter()
            .map(|m| {
                format!(
                    "{}: n = {} latency samples, residency over {:.1} s × {} CPUs",
                    m.mode,
                    m.latency.samples,
                    m.residency.as_ref().map_or(0.0, |r| r.interval.value),
                    m.residency.as_ref().map_or(0, |r| r.cpus_measured)
                )
            })
            .collect();
        format!(
            "\nAll numbers measured here ({}). Latency from the intended send time to the full response; POLL residency counted as busy.\n",
            n.join("; ")
        )
    }

    /// The per-window section: one line per mode and round.
    fn per_window(&self) -> String {
        let mut out = String::from("\nper window (round: p99.9; deep idle per CPU; wakeups/s per CPU; backend wakeups/s; CPU used by other processes):\n");
        for m in &self.modes {
            for r in &m.per_round {
                let per_cpu = r.residency.iter().flat_map(|x| &x.per_cpu);
                let pct: Vec<String> = per_cpu
                    .clone()
                    .map(|c| format!("{:.1}%", 100.0 * c.deep_idle_share.value))
                    .collect();
                let wk: Vec<String> = per_cpu.map(|c| per_s(&c.wakeups_per_s)).collect();
                out.push_str(&format!(
                    "  {} r{}: {}; {}; {}; {}; {}\n",
                    m.mode,
                    r.round,
                    if r.samples > 0 {
                        format!("p99.9 {:.1} ms (n = {})", r.p999_us as f64 / 1e3, r.samples)
                    } else {
                        "no requests".to_string()
                    },
                    pct.join(" "),
                    wk.join(" "),
                    r.backend_wakeups_per_s
                        .map_or("–".to_string(), |w| format!("{w:.1}")),
                    r.others_cpu_share
                        .map_or("–".to_string(), |o| format!("{:.1}%", 100.0 * o)),
                ));
            }
        }
        out
    }
}

/// A rate that the counters may not have (no cpuidle driver: wakeups are not counted).
fn per_s(q: &Option<preheat_power::Quantity>) -> String {
    q.as_ref()
        .map_or_else(|| "not counted".to_string(), |q| format!("{:.0}", q.value))
}
