//! A cached calibration that no longer describes the host is measured again (the host can
//! change how fast it wakes idle vCPUs within one boot: `calibrate`'s module docs).

mod timing {
    use preheat_wake::calibrate::{self, Calibration, MachineKey, MechResult};
    use preheat_wake::Mechanism;

    fn result(mech: &str, p50: f64, lo: f64, hi: f64) -> MechResult {
        MechResult {
            mech: mech.into(),
            n: 25,
            p50_us: p50,
            p50_ci_us: [lo, hi],
            p99_us: hi,
        }
    }

    /// A cached calibration whose plain idle took 5 ms to wake a thread (no machine of this
    /// kind does: 2–100 µs) is found stale by the re-check, measured again and replaced.
    #[test]
    fn a_stale_cached_calibration_is_measured_again() {
        if preheat_engine::os::online_cpus() < 2 {
            return preheat_testsupport::skip("2 CPUs", "calibration needs a sleeper and a waker");
        }
        let dir = tempfile::tempdir().unwrap();
        let stale = Calibration {
            label: "measured".into(),
            machine: MachineKey::current(),
            measured_unix_s: 1,
            gap_us: calibrate::GAP_US,
            sleeper_cpu: 1,
            waker_cpu: 0,
            results: vec![
                result("none", 5000.0, 4900.0, 5100.0),
                result("spin", 20.0, 18.0, 22.0),
            ],
            skipped: vec![],
            best: Some(Mechanism::Spin),
            others_cpu_share: Some(0.0),
            limited_to: vec!["spin".into()],
            predictor: None,
        };
        calibrate::store(dir.path(), &stale).unwrap();
        assert_eq!(calibrate::cached(dir.path()).as_ref(), Some(&stale));
        let mut said = String::new();
        let c = calibrate::load_or_calibrate(dir.path(), |m| said = m.to_string()).unwrap();
        assert!(said.contains("the host changed"), "{said}");
        let idle = c.result("none").expect("plain idle measured");
        assert!(idle.p50_us < 2500.0, "{}", c.summary());
        // Measured again among the same mechanisms as the stale one.
        assert_eq!(c.limited_to, vec!["spin".to_string()]);
        assert!(c.measured_unix_s > 1);
    }
}
