//! End-to-end checks of the I/O side: the emulated device follows its model, `io bench` runs
//! on the emulated device and on a small real file and fills every field, `io kernels` reports
//! accuracy in [0, 1]. No timing thresholds: the machine may be busy.

use std::path::PathBuf;

use preheat_predict::anticipatory_read::{
    AnticipatoryReader, EmulatedDevice, Label, Policy, ReaderConfig, ServiceModel,
};
use preheat_predict::bench::{run_bench, BenchConfig, DeviceSpec};
use preheat_predict::kernels::{run_kernels, KernelsConfig};
use serde_json::Value;

fn tmpdir() -> PathBuf {
    let base = option_env!("CARGO_TARGET_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base).unwrap();
    base
}

/// The emulated device's service times follow its documented model: mean within 10% over 2000
/// samples (a statistical check on the sampled service times, not on wall time), and it never
/// delivers a completion before `submit + service`.
#[test]
fn emulated_device_matches_its_model() {
    let model = ServiceModel::default();
    let mut r = AnticipatoryReader::new(
        Box::new(EmulatedDevice::new(model, 42)),
        ReaderConfig {
            policy: Policy::Awake,
            ..Default::default()
        },
    )
    .unwrap();
    let sizes = [4096usize, 16384, 65536];
    let (mut sum_model, mut sum_sampled, mut sum_wall) = (0.0, 0.0, 0.0);
    let n = 2000;
    for i in 0..n {
        let len = sizes[i % 3];
        let rec = r.read(0, len).unwrap();
        let s = rec
            .modeled_ns
            .expect("emulated device reports its service time");
        assert!(rec.device_ns >= s, "completion delivered early");
        sum_model += model.mean_ns(len);
        sum_sampled += s as f64;
        sum_wall += rec.device_ns as f64;
    }
    let (m, s, w) = (
        sum_model / n as f64,
        sum_sampled / n as f64,
        sum_wall / n as f64,
    );
    eprintln!(
        "emulated: model mean {:.1} µs, sampled {:.1} µs, delivered (wall, info only) {:.1} µs",
        m / 1e3,
        s / 1e3,
        w / 1e3
    );
    assert!((s / m - 1.0).abs() < 0.10, "sampled mean {s} vs model {m}");
}

fn check_bench_json(v: &Value, label: &str, policies: usize, gaps: usize, n: usize) {
    assert_eq!(v["label"], label);
    let cells = v["cells"].as_array().unwrap();
    assert_eq!(cells.len(), policies * gaps);
    for c in cells {
        assert_eq!(c["label"], label, "{c}");
        assert_eq!(c["requests"], n);
        for k in ["p50", "p99", "p50_lo", "p99_hi", "mean"] {
            assert!(c["latency_us"][k].is_number(), "latency_us.{k}: {c}");
        }
        assert!(c["latency_us"]["p50"].as_f64().unwrap() > 0.0);
        assert!(c["awake_us"]["mean"].is_number());
        assert!(c["dispatch_us"]["p50"].is_number());
        assert!(c["device_us"]["p50"].is_number());
        let cs = c["censored_share"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&cs));
        assert!(c["censored"].is_number());
        assert!(c["bootstrap"].is_number());
        // r is a number whenever sizes vary and times are not all equal.
        let r = c["device_fit"]["pearson_r"].as_f64().expect("device r");
        assert!((-1.0..=1.0).contains(&r));
        assert_eq!(c["device_fit"]["n"], n);
        for k in [
            "exact_samples",
            "censored_samples",
            "pearson_r",
            "margin_us",
            "slope_us_per_kib",
        ] {
            assert!(c["model"].get(k).is_some(), "model.{k} missing: {c}");
        }
        assert!(c.get("cpu_us_per_request_schedstat").is_some());
        match c["policy"].as_str().unwrap() {
            // Spinning never blocks, so it never finds the read done on a wake-up.
            "awake" => assert_eq!(cs, 0.0),
            "anticipatory" => {
                assert!(c["planned_wake_us"].is_object() || c["bootstrap"] == n)
            }
            _ => {}
        }
        if label == "emulated" {
            assert!(c["modeled_service_us"]["mean"].is_number());
        } else {
            assert!(c["modeled_service_us"].is_null());
        }
    }
}

#[test]
fn bench_on_emulated_device_fills_every_field() {
    let cfg = BenchConfig {
        device: DeviceSpec::Emulated,
        gaps_us: vec![0, 200],
        requests: 24,
        warmup: 24,
        ..Default::default()
    };
    let r = run_bench(&cfg).unwrap();
    assert_eq!(r.label, Label::Emulated);
    let v = serde_json::to_value(&r).unwrap();
    check_bench_json(&v, "emulated", 3, 2, 24);
    assert!(v["emulated_model"]["base_ns"].is_number());
}

#[test]
fn window_policy_runs_through_its_own_planner() {
    // The window policy starts an in-process wake planner for the run (unprivileged it only
    // spins; as root it holds PM QoS and restores it) and must serve every read correctly.
    let cfg = BenchConfig {
        device: DeviceSpec::Emulated,
        gaps_us: vec![200],
        requests: 24,
        warmup: 8,
        policies: vec![Policy::Default, Policy::Window],
        ..Default::default()
    };
    let r = run_bench(&cfg).unwrap();
    let v = serde_json::to_value(&r).unwrap();
    check_bench_json(&v, "emulated", 2, 1, 24);
    let cells = v["cells"].as_array().unwrap();
    assert!(cells.iter().any(|c| c["policy"] == "window"));
}

#[test]
fn bench_on_small_real_file_fills_every_field() {
    let dir = tmpdir().join("preheat-predict-bench");
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = BenchConfig {
        device: DeviceSpec::File(dir.clone()),
        file_mib: 4,
        gaps_us: vec![0, 100],
        requests: 16,
        warmup: 20,
        ..Default::default()
    };
    let r = match run_bench(&cfg) {
        Ok(r) => r,
        Err(e) if format!("{e:#}").contains("O_DIRECT") => {
            preheat_testsupport::skip!("o-direct", "{e:#}");
            return;
        }
        Err(e) => panic!("{e:#}"),
    };
    assert_eq!(r.label, Label::Measured);
    assert!(dir.join("preheat-io-bench.dat").exists());
    let v = serde_json::to_value(&r).unwrap();
    check_bench_json(&v, "measured", 3, 2, 16);
    assert!(v["emulated_model"].is_null());
}

#[test]
fn kernels_report_accuracy_in_unit_interval() {
    let cfg = KernelsConfig {
        iterations: 30,
        points: 2000,
        block: 5,
        ..Default::default()
    };
    let r = run_kernels(&cfg).unwrap();
    assert_eq!(r.modes.len(), 3);
    let a = r.anticipatory_accuracy.expect("anticipatory mode ran");
    assert!(a.scored > 0);
    for x in [a.within_tolerance, a.one_minus_mape] {
        let x = x.unwrap();
        assert!((0.0..=1.0).contains(&x), "{x}");
    }
    for m in &r.modes {
        assert_eq!(m.iterations, 30);
        assert_eq!(m.label, Label::Measured);
        assert!(m.total_ms > 0.0);
        assert!(m.speedup_vs_interrupt.unwrap() > 0.0);
        assert!(m.awake_vs_busy.is_some());
        assert_eq!(m.accuracy.len(), 3);
        for na in &m.accuracy {
            let w = na.accuracy.within_tolerance.unwrap();
            assert!((0.0..=1.0).contains(&w));
        }
    }
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["label"], "measured");
}
