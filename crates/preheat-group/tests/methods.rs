//! The two ways to choose sets from the tree, the paper's split rule and the cut with the
//! highest modularity, on generated noisy block matrices with a planted answer (simulated).
//! The seed sets are fixed, so every rate below is exact and deterministic: these are the
//! numbers `preheat groups compare` prints and the README quotes.

use preheat_group::compare::{compare, compare_default, NOISE_LEVELS};
use preheat_group::planted::Spec;
use preheat_group::{group, group_with, CommMatrix, GroupMethod};
use proptest::prelude::*;

/// Recovered counts (paper, modularity) per noise level of `compare`.
fn rates(spec: &Spec, seeds: u64, levels: &[f64]) -> Vec<(f64, u64, u64)> {
    compare(spec, seeds, levels, preheat_group::DEFAULT_T)
        .rows
        .iter()
        .map(|r| (r.noise, r.recovered[0], r.recovered[1]))
        .collect()
}

#[test]
fn modularity_recovers_more_where_the_paper_recovers_four_in_five() {
    let c = compare_default(200);
    assert!(c.simulated);
    assert_eq!(c.methods, GroupMethod::ALL.to_vec());
    let got: Vec<(f64, u64, u64)> = c
        .rows
        .iter()
        .map(|r| {
            assert_eq!(r.samples, 200);
            (r.noise, r.recovered[0], r.recovered[1])
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (0.0, 200, 200),
            (0.05, 178, 198),
            // The paper's rule at about 4 in 5 (81.5%); modularity 99%.
            (0.15, 163, 198),
            (0.3, 79, 195),
            (0.5, 40, 181),
        ]
    );
    assert_eq!(got.iter().map(|r| r.0).collect::<Vec<_>>(), NOISE_LEVELS);
    let table = c.render();
    assert!(table.starts_with("simulated: "), "{table}");
    assert!(table.contains("200 seeds"), "{table}");
    assert!(
        table.contains("0.15        163/200  81.5%        198/200  99.0%"),
        "{table}"
    );
}

#[test]
fn never_worse_without_noise_on_the_fixed_seeds() {
    let spec = Spec::default();
    for seed in 0..200 {
        let p = spec.generate(seed, 0.0);
        let paper = group(&p.matrix, preheat_group::DEFAULT_T).unwrap();
        let modularity = group_with(&p.matrix, GroupMethod::Modularity, 1.5).unwrap();
        assert_eq!(paper.sets, p.sets, "seed {seed}: paper");
        assert_eq!(modularity.sets, p.sets, "seed {seed}: modularity");
    }
}

#[test]
fn the_resolution_limit_without_noise() {
    // Seed 368 (outside the 200 above): planted {0,9}, {1,4,8}, {2,12} and a group of 7.
    // Modularity joins the small groups, the paper's rule does not (module docs, limits).
    let p = Spec::default().generate(368, 0.0);
    assert_eq!(p.sets.len(), 4);
    assert_eq!(group(&p.matrix, 1.5).unwrap().sets, p.sets);
    let g = group_with(&p.matrix, GroupMethod::Modularity, 1.5).unwrap();
    assert_eq!(g.sets.len(), 2);
    assert_eq!(g.sets[0], vec![0, 1, 2, 4, 8, 9, 12]);
}

#[test]
fn known_limits_one_group_and_lone_tasks() {
    let levels = [0.0, 0.15, 0.3, 0.5];
    // One planted group: modularity splits it by chance at high noise more often.
    let one = Spec {
        tasks: (4, 12),
        groups: (1, 1),
        min_size: 4,
        ..Spec::default()
    };
    assert_eq!(
        rates(&one, 200, &levels),
        vec![
            (0.0, 200, 200),
            (0.15, 197, 200),
            (0.3, 170, 156),
            (0.5, 116, 74)
        ]
    );
    // Groups of one task allowed: both are weak (two lone tasks with background between them
    // stay together), the paper's rule more so.
    let lone = Spec {
        tasks: (8, 12),
        groups: (2, 6),
        min_size: 1,
        ..Spec::default()
    };
    assert_eq!(
        rates(&lone, 200, &levels),
        vec![
            (0.0, 98, 178),
            (0.15, 85, 120),
            (0.3, 44, 113),
            (0.5, 25, 99)
        ]
    );
}

proptest! {
    #[test]
    fn equal_groups_without_noise_are_recovered(
        k in 1usize..=5,
        s in 2usize..=6,
        background in 0.0f64..0.49,
        seed in any::<u64>(),
    ) {
        let spec = Spec {
            tasks: (k * s, k * s),
            groups: (k, k),
            min_size: s,
            background,
            ..Spec::default()
        };
        let p = spec.generate(seed, 0.0);
        let g = group_with(&p.matrix, GroupMethod::Modularity, 1.5).unwrap();
        prop_assert_eq!(g.sets, p.sets);
    }

    /// On two tasks (the 2-vCPU VMs this project's machines run, guests and thread groups
    /// alike) the methods cannot differ: the paper's rule splits two leaves only at zero events,
    /// and modularity's one set (Q = 0) beats two singletons (Q = −1/2) for any positive count.
    /// So on the matrices detected here the comparison is settled by construction.
    #[test]
    fn two_tasks_group_alike_under_both_methods(e in 0u64..100_000) {
        let m = CommMatrix::new(vec![vec![0.0, e as f64], vec![e as f64, 0.0]]).unwrap();
        let paper = group_with(&m, GroupMethod::PaperSplit, 1.5).unwrap();
        let modularity = group_with(&m, GroupMethod::Modularity, 1.5).unwrap();
        prop_assert_eq!(&paper.sets, &modularity.sets);
        let one = e > 0;
        prop_assert_eq!(paper.sets.len() == 1, one);
    }
}
