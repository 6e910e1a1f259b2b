//! One guest from boot to power-off, as `preheat guest run` shows it: booted and described
//! ([`boot`]: QEMU's threads, the host time to user space), its workload followed to the end
//! ([`follow`]: every progress report, the summary, the exit status), the phase rate over the run,
//! and the text `guest run` prints (`render_*`).

use std::time::Duration;

use anyhow::{bail, Result};
use preheat_npb::Progress;
use serde::Serialize;

use crate::console::{phase_rates, Event};
use crate::image::Image;
use crate::qemu::{Guest, GuestSpec};

/// One progress report as the host saw it.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Host seconds since QEMU started.
    pub host_s: f64,
    #[serde(flatten)]
    pub progress: Progress,
}

/// What a guest did (measured).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub name: String,
    pub vcpus: u32,
    pub qemu_pid: u32,
    /// `(vCPU index, tid)`.
    pub vcpu_threads: Vec<(u32, u32)>,
    /// QEMU's other threads, by name.
    pub other_threads: Vec<String>,
    /// Host seconds from QEMU's start to the guest's user space.
    pub boot_s: f64,
    /// The guest's uptime then (its clock).
    pub guest_uptime_s: f64,
    pub progress: Vec<Row>,
    /// Per instance, from the first to the last report (guest clock); empty with < 2 reports.
    pub phases_per_s: Vec<f64>,
    /// The workload's JSON summary.
    pub summary: Option<serde_json::Value>,
    /// QEMU's exit status once the guest powered off (`None`: it did not within the wait).
    pub exit_status: Option<i32>,
}

/// Start `spec` on `image` and wait (≤ `timeout`) until its user space is up and sees
/// `spec.vcpus` CPUs.
pub fn boot(image: &Image, spec: &GuestSpec, timeout: Duration) -> Result<(Guest, Report)> {
    let mut guest = Guest::start(image, spec)?;
    let (boot, guest_uptime_s, cpus) = guest.wait_up(timeout)?;
    if cpus != spec.vcpus {
        bail!(
            "guest {} reports {cpus} CPUs, started with {}",
            spec.name,
            spec.vcpus
        );
    }
    let report = Report {
        name: spec.name.clone(),
        vcpus: spec.vcpus,
        qemu_pid: guest.pid(),
        vcpu_threads: guest.vcpu_threads(),
        other_threads: guest
            .threads()
            .into_iter()
            .filter(|t| t.vcpu.is_none())
            .map(|t| t.name)
            .collect(),
        boot_s: boot.as_secs_f64(),
        guest_uptime_s,
        ..Report::default()
    };
    Ok((guest, report))
}

/// Follow the workload until it is done (≤ `budget`), calling `on_progress` with each report
/// and the phase rates since the previous one; then wait (≤ 30 s) for the guest to power off.
/// An error when the workload fails or does not end in time.
pub fn follow(
    guest: &mut Guest,
    r: &mut Report,
    budget: Duration,
    mut on_progress: impl FnMut(&Row, Option<Vec<f64>>),
) -> Result<()> {
    let status = guest.wait_for("the end of the workload", budget, |t| {
        match &t.event {
            Event::Progress(p) => {
                let rates = r
                    .progress
                    .last()
                    .and_then(|prev| phase_rates(&prev.progress, p));
                let row = Row {
                    host_s: t.at.as_secs_f64(),
                    progress: p.clone(),
                };
                on_progress(&row, rates);
                r.progress.push(row);
            }
            Event::Summary(v) => r.summary = Some(v.clone()),
            Event::Done { status } => return Some(*status),
            _ => {}
        }
        None
    })?;
    if status != 0 {
        bail!(
            "the workload in guest {} failed (status {status})\n{}",
            r.name,
            guest.last_words()
        );
    }
    if let (Some(first), Some(last)) = (r.progress.first(), r.progress.last()) {
        r.phases_per_s = phase_rates(&first.progress, &last.progress).unwrap_or_default();
    }
    r.exit_status = guest.wait_exit(Duration::from_secs(30))?;
    Ok(())
}

fn fmt_rates(v: &[f64]) -> String {
    let v: Vec<String> = v.iter().map(|x| format!("{x:.0}")).collect();
    v.join(", ")
}

/// The lines `guest run` prints once the guest is up.
pub fn render_up(r: &Report) -> String {
    let vcpus: Vec<String> = r
        .vcpu_threads
        .iter()
        .map(|(i, t)| format!("CPU {i}={t}"))
        .collect();
    format!(
        "guest {}: QEMU pid {}, {} vCPU thread(s) {}; other threads: {}\n\
         user space up {:.1} s after QEMU started (measured, host clock; guest uptime {:.1} s)\n",
        r.name,
        r.qemu_pid,
        r.vcpu_threads.len(),
        vcpus.join(" "),
        r.other_threads.join(", "),
        r.boot_s,
        r.guest_uptime_s
    )
}

/// One progress line, with the rates since the previous report.
pub fn render_row(row: &Row, rates: Option<&[f64]>) -> String {
    let rates = rates.map_or(String::new(), |v| format!("  ({} phases/s)", fmt_rates(v)));
    let p = &row.progress;
    format!(
        "  guest t = {:5.1} s  phases {:?}{rates}",
        p.t_ms as f64 / 1e3,
        p.phases
    )
}

/// The lines `guest run` prints at the end.
pub fn render_end(r: &Report) -> String {
    let mut out = if r.phases_per_s.is_empty() {
        format!(
            "phases per second: fewer than 2 progress reports ({})\n",
            r.progress.len()
        )
    } else {
        format!(
            "phases per second (measured, guest clock, first to last of {} reports): {}\n",
            r.progress.len(),
            fmt_rates(&r.phases_per_s)
        )
    };
    if let Some(s) = &r.summary {
        out += &format!(
            "workload: {} iterations in {} s (its summary)\n",
            s["iterations"], s["wall_s"]
        );
    }
    out += &match r.exit_status {
        Some(c) => format!("guest powered off (QEMU exit status {c})\n"),
        None => "guest did not power off within 30 s: stopped\n".to_string(),
    };
    out
}
