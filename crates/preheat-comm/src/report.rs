//! What is read off a report: a sub-matrix of some threads, the threads' labels.

use preheat_model::comm::CommReport;

/// The report restricted to threads whose name starts with `prefix` (a sub-matrix).
pub fn only_threads(r: &CommReport, prefix: &str) -> CommReport {
    let keep: Vec<usize> = r
        .threads
        .iter()
        .enumerate()
        .filter(|(_, t)| t.name.starts_with(prefix))
        .map(|(i, _)| i)
        .collect();
    let matrix: Vec<Vec<u64>> = keep
        .iter()
        .map(|&i| keep.iter().map(|&j| r.matrix[i][j]).collect())
        .collect();
    CommReport {
        threads: keep.iter().map(|&i| r.threads[i].clone()).collect(),
        events: preheat_model::comm::events_of(&matrix),
        matrix,
        ..r.clone()
    }
}

/// Thread labels: `name/tid` (name empty: `tid`).
pub fn labels(r: &CommReport) -> Vec<String> {
    r.threads
        .iter()
        .map(|t| {
            if t.name.is_empty() {
                t.tid.to_string()
            } else {
                format!("{}/{}", t.name, t.tid)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use preheat_model::comm::{CommConfig, CommThread};

    fn report() -> CommReport {
        let thread = |tid, name: &str| CommThread {
            tid,
            name: name.to_string(),
            alive: true,
        };
        CommReport {
            active: true,
            mechanism: "mprotect".into(),
            config: CommConfig::default(),
            threads: vec![thread(10, "main"), thread(11, "w-0"), thread(12, "w-1")],
            matrix: vec![vec![0, 5, 1], vec![5, 0, 7], vec![1, 7, 0]],
            events: 13,
            faults_induced: 0,
            faults_foreign: 0,
            efault_retries: 0,
            rounds: 0,
            pages_revoked: 0,
            pages_released: 0,
            threads_dropped: 0,
            faults_uncounted: 0,
            pages_written: 0,
            focus: String::new(),
            elapsed_ns: 0,
            disabled_reason: None,
        }
    }

    #[test]
    fn a_sub_matrix_keeps_the_threads_of_a_prefix_and_recounts_events() {
        let sub = only_threads(&report(), "w-");
        assert_eq!(sub.matrix, vec![vec![0, 7], vec![7, 0]]);
        assert_eq!(labels(&sub), ["w-0/11", "w-1/12"]);
        assert_eq!(sub.events, preheat_model::comm::events_of(&sub.matrix));
    }

    #[test]
    fn a_thread_without_a_name_is_labelled_by_its_tid() {
        let mut r = report();
        r.threads[0].name.clear();
        assert_eq!(labels(&r), ["10", "w-0/11", "w-1/12"]);
    }
}
