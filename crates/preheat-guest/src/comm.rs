//! Host-side communication detection on a real guest (issue 22, point 3): QEMU started with the
//! agent preloaded and SPCD on from its first instruction, sampling only the guest's RAM,
//! counting only the vCPU threads and drawing from the pages the guest wrote last round
//! ([`CommConfig::guest`]); the guest runs one bundled kernel as one instance of two threads
//! (`single`: the threads share) or two single-thread instances (`double`: nothing shared but the
//! guest kernel). The detected vCPU × vCPU matrix is set against the truth the kernel reports
//! (its `pattern`), and [`render`] prints runs side by side (measured).
//!
//! The matrix is reset once the workload's threads exist plus [`WARMUP`] (the paper resets after
//! start-up); the report is taken after the window, before the workload ends.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use preheat_launch::agentctl::{self, AgentClient};
use preheat_model::comm::{CommConfig, CommReport};
use preheat_model::proto::Request;
use serde::Serialize;

use crate::console::Event;
use crate::image::Image;
use crate::qemu::{Guest, GuestSpec, Workload};

/// Time after the workload's threads exist before the matrix is reset.
pub const WARMUP: Duration = Duration::from_secs(1);

/// How the guest's two threads are arranged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scenario {
    /// One instance of two threads: they share (but `ep`).
    Single,
    /// Two single-thread instances: nothing shared.
    Double,
}

impl Scenario {
    pub fn parse(s: &str) -> Result<Scenario> {
        match s {
            "single" => Ok(Scenario::Single),
            "double" => Ok(Scenario::Double),
            _ => bail!("scenario must be single or double (got {s:?})"),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Single => "single",
            Scenario::Double => "double",
        }
    }
}

/// One detection run.
#[derive(Debug, Clone)]
pub struct Spec {
    pub kernel: String,
    pub scenario: Scenario,
    /// Sampling window after the reset, host seconds.
    pub window_s: f64,
    pub memory_mb: u32,
    pub config: CommConfig,
    /// Extra pages each communicating pair of the kernel shares (`preheat-npb --shared-pages`).
    pub shared_pages: usize,
}

impl Spec {
    /// `kernel` in `scenario` with the guest configuration over a 256 MiB guest.
    pub fn new(kernel: &str, scenario: Scenario, window_s: f64) -> Spec {
        Spec {
            kernel: kernel.into(),
            scenario,
            window_s,
            memory_mb: 256,
            config: CommConfig::guest(256),
            shared_pages: 0,
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub kernel: String,
    pub scenario: Scenario,
    /// vCPU × vCPU events (rows in vCPU index order).
    pub matrix: Vec<Vec<u64>>,
    /// Events between vCPU 0 and vCPU 1.
    pub cross: u64,
    /// The truth: the workload's threads share pages (its `pattern`).
    pub truth_shared: bool,
    /// Pages carrying the sharing (barrier and mailboxes), per instance, from the workload.
    pub shared_pages: Vec<usize>,
    pub window_s: f64,
    pub report: CommReport,
}

/// The vCPU × vCPU sub-matrix of `r`, in vCPU index order (names `CPU n/…`), and the indices.
pub fn vcpu_matrix(r: &CommReport, vcpus: u32) -> Vec<Vec<u64>> {
    let row = |k: u32| {
        r.threads
            .iter()
            .position(|t| crate::qemu::vcpu_of(&t.name) == Some(k))
    };
    let rows: Vec<Option<usize>> = (0..vcpus).map(row).collect();
    rows.iter()
        .map(|a| {
            rows.iter()
                .map(|b| match (a, b) {
                    (Some(a), Some(b)) if a != b => r.matrix[*a][*b],
                    _ => 0,
                })
                .collect()
        })
        .collect()
}

/// The truth from a workload summary: whether threads 0 and 1 share, and the pages carrying
/// each instance's sharing.
pub fn truth_of(summary: &serde_json::Value) -> Option<(bool, Vec<usize>)> {
    let shared = summary.get("pattern")?.get(0)?.get(1)?.as_u64()? == 1;
    let pages = summary
        .get("regions")?
        .as_array()?
        .iter()
        .map(|r| {
            r.get("shared_pages")
                .and_then(|p| p.as_array())
                .map_or(0, Vec::len)
        })
        .collect();
    Some((shared, pages))
}

/// Boot a 2-vCPU guest running `spec`'s kernel with detection in QEMU, and measure.
pub fn run(image: &Image, spec: &Spec, run_dir: &Path) -> Result<Run> {
    let mut g = GuestSpec::new(&format!("comm-{}", spec.kernel), 2);
    g.memory_mb = spec.memory_mb;
    let seconds = WARMUP.as_secs_f64() + spec.window_s + 3.0;
    let w = Workload::npb(&spec.kernel, 2, seconds).shared_pages(spec.shared_pages);
    g.workload = Some(match spec.scenario {
        Scenario::Single => w,
        Scenario::Double => w.instances(2),
    });
    g.comm = Some((spec.config, run_dir.to_path_buf()));
    std::fs::create_dir_all(run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let mut guest = Guest::start(image, &g)?;
    guest.wait_up(Duration::from_secs(180))?;
    guest.wait_for("the workload's threads", Duration::from_secs(60), |t| {
        matches!(t.event, Event::Ready(_)).then_some(())
    })?;
    let pid = guest.pid();
    let mut client = connect(run_dir, pid, Duration::from_secs(10))?;
    std::thread::sleep(WARMUP);
    client.call(&Request::CommReset)?;
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(spec.window_s));
    let report = client.comm_report()?;
    let window_s = t0.elapsed().as_secs_f64();
    let summary = guest.wait_for(
        "the workload's summary",
        Duration::from_secs(60),
        |t| match &t.event {
            Event::Summary(v) => Some(v.clone()),
            _ => None,
        },
    )?;
    guest.stop();
    let (truth_shared, shared_pages) =
        truth_of(&summary).context("the workload's summary has no pattern")?;
    if let Some(why) = &report.disabled_reason {
        bail!("detection in QEMU stopped itself: {why}");
    }
    let matrix = vcpu_matrix(&report, 2);
    Ok(Run {
        kernel: spec.kernel.clone(),
        scenario: spec.scenario,
        cross: matrix[0][1],
        matrix,
        truth_shared,
        shared_pages,
        window_s,
        report,
    })
}

/// What [`compare`] runs.
#[derive(Debug, Clone)]
pub struct Comparison<'a> {
    pub kernel: &'a str,
    /// `single`, `double` or `both`.
    pub scenarios: &'a str,
    pub runs: usize,
    pub window_s: f64,
    /// Fields of the detection's configuration to change, as JSON ([`guest_config`]).
    pub overrides: Option<&'a str>,
    /// Extra pages each communicating pair shares ([`Spec::shared_pages`]).
    pub shared_pages: usize,
}

/// `runs` runs of `kernel` in each of `scenarios`, one after the other on the cached image,
/// each `window_s` seconds of sampling; `each` sees every run as it ends. Returns the single
/// and the double runs.
pub fn compare(c: &Comparison, mut each: impl FnMut(&Run)) -> Result<(Vec<Run>, Vec<Run>)> {
    let (kernel, window_s) = (c.kernel, c.window_s);
    let config = guest_config(256, c.overrides)?;
    crate::qemu::find_qemu()?;
    let image = crate::ensure_image(&crate::ImageSpec::default())?;
    let which: Vec<Scenario> = match c.scenarios {
        "both" => vec![Scenario::Single, Scenario::Double],
        s => vec![Scenario::parse(s)?],
    };
    // Removed when dropped, by the SIGINT/SIGTERM handler, and after a SIGKILL by the next run.
    let work = preheat_launch::launch::scratch_dir("guest-comm")?;
    let (mut single, mut double) = (Vec::new(), Vec::new());
    for _ in 0..c.runs {
        for &sc in &which {
            let spec = Spec {
                config,
                shared_pages: c.shared_pages,
                ..Spec::new(kernel, sc, window_s)
            };
            let r = run(&image, &spec, work.path());
            let r = r.with_context(|| format!("{kernel} {}", sc.name()))?;
            each(&r);
            match sc {
                Scenario::Single => single.push(r),
                Scenario::Double => double.push(r),
            }
        }
    }
    Ok((single, double))
}

/// [`CommConfig::guest`] for `memory_mb` with the fields of the JSON object `overrides`
/// replaced (e.g. `{"period_ms": 20, "pages": 128}`), validated.
pub fn guest_config(memory_mb: u32, overrides: Option<&str>) -> Result<CommConfig> {
    let mut v = serde_json::to_value(CommConfig::guest(memory_mb))?;
    if let Some(o) = overrides {
        let o: serde_json::Value = serde_json::from_str(o).context("--comm-config is not JSON")?;
        let (Some(dst), Some(src)) = (v.as_object_mut(), o.as_object()) else {
            bail!("--comm-config must be a JSON object");
        };
        for (k, x) in src {
            dst.insert(k.clone(), x.clone());
        }
    }
    let c: CommConfig = serde_json::from_value(v).context("--comm-config")?;
    c.validate().map_err(anyhow::Error::msg)?;
    Ok(c)
}

fn connect(run_dir: &Path, pid: u32, timeout: Duration) -> Result<AgentClient> {
    let t0 = Instant::now();
    loop {
        if agentctl::discover(run_dir).contains(&pid) {
            if let Ok(c) = AgentClient::connect(run_dir, pid) {
                return Ok(c);
            }
        }
        if t0.elapsed() > timeout {
            bail!(
                "no agent answers in QEMU (pid {pid}) within {timeout:?}: is the agent built \
                 (cargo build -p preheat-agent)?"
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The median of `v` (the lower middle for an even count); 0 when empty.
pub fn median(v: Vec<u64>) -> u64 {
    let v: Vec<f64> = v.into_iter().map(|x| x as f64).collect();
    preheat_model::stats::median(&v).map_or(0, |m| m as u64)
}

/// Runs of one kernel in both scenarios, side by side: per run the vCPU 0–1 events, induced
/// faults by vCPUs and by other threads, written pages and rounds; the medians; and whether the
/// medians separate the scenarios as the truth does.
pub fn render(kernel: &str, single: &[Run], double: &[Run]) -> String {
    let mut s = format!("{kernel}: host-side detection in QEMU (measured)\n");
    for (name, runs) in [("single", single), ("double", double)] {
        let Some(first) = runs.first() else { continue };
        s += &format!(
            "  {name} (truth: vCPUs {}; shared pages per instance {:?}); focus {}\n",
            if first.truth_shared {
                "share"
            } else {
                "share nothing"
            },
            first.shared_pages,
            first.report.focus
        );
        for r in runs {
            let rp = &r.report;
            s += &format!(
                "    matrix {:?}  events 0-1 {:>5}  faults vCPU {:>5} other {:>4}  written pages \
                 {:>7}  rounds {:>3}  window {:.1} s\n",
                r.matrix,
                r.cross,
                rp.counted_faults(),
                rp.faults_uncounted,
                rp.pages_written,
                rp.rounds,
                r.window_s
            );
        }
        s += &format!(
            "    median events 0-1 {} (n = {})\n",
            median(runs.iter().map(|r| r.cross).collect()),
            runs.len()
        );
    }
    if !single.is_empty() && !double.is_empty() {
        s += &format!("  {}\n", verdict(single, double));
        if let Some(f) = floor_verdict(single, double, preheat_group::floor::DEFAULT_MARGIN) {
            s += &format!("  {f}\n");
        }
    }
    s
}

/// The noise floor of runs whose vCPUs share nothing, each given as (events between the vCPUs,
/// vCPU faults): the median of their events per fault (runs without faults left out), `margin`
/// above it; `None` when no run took a fault. A single run can read far high (the guest moving
/// a thread between its vCPUs makes private pages look shared), hence the median.
pub fn noise_floor(runs: &[(u64, u64)], margin: f64) -> Option<preheat_group::NoiseFloor> {
    let rates: Vec<f64> = runs
        .iter()
        .filter(|(_, f)| *f > 0)
        .map(|&(e, f)| e as f64 / f as f64)
        .collect();
    Some(preheat_group::NoiseFloor {
        events_per_fault: preheat_model::stats::median(&rates)?,
        margin,
    })
}

/// The noise floor partial-auto calibrates (`cosched experiment --guests`) applied to these
/// runs: how many single runs it keeps as one set and how many double runs it splits. The floor
/// is the median events per vCPU fault of the double runs, for a double run of the *other*
/// double runs (leave one out, so no run judges itself); `None` with fewer than 2 double runs.
pub fn floor_verdict(single: &[Run], double: &[Run], margin: f64) -> Option<String> {
    use preheat_group::{group, CommMatrix, NoiseFloor, DEFAULT_T};
    if double.len() < 2 {
        return None;
    }
    let floor_of = |runs: &[&Run]| -> Option<NoiseFloor> {
        let samples: Vec<(u64, u64)> = runs
            .iter()
            .map(|r| (r.cross, r.report.counted_faults()))
            .collect();
        noise_floor(&samples, margin)
    };
    let kept_together = |f: &NoiseFloor, r: &Run| -> bool {
        let m = f.above(&r.matrix, r.report.counted_faults());
        CommMatrix::from_counts(&m)
            .ok()
            .and_then(|m| group(&m, DEFAULT_T).ok())
            .is_some_and(|g| g.sets.len() == 1)
    };
    let all: Vec<&Run> = double.iter().collect();
    let floor = floor_of(&all)?;
    let singles_kept = single.iter().filter(|r| kept_together(&floor, r)).count();
    let doubles_split = (0..double.len())
        .filter(|&i| {
            let others: Vec<&Run> = (0..double.len())
                .filter(|&j| j != i)
                .map(|j| &double[j])
                .collect();
            floor_of(&others).is_some_and(|f| !kept_together(&f, &double[i]))
        })
        .count();
    Some(format!(
        "partial-auto's noise floor (median of the double runs, {:.3} events per vCPU fault; \
         each double run judged by the others' median; margin {margin}×): {singles_kept} of {} \
         single runs kept as one set, {doubles_split} of {} double runs split",
        floor.events_per_fault,
        single.len(),
        double.len()
    ))
}

/// Whether the scenarios' medians are told apart as the truth says: sharing detected where the
/// threads share means at least twice the events of the independent runs and every single run
/// above every double run.
pub fn verdict(single: &[Run], double: &[Run]) -> String {
    let ms = median(single.iter().map(|r| r.cross).collect());
    let md = median(double.iter().map(|r| r.cross).collect());
    let min_s = single.iter().map(|r| r.cross).min().unwrap_or(0);
    let max_d = double.iter().map(|r| r.cross).max().unwrap_or(0);
    let apart = ms >= 2 * md.max(1) && min_s > max_d;
    let truth = single.first().is_some_and(|r| r.truth_shared);
    match (truth, apart) {
        (true, true) => format!("separated: single median {ms} vs double {md}, every single run above every double run"),
        (true, false) => format!("NOT separated: single median {ms} vs double {md} (smallest single {min_s}, largest double {max_d})"),
        (false, _) => format!("nothing to separate (the kernel's threads share nothing): single median {ms}, double {md}: the guest kernel's own sharing"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use preheat_model::comm::CommThread;

    #[test]
    fn vcpu_rows_in_vcpu_order() {
        let t = |tid, name: &str| CommThread {
            tid,
            name: name.into(),
            alive: true,
        };
        let r = CommReport {
            threads: vec![t(5, "CPU 1/TCG"), t(6, "CPU 0/TCG")],
            matrix: vec![vec![0, 9], vec![9, 0]],
            ..serde_json::from_str(
                r#"{"active":true,"mechanism":"","config":{},"threads":[],"matrix":[],"events":0,
                "faults_induced":0,"faults_foreign":0,"efault_retries":0,"rounds":0,
                "pages_revoked":0,"pages_released":0,"threads_dropped":0,"elapsed_ns":0,
                "disabled_reason":null}"#,
            )
            .unwrap()
        };
        assert_eq!(vcpu_matrix(&r, 2), vec![vec![0, 9], vec![9, 0]]);
        assert_eq!(vcpu_matrix(&r, 3)[2], vec![0, 0, 0]);
    }

    /// A run of `scenario` with `events` between the vCPUs over `faults` vCPU faults.
    fn run_of(scenario: Scenario, events: u64, faults: u64) -> Run {
        let report: CommReport = serde_json::from_str(&format!(
            r#"{{"active":true,"mechanism":"","config":{{}},"threads":[],"matrix":[],
            "events":{events},"faults_induced":{faults},"faults_foreign":0,"efault_retries":0,
            "rounds":0,"pages_revoked":0,"pages_released":0,"threads_dropped":0,
            "elapsed_ns":0,"disabled_reason":null}}"#
        ))
        .unwrap();
        Run {
            kernel: "mg".into(),
            scenario,
            matrix: vec![vec![0, events], vec![events, 0]],
            cross: events,
            truth_shared: scenario == Scenario::Single,
            shared_pages: vec![2],
            window_s: 3.0,
            report,
        }
    }

    #[test]
    fn the_floor_verdict_judges_each_double_run_by_the_others() {
        let single: Vec<Run> = [(474, 1841), (429, 2161), (700, 2392)]
            .iter()
            .map(|&(e, f)| run_of(Scenario::Single, e, f))
            .collect();
        let double: Vec<Run> = [(200, 1561), (225, 1927), (145, 1594)]
            .iter()
            .map(|&(e, f)| run_of(Scenario::Double, e, f))
            .collect();
        let v = floor_verdict(&single, &double, 1.5).unwrap();
        assert!(v.contains("3 of 3 single runs kept as one set"), "{v}");
        assert!(v.contains("3 of 3 double runs split"), "{v}");
        // A margin of 3 splits every sharing run too; one double run cannot judge itself.
        let v = floor_verdict(&single, &double, 3.0).unwrap();
        assert!(v.contains("0 of 3 single runs kept"), "{v}");
        assert_eq!(floor_verdict(&single, &double[..1], 1.5), None);
    }

    #[test]
    fn truth_from_the_summary() {
        let v = serde_json::json!({"pattern": [[0, 1], [1, 0]],
            "regions": [{"shared_pages": ["0x1", "0x2"]}]});
        assert_eq!(truth_of(&v), Some((true, vec![2])));
        let v = serde_json::json!({"pattern": [[0, 0], [0, 0]], "regions": []});
        assert_eq!(truth_of(&v), Some((false, vec![])));
        assert_eq!(median(vec![5, 1, 9]), 5);
        assert_eq!(median(vec![]), 0);
    }
}
