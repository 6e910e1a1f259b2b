//! Acceptance tests: the simulator against the paper's expectations (Busse et al., SAC'15 §5)
//! and against its own closed form. Every figure here is simulated.

use preheat_cosim::{
    compare, predicted_improvement, predicted_improvement_with, simulate, PhaseDist, Policy,
    Scenario, ScenarioError, Setup, SimError, SimParams,
};

/// Equal fixed phases and no costs: the conditions of the paper's back-of-envelope figures.
fn ideal() -> SimParams {
    SimParams {
        phase: PhaseDist::Fixed { us: 1000.0 },
        switch_us: 0.0,
        barrier_us: 0.0,
        ..SimParams::default()
    }
}

fn improvement(setup: &Setup, policy: Policy, p: &SimParams) -> f64 {
    let c = compare(setup, &[policy], p).unwrap();
    let o = c.results.iter().find(|o| o.policy == policy).unwrap();
    o.improvement_over_full.unwrap()
}

fn paper(cpus: usize, vms: &[usize], s: Scenario) -> Setup {
    Setup::scenario(cpus, vms, s, true).unwrap()
}

/// (a) One VM as large as the host, threads that never wait: nothing to gain.
#[test]
fn one_vm_without_barriers_gains_nothing() {
    let setup = Setup::scenario(8, &[8], Scenario::Double, false).unwrap();
    for phase in [
        PhaseDist::Fixed { us: 1000.0 },
        PhaseDist::LogNormal {
            mean_us: 1000.0,
            cv: 0.5,
        },
    ] {
        let p = SimParams {
            phase: phase.clone(),
            ..ideal()
        };
        let x = improvement(&setup, Policy::PartialStatic, &p);
        assert!(x.abs() <= 1e-9, "{phase:?}: {x}");
    }
    assert_eq!(predicted_improvement(&setup, Policy::PartialStatic), 0.0);
}

/// (b) The paper's 8-CPU host, VM1 = 8 vCPUs, VM2 = 4: 33% for double and quad, 100% for
/// single. (c) The closed form says the same.
#[test]
fn paper_expectations_on_eight_cpus() {
    for (s, want, tol) in [
        (Scenario::Double, 1.0 / 3.0, 0.01),
        (Scenario::Quad, 1.0 / 3.0, 0.01),
        (Scenario::Single, 1.0, 0.02),
    ] {
        let setup = paper(8, &[8, 4], s);
        let sim = improvement(&setup, Policy::PartialStatic, &ideal());
        assert!((sim - want).abs() <= tol, "{s:?}: simulated {sim}");
        let pred = predicted_improvement(&setup, Policy::PartialStatic);
        assert!((pred - want).abs() < 1e-9, "{s:?}: predicted {pred}");
        assert!((pred - sim).abs() <= tol, "{s:?}: {pred} vs {sim}");
    }
}

/// (c) partial-auto: the closed form with detection delay and sampler overhead matches too.
#[test]
fn auto_matches_its_closed_form() {
    for s in [Scenario::Single, Scenario::Double, Scenario::Quad] {
        let setup = paper(8, &[8, 4], s);
        let p = ideal();
        let c = compare(&setup, &[Policy::PartialAuto], &p).unwrap();
        let o = &c.results[1];
        assert_eq!(o.result.regrouped_at_s, Some(5.0));
        let sim = o.improvement_over_full.unwrap();
        let pred = predicted_improvement_with(&setup, Policy::PartialAuto, &p);
        assert_eq!(pred, o.predicted_improvement);
        assert!((sim - pred).abs() < 0.01, "{s:?}: {sim} vs {pred}");
        assert!(sim < improvement(&setup, Policy::PartialStatic, &p));
    }
}

/// (d) Same seed, same result; another seed with random phases, another result.
#[test]
fn deterministic_for_a_seed() {
    let setup = paper(8, &[8, 4], Scenario::Quad);
    let p = SimParams {
        duration_s: 2.0,
        ..SimParams::default()
    };
    assert!(matches!(p.phase, PhaseDist::LogNormal { .. }));
    for policy in Policy::ALL {
        let a = simulate(&setup, policy, &p).unwrap();
        let b = simulate(&setup, policy, &p).unwrap();
        assert_eq!(a, b, "{policy}");
        let c = simulate(
            &setup,
            policy,
            &SimParams {
                seed: 2,
                ..p.clone()
            },
        )
        .unwrap();
        assert_ne!(a, c, "{policy}: seed ignored");
    }
}

/// (f) The smallest host: 2 CPUs, VM1 = 2 vCPUs, VM2 = 1.
#[test]
fn two_cpu_host() {
    let single = improvement(
        &paper(2, &[2, 1], Scenario::Single),
        Policy::PartialStatic,
        &ideal(),
    );
    assert!((single - 1.0).abs() <= 0.02, "{single}");
    let double = improvement(
        &paper(2, &[2, 1], Scenario::Double),
        Policy::PartialStatic,
        &ideal(),
    );
    assert!((double - 1.0 / 3.0).abs() <= 0.01, "{double}");
    let e = Setup::scenario(2, &[2, 1], Scenario::Quad, true).unwrap_err();
    assert_eq!(e, ScenarioError::QuadTooSmall { vcpus: 2 });
    assert!(
        e.to_string()
            .contains("quad needs ≥ 4 vCPUs in the first VM"),
        "{e}"
    );
}

/// (g) Switch costs never help a policy: its run time and switch share grow with them.
///
/// They do **not** shrink partial coscheduling's improvement over full in this model (the
/// issue expected they would): full coscheduling changes the vCPU on every CPU at every slice
/// boundary (VM1 and VM2 alternate), while with partial sets one of the two sets of a slice
/// usually continues from the slice before (least attained service runs each set for two
/// slices out of three in double), so partial pays fewer switches, and the improvement grows
/// slightly with the cost. We pin that down here so a change to it is noticed.
#[test]
fn switch_costs() {
    let setup = paper(8, &[8, 4], Scenario::Double);
    let costs = [0.0, 5.0, 50.0, 500.0];
    let runs: Vec<_> = costs
        .iter()
        .map(|&c| {
            let p = SimParams {
                switch_us: c,
                ..ideal()
            };
            compare(&setup, &Policy::ALL, &p).unwrap()
        })
        .collect();
    for k in 0..Policy::ALL.len() {
        for w in runs.windows(2) {
            let (a, b) = (&w[0].results[k], &w[1].results[k]);
            assert!(
                b.result.total_run_time_s >= a.result.total_run_time_s,
                "{}: run time fell with a higher switch cost",
                a.policy
            );
            assert!(b.result.switch_cpu_share > a.result.switch_cpu_share);
        }
    }
    let imp = |c: &preheat_cosim::Comparison, p| {
        c.results
            .iter()
            .find(|o| o.policy == p)
            .unwrap()
            .improvement_over_full
            .unwrap()
    };
    for w in runs.windows(2) {
        assert!(imp(&w[1], Policy::PartialStatic) >= imp(&w[0], Policy::PartialStatic));
        // No coscheduling switches at every barrier: it loses to full at high costs.
        assert!(imp(&w[1], Policy::None) < imp(&w[0], Policy::None));
    }
    assert!(imp(&runs[3], Policy::None) < 0.0);
}

/// Coscheduled sets always run together; without coscheduling, members of an instance that
/// share CPUs with another VM do not, and they spin or yield at barriers.
#[test]
fn corun_and_accounting() {
    let setup = paper(8, &[8, 4], Scenario::Double);
    let c = compare(&setup, &Policy::ALL, &SimParams::default()).unwrap();
    for o in &c.results {
        let r = &o.result;
        let sum = r.compute_cpu_share + r.idle_cpu_share + r.spin_cpu_share + r.switch_cpu_share;
        assert!(
            (sum - 1.0).abs() < 1e-9,
            "{}: shares add to {sum}",
            o.policy
        );
        assert!(r.reserved_idle_cpu_share <= r.idle_cpu_share + 1e-12);
        assert_eq!(r.simulated_cpu_s, 8.0 * 20.0);
        let corun = r.corun_fraction.unwrap();
        if o.policy == Policy::None {
            assert!(corun < 0.9, "none: {corun}");
            assert_eq!(r.slices, 0);
        } else {
            assert!((corun - 1.0).abs() < 1e-9, "{}: {corun}", o.policy);
            assert_eq!(r.slices, 2000);
        }
    }
    // Full coscheduling of double idles a quarter of the host (half of it while VM2 runs).
    let full = &c.results[0].result;
    assert!(
        (full.idle_cpu_share - 0.25).abs() < 0.01,
        "{}",
        full.idle_cpu_share
    );
    let single = simulate(&paper(8, &[8, 4], Scenario::Single), Policy::Full, &ideal()).unwrap();
    assert!((single.reserved_idle_cpu_share - 0.25).abs() < 1e-9);
}

/// An instance that completes no phase has no run time: infinite, with a reason, and no
/// improvement figure (JSON null), rather than a division by zero.
#[test]
fn no_phase_no_run_time() {
    let setup = paper(4, &[4, 2], Scenario::Double);
    let p = SimParams {
        phase: PhaseDist::Fixed { us: 2e6 },
        duration_s: 1.0,
        ..ideal()
    };
    let c = compare(&setup, &[Policy::PartialStatic], &p).unwrap();
    let r = &c.results[1].result;
    assert!(r.instances.iter().all(|i| i.phases == 0));
    assert!(r.total_run_time_s.is_infinite());
    assert!(r.instances[0].note.as_deref().unwrap().contains("no phase"));
    assert_eq!(c.results[1].improvement_over_full, None);
    let json = serde_json::to_value(r).unwrap();
    assert!(json["total_run_time_s"].is_null());
    let back: preheat_cosim::SimResult = serde_json::from_value(json).unwrap();
    assert!(back.total_run_time_s.is_infinite());
}

#[test]
fn bad_parameters_are_refused() {
    let setup = paper(8, &[8, 4], Scenario::Double);
    let bad = [
        SimParams {
            slice_us: 0.0,
            ..SimParams::default()
        },
        SimParams {
            switch_us: 20_000.0,
            ..SimParams::default()
        },
        SimParams {
            duration_s: f64::NAN,
            ..SimParams::default()
        },
        SimParams {
            job_phases: 0,
            ..SimParams::default()
        },
        SimParams {
            phase: PhaseDist::Empirical { us: vec![] },
            ..SimParams::default()
        },
        SimParams {
            phase: PhaseDist::Fixed { us: 1e-3 },
            duration_s: 1e4,
            ..SimParams::default()
        },
    ];
    for p in bad {
        let e = simulate(&setup, Policy::Full, &p).unwrap_err();
        assert!(!e.to_string().is_empty());
    }
    let mut setup = setup;
    setup.cpus = 6;
    assert!(matches!(
        simulate(&setup, Policy::Full, &SimParams::default()),
        Err(SimError::Setup(ScenarioError::VmLargerThanHost { .. }))
    ));
}

/// A larger host behaves as the paper's: the expectations do not depend on the size.
#[test]
fn larger_host() {
    let p = SimParams {
        duration_s: 4.0,
        ..ideal()
    };
    for (s, want) in [(Scenario::Double, 1.0 / 3.0), (Scenario::Single, 1.0)] {
        let x = improvement(&paper(32, &[32, 16], s), Policy::PartialStatic, &p);
        assert!((x - want).abs() < 0.02, "{s:?}: {x}");
    }
    // Three VMs (our extension): 16 + 8 + 8 on 16 CPUs, double in the first.
    let three = paper(16, &[16, 8, 8], Scenario::Double);
    let pred = predicted_improvement(&three, Policy::PartialStatic);
    let sim = improvement(&three, Policy::PartialStatic, &p);
    assert!((pred - sim).abs() < 0.02, "{pred} vs {sim}");
}

/// Contention: on 2 CPUs, single, partial-static keeps both instances computing at once (each
/// at 1/(1 + c) of its speed alone) while full runs one at a time (full speed): the improvement
/// falls from 100% to 2/(1 + c) − 1, exactly.
#[test]
fn contention_closed_form_on_two_cpus() {
    let setup = Setup::scenario(2, &[2, 1], Scenario::Single, true).unwrap();
    for c in [0.0, 0.25, 0.6] {
        let p = SimParams {
            contention: c,
            ..ideal()
        };
        let sim = improvement(&setup, Policy::PartialStatic, &p);
        let want = 2.0 / (1.0 + c) - 1.0;
        assert!((sim - want).abs() < 0.01, "contention {c}: {sim} vs {want}");
    }
    // Double: full's VM1 slices also have both CPUs computing, so contention costs both.
    let setup = Setup::scenario(2, &[2, 1], Scenario::Double, true).unwrap();
    let p = SimParams {
        contention: 0.5,
        ..ideal()
    };
    let sim = improvement(&setup, Policy::PartialStatic, &p);
    assert!(sim > 0.0 && sim < 1.0 / 3.0, "{sim}");
}
