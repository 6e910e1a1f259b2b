//! `preheat bench cosched`: what the user-space coscheduler costs (goal ≥ 0.97), measured by
//! `preheat_cosched_run::bench`.

use anyhow::Result;
use preheat_cosched_run::bench;

use crate::progress::Bars;

pub fn run(kernel: &str, reps: usize, seconds: f64, slice_ms: f64, json: bool) -> Result<()> {
    let watchdog = super::run::watchdog();
    let res = bench::measure(
        kernel,
        reps,
        seconds,
        slice_ms,
        Some(&watchdog),
        &Bars::new(json),
        &super::run::say,
    )?;
    let cpus = res.cpus;
    if json {
        println!("{}", serde_json::to_string(&res)?);
    } else {
        println!(
            "coscheduler overhead ({} kernel, {} threads on {} CPUs, one set, {} ms slices, {} s \
             runs; measured, {} paired repetitions): useful work under the coscheduler / plain \
             Linux = {:.3} median [{:.3}-{:.3}] (goal >= {}); controller cost per slice p50 \
             {:.1} µs",
            res.kernel,
            cpus,
            cpus,
            slice_ms,
            seconds,
            reps,
            res.ratio_median,
            res.ratio_min,
            res.ratio_max,
            res.goal,
            res.apply_us_p50
        );
    }
    Ok(())
}
