//! The worked example of Busse et al. (SAC'15) §3: the matrix of Figure 3, the tree of
//! Figure 4 (a)–(b) and the sets of Figure 4 (c) at t = 1.5.

use preheat_group::{group, CommMatrix, Tree};

const FIGURE_3: &str = "[[0,6,1,9,6],[6,0,1,6,7],[1,1,0,1,1],[9,6,1,0,6],[6,7,1,6,0]]";

fn figure_3() -> CommMatrix {
    CommMatrix::from_json_str(FIGURE_3).unwrap()
}

#[test]
fn figure_4_tree() {
    let t = Tree::build(&figure_3());
    let inner: Vec<(Vec<usize>, f64, usize, usize)> = t.nodes[5..]
        .iter()
        .map(|x| (x.tasks.clone(), x.d, x.left.unwrap(), x.right.unwrap()))
        .collect();
    assert_eq!(
        inner,
        vec![
            (vec![0, 3], 9.0, 0, 3),
            (vec![1, 4], 7.0, 1, 4),
            // Eq. 1: (CE(0,1) + CE(0,4) + CE(3,1) + CE(3,4)) / (2·2) = (6+6+6+6)/4.
            (vec![0, 1, 3, 4], 6.0, 5, 6),
            (vec![0, 1, 2, 3, 4], 1.0, 7, 2),
        ]
    );
    assert_eq!(t.root, 8);
    assert_eq!(t.tasks(), 5);
}

#[test]
fn figure_4c_sets_at_t_1_5() {
    let g = group(&figure_3(), 1.5).unwrap();
    // The root splits: 6 > 1.5·1. {0,1,3,4} does not: max(9, 7) = 9 is not more than 1.5·6.
    assert_eq!(g.sets, vec![vec![0, 1, 3, 4], vec![2]]);
    assert_eq!(g.set_nodes, vec![7, 2]);
    assert_eq!(
        g.render_tree(&[]),
        "d=1.000 {0,1,2,3,4}  [split: 6.000 > 1.5 x 1.000]\n\
         \x20 d=6.000 {0,1,3,4}  [set 1: 9.000 <= 1.5 x 6.000]\n\
         \x20   d=9.000 {0,3}\n\
         \x20     task 0\n\
         \x20     task 3\n\
         \x20   d=7.000 {1,4}\n\
         \x20     task 1\n\
         \x20     task 4\n\
         \x20 task 2  [set 2]\n"
    );
}

#[test]
fn figure_3_at_other_thresholds() {
    let m = figure_3();
    let sets = |t: f64| group(&m, t).unwrap().sets;
    // Just below 1.5, 9 > t·6 splits {0,1,3,4}; {0,3} and {1,4} stay (0 < t·9, 0 < t·7).
    assert_eq!(sets(1.49), vec![vec![0, 3], vec![1, 4], vec![2]]);
    // From t = 6 on the root stays together (6 is not more than 6·1).
    assert_eq!(sets(5.99), vec![vec![0, 1, 3, 4], vec![2]]);
    assert_eq!(sets(6.0), vec![vec![0, 1, 2, 3, 4]]);
    assert_eq!(sets(f64::INFINITY), vec![vec![0, 1, 2, 3, 4]]);
    assert_eq!(sets(0.0), (0..5).map(|x| vec![x]).collect::<Vec<_>>());
}

#[test]
fn both_json_shapes_and_json_output() {
    let a = figure_3();
    let b = CommMatrix::from_json_str(&format!(
        r#"{{"matrix":{FIGURE_3},"labels":["v0","v1","v2","v3","v4"]}}"#
    ))
    .unwrap();
    assert_eq!(b.labels()[2], "v2");
    let (ga, gb) = (group(&a, 1.5).unwrap(), group(&b, 1.5).unwrap());
    assert_eq!(ga, gb);
    let v = serde_json::to_value(&ga).unwrap();
    assert_eq!(v["t"], 1.5);
    assert_eq!(v["sets"], serde_json::json!([[0, 1, 3, 4], [2]]));
    assert_eq!(v["tree"]["root"], 8);
    assert_eq!(v["tree"]["nodes"][7]["d"], 6.0);
    assert_eq!(
        v["tree"]["nodes"][7]["tasks"],
        serde_json::json!([0, 1, 3, 4])
    );
    assert_eq!(v["tree"]["nodes"][2]["left"], serde_json::Value::Null);
    let inf = serde_json::to_value(group(&a, f64::INFINITY).unwrap()).unwrap();
    assert_eq!(inf["t"], serde_json::Value::Null);
}
