//! `preheat bench cosched`: what the user-space coscheduler costs (goal ≥ 0.97), measured by
//! `preheat_cosched_run::bench`.

use anyhow::Result;
use preheat_cosched_run::bench;

use crate::progress::Bars;

pub fn run(
    kernel: &str,
    reps: usize,
    (seconds, guest): (Option<f64>, bool),
    slice_ms: f64,
    json: bool,
) -> Result<()> {
    let watchdog = super::run::watchdog();
    let seconds = seconds.unwrap_or(if guest { bench::GUEST_SECONDS } else { 3.0 });
    let measure = if guest {
        bench::measure_guest
    } else {
        bench::measure
    };
    let res = measure(
        kernel,
        reps,
        seconds,
        slice_ms,
        Some(&watchdog),
        &Bars::new(json),
        &super::run::say,
    )?;
    if json {
        println!("{}", serde_json::to_string(&res)?);
    } else {
        println!(
            "coscheduler overhead ({} kernel, {}, one set, {} ms slices, {} s runs; measured, \
             {} paired repetitions, {}): useful work ({}) under the coscheduler / plain Linux = \
             {} (goal >= {}); plain Linux {}, coscheduled {}; controller cost per slice p50 \
             {:.1} µs",
            res.kernel,
            res.vm,
            slice_ms,
            seconds,
            reps,
            res.order,
            res.rate_unit,
            res.ratio.show(3),
            res.goal,
            res.none.show(0),
            res.full.show(0),
            res.apply_us_p50
        );
    }
    Ok(())
}
