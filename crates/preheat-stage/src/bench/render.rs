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

impl BenchReport {
    /// Human-readable report: one column per mode.
    pub fn render(&self) -> String {
        let mut rows: Vec<(String, Vec<String>)> = Vec::new();
        let mut row = |name: &str, f: &dyn Fn(&ModeReport) -> String| {
            rows.push((name.to_string(), self.modes.iter().map(f).collect()));
        };
        row("requests sent / answered", &|m| {
            format!("{} / {}", m.sent, m.completed)
        });
        row("achieved rate /s", &|m| {
            format!("{:.1}", m.achieved_rate_per_s)
        });
        let lat = |m: &ModeReport, q: &Quantile| {
            if m.latency.samples == 0 {
                "–".to_string()
            } else {
                fmt_q(q)
            }
        };
        row("latency p50 (95% CI)", &|m| lat(m, &m.latency.p50));
        row("latency p99 (95% CI)", &|m| lat(m, &m.latency.p99));
        row("latency p99.9 (95% CI)", &|m| lat(m, &m.latency.p999));
        row("latency max", &|m| {
            if m.latency.samples == 0 {
                "–".to_string()
            } else {
                format!("{:.1} ms", m.latency.max_us as f64 / 1e3)
            }
        });
        row("over the bound", &|m| {
            format!(
                "{} of {} ({:.2}%)",
                m.over_bound.count,
                m.over_bound.samples,
                100.0 * m.over_bound.share
            )
        });
        row("errors / mismatched / unanswered", &|m| {
            format!("{} / {} / {}", m.errors, m.mismatched, m.unanswered)
        });
        row("bursts (early)", &|m| match &m.stage {
            Some(s) => format!("{} ({}), {:.2}/s", s.bursts, s.bursts_early, s.bursts_per_s),
            None => "–".into(),
        });
        row("held in stage mean / max", &|m| match &m.stage {
            Some(s) => format!(
                "{:.1} / {:.1} ms",
                s.held_mean_us / 1e3,
                s.held_max_us as f64 / 1e3
            ),
            None => "–".into(),
        });
        row("deep idle (mean over CPUs)", &|m| match &m.residency {
            Some(r) => format!("{:.1}%", 100.0 * r.deep_idle_share.value),
            None => "unavailable".into(),
        });
        row("backend wakeups/s", &|m| match m.backend_wakeups_per_s {
            Some(w) => format!("{w:.1}"),
            None => "–".into(),
        });
        row("CPU time: ours / other processes", &|m| match &m.cpu_use {
            Some(u) => format!(
                "{:.1}% / {:.1}%",
                100.0 * u.own_share,
                100.0 * u.others_share
            ),
            None => "–".into(),
        });
        let cpus: Vec<u32> = self
            .modes
            .iter()
            .find_map(|m| m.residency.as_ref())
            .map(|r| r.per_cpu.iter().map(|c| c.cpu).collect())
            .unwrap_or_default();
        for cpu in cpus {
            row(&format!("cpu{cpu} deep idle / wakeups/s"), &|m| {
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
        let width = rows.iter().map(|r| r.0.chars().count()).max().unwrap_or(0) + 2;
        let colw = rows
            .iter()
            .flat_map(|r| r.1.iter().map(|c| c.chars().count()))
            .max()
            .unwrap_or(0)
            .max(8)
            + 3;
        let mut out = format!(
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
        );
        let pad =
            |s: &str, w: usize| format!("{s}{}", " ".repeat(w.saturating_sub(s.chars().count())));
        out.push_str(&pad("", width));
        for m in &self.modes {
            out.push_str(&pad(m.mode, colw));
        }
        out.push('\n');
        for (name, cells) in &rows {
            out.push_str(&pad(name, width));
            for c in cells {
                out.push_str(&pad(c, colw));
            }
            out.push('\n');
        }
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
        out.push_str(&format!(
            "\nAll numbers measured here ({}). Latency from the intended send time to the full response; POLL residency counted as busy.\n",
            n.join("; ")
        ));
        out.push_str("\nper window (round: p99.9; deep idle per CPU; wakeups/s per CPU; backend wakeups/s; CPU used by other processes):\n");
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
}

/// A rate that the counters may not have (no cpuidle driver: wakeups are not counted).
fn per_s(q: &Option<preheat_power::Quantity>) -> String {
    q.as_ref()
        .map_or_else(|| "not counted".to_string(), |q| format!("{:.0}", q.value))
}
