//! Every kernel runs with 4 threads in 2 instances and returns; checksums depend only on the
//! seed; `--seconds` runs stop every rank of an instance after the same iteration.

use std::time::Duration;

use preheat_npb::{run, Config, Kernel, Limit, Summary};

fn config(kernel: Kernel, seed: u64) -> Config {
    let mut c = Config::new(kernel);
    c.threads = 4;
    c.instances = 2;
    c.limit = Limit::Iterations(6);
    c.work = 5;
    c.seed = seed;
    c
}

#[test]
fn each_kernel_runs_and_is_deterministic_for_a_seed() {
    for kernel in Kernel::ALL {
        let a = run(&config(kernel, 7), |_| {}).unwrap();
        let b = run(&config(kernel, 7), |_| {}).unwrap();
        let c = run(&config(kernel, 8), |_| {}).unwrap();
        assert_eq!(a.iterations(), 6, "{kernel:?}");
        assert!(a.threads.iter().all(|t| t.outcome.iterations == 6));
        assert_eq!(a.checksum(), b.checksum(), "{kernel:?}: same seed");
        assert_ne!(a.checksum(), c.checksum(), "{kernel:?}: other seed");
        let s = Summary::new(&a);
        assert_eq!(s.threads, 4);
        assert_eq!(s.per_thread.len(), 4);
        let expect: Vec<Vec<usize>> = if kernel.synchronised() {
            vec![vec![0, 1], vec![2, 3]]
        } else {
            vec![vec![0], vec![1], vec![2], vec![3]]
        };
        assert_eq!(s.truth, expect, "{kernel:?}");
    }
}

#[test]
fn ready_comes_before_the_start_and_lists_every_thread() {
    let mut c = config(Kernel::Cg, 1);
    c.start_delay = Duration::from_millis(30);
    let mut seen = None;
    let t0 = std::time::Instant::now();
    run(&c, |r| seen = Some(r.clone())).unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(30),
        "start delay honoured"
    );
    let ready = seen.expect("on_ready called");
    assert_eq!(ready.pid, std::process::id());
    let idx: Vec<(usize, usize, usize)> = ready
        .threads
        .iter()
        .map(|t| (t.index, t.instance, t.rank))
        .collect();
    assert_eq!(idx, vec![(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]);
    assert_eq!(ready.threads[3].name, "npb-cg-i1-r1");
}

#[test]
fn seconds_limit_stops_instances_in_step() {
    for kernel in Kernel::ALL {
        let mut c = config(kernel, 3);
        c.limit = Limit::Seconds(Duration::from_millis(60));
        let out = run(&c, |_| {}).unwrap();
        assert!(out.wall >= Duration::from_millis(60), "{kernel:?}");
        if kernel.synchronised() {
            for pair in out.threads.chunks(2) {
                assert_eq!(pair[0].outcome.iterations, pair[1].outcome.iterations);
            }
        }
        assert!(out.iterations() >= 1);
    }
}

#[test]
fn one_rank_instances_and_uneven_shapes_run() {
    for kernel in Kernel::ALL {
        let mut c = config(kernel, 1);
        c.threads = 3;
        c.instances = 3;
        assert_eq!(run(&c, |_| {}).unwrap().iterations(), 6);
        c.threads = 6;
        c.instances = 2;
        assert_eq!(run(&c, |_| {}).unwrap().iterations(), 6);
    }
}

#[test]
fn bad_configs_are_refused() {
    let mut c = config(Kernel::Mg, 1);
    c.threads = 0;
    assert!(c.validate().unwrap_err().contains("--threads"));
    c.threads = 3;
    c.instances = 2;
    assert!(c.validate().unwrap_err().contains("divide"));
    assert!(run(&c, |_| {}).is_err());
    c.instances = 1;
    c.limit = Limit::Iterations(0);
    assert!(c.validate().is_err());
}
