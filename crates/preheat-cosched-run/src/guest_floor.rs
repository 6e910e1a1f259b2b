//! partial-auto on guests: calibrating the guest kernel's own sharing
//! ([`preheat_group::floor`]).
//!
//! One boot of a 2-vCPU guest with host-side detection in QEMU (the configuration partial-auto
//! runs with, `CommConfig::guest`), running the kernel as two one-thread instances: nothing is
//! shared between its vCPUs but what the guest kernel itself shares. The events between the two
//! vCPUs per counted (vCPU) fault are the floor partial-auto takes off every guest's matrix
//! before grouping. Measured once per kernel per experiment, because the rate depends on the
//! guest, the kernel's page use and this machine's sampling speed (a debug build takes fewer
//! faults per second than a release build).

use anyhow::{Context, Result};
use preheat_group::NoiseFloor;
use serde::Serialize;

/// Seconds of sampling in the calibration guest (after the detector's warm-up).
pub const FLOOR_WINDOW_S: f64 = 3.0;

/// One kernel's floor and what it was measured from.
#[derive(Debug, Clone, Serialize)]
pub struct FloorCalibration {
    pub kernel: String,
    /// Per calibration boot: events between the two vCPUs and faults the detector induced in
    /// the vCPU threads (measured).
    pub runs: Vec<(u64, u64)>,
    /// Seconds sampled per boot.
    pub window_s: f64,
    /// The median over the boots of events per vCPU fault, with the margin.
    pub floor: NoiseFloor,
}

impl FloorCalibration {
    /// One line for the experiment's table.
    pub fn describe(&self) -> String {
        let runs: Vec<String> = self.runs.iter().map(|(e, f)| format!("{e}/{f}")).collect();
        format!(
            "partial-auto noise floor {}: {:.3} events per vCPU fault (measured, median of {} \
             boot(s) of a 2-vCPU guest running two instances that share nothing, {:.0} s \
             sampled each: events/faults {}); a pair's events within {:.1}× the floor its \
             faults give are taken off each guest's matrix before grouping",
            self.kernel,
            self.floor.events_per_fault,
            self.runs.len(),
            self.window_s,
            runs.join(", "),
            self.floor.margin
        )
    }
}

/// Boot the calibration guest for `kernel` `boots` times (at least once) and measure its floor
/// (`margin` above it; the median over the boots: [`preheat_guest::comm::noise_floor`]).
pub fn calibrate(kernel: &str, margin: f64, boots: usize) -> Result<FloorCalibration> {
    use preheat_guest::comm::{run, Scenario, Spec};
    let image = preheat_guest::ensure_image(&preheat_guest::ImageSpec::default())?;
    // Removed when dropped, by the SIGINT/SIGTERM handler, and after a SIGKILL by the next run.
    let work = preheat_launch::launch::scratch_dir("guest-floor")?;
    let spec = Spec::new(kernel, Scenario::Double, FLOOR_WINDOW_S);
    let mut runs = Vec::new();
    for _ in 0..boots.max(1) {
        let r = run(&image, &spec, work.path())
            .with_context(|| format!("{kernel}: calibrating partial-auto's noise floor"))?;
        runs.push((r.cross, r.report.counted_faults()));
    }
    let floor = preheat_guest::comm::noise_floor(&runs, margin).with_context(|| {
        format!("{kernel}: the noise-floor guest's vCPUs took no sampled fault")
    })?;
    Ok(FloorCalibration {
        kernel: kernel.into(),
        runs,
        window_s: FLOOR_WINDOW_S,
        floor,
    })
}
