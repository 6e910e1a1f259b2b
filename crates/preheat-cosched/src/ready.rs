//! The readiness decisions, without I/O: which sets have something to run, and which CPU the
//! threads a slice does not choose wait on.
//!
//! A managed thread's readiness is read once per slice decision from its stat line
//! ([`crate::thread::StateProbe`]): `R` is runnable, anything else (`S` sleeping — a halted QEMU
//! vCPU waits on a condition variable —, `D`, `T`, …) is not. A vCPU without a thread (an idle
//! vCPU of a thread-group VM, an exited thread) is `None`.
//!
//! * **Sets** ([`sets_ready`]): a set is ready when at least one member is runnable; the planner
//!   skips the others and falls through to the next set in its order. A halted vCPU that
//!   wakes during a slice waits (parked) until the next decision, at most one slice. When
//!   *nothing* is runnable, every set with a live member counts as ready (the behaviour
//!   without the test), so the slice is not empty and a thread that wakes finds its set
//!   chosen.
//! * **Parking** ([`park_cpus`]): the user-space coscheduler keeps an unchosen thread from
//!   running by parking it at a lower real-time priority on a CPU that runs a chosen thread. It
//!   waits only while that thread is runnable: behind a halted vCPU it simply runs (the leak
//!   measured on real guests). So unchosen threads park only behind chosen threads that are
//!   runnable; a CPU whose chosen thread is halted is left to it alone and idles while it
//!   sleeps, which is what strict coscheduling does. What stays: a chosen thread that halts
//!   *during* the slice lets the threads parked behind it run until the next decision (counted
//!   as leak).

/// Whether each set (its members as vCPU indices) has something to run, given each vCPU's
/// readiness (`None`: no thread). Falls back to liveness when no member of any set is runnable.
pub fn sets_ready(members: &[&[usize]], runnable: &[Option<bool>]) -> Vec<bool> {
    let any = |set: &[usize], f: fn(Option<bool>) -> bool| set.iter().any(|&v| f(runnable[v]));
    let ready: Vec<bool> = members
        .iter()
        .map(|set| any(set, |r| r == Some(true)))
        .collect();
    if ready.iter().any(|&r| r) {
        ready
    } else {
        members
            .iter()
            .map(|set| any(set, |r| r.is_some()))
            .collect()
    }
}

/// The CPUs on which unchosen threads may wait: those whose chosen vCPU (`slice_cpu[c]`, when
/// `chosen` for it) is runnable; if there is none, every CPU with a chosen vCPU (the slice then
/// holds nothing runnable, see [`sets_ready`]).
pub fn park_cpus(
    slice_cpu: &[Option<usize>],
    chosen: &[bool],
    runnable: &[Option<bool>],
) -> Vec<bool> {
    let busy: Vec<bool> = slice_cpu
        .iter()
        .map(|v| matches!(v, Some(v) if chosen[*v]))
        .collect();
    let good: Vec<bool> = slice_cpu
        .iter()
        .zip(&busy)
        .map(|(v, &b)| b && matches!(v, Some(v) if runnable[*v] == Some(true)))
        .collect();
    if good.iter().any(|&g| g) {
        good
    } else {
        busy
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use preheat_cosim::plan::{CoSet, Planner};

    const R: Option<bool> = Some(true);
    const S: Option<bool> = Some(false);

    #[test]
    fn a_set_is_ready_when_a_member_is_runnable() {
        // VM1 = {0, 1} with vCPU 1 halted, VM2 = {2} running; a set with no thread at all.
        let sets: [&[usize]; 3] = [&[0, 1], &[2], &[3]];
        assert_eq!(sets_ready(&sets, &[R, S, R, None]), [true, true, false]);
        assert_eq!(sets_ready(&sets, &[S, S, R, None]), [false, true, false]);
        // Nothing runnable anywhere: liveness decides (the slice is not left empty).
        assert_eq!(sets_ready(&sets, &[S, S, S, None]), [true, true, false]);
        assert_eq!(
            sets_ready(&sets, &[None, None, None, None]),
            [false, false, false]
        );
    }

    #[test]
    fn the_planner_falls_through_a_halted_set() {
        // partial-static in `single`: VM1's vCPUs in sets of their own, vCPU 1 idle (halted).
        let set = |vm, v| CoSet {
            vm,
            members: vec![v],
        };
        let sets = vec![set(0, 0), set(0, 1), set(1, 2)];
        let mut p = Planner::new(2, sets).unwrap();
        let runnable = [R, S, R];
        for _ in 0..10 {
            let members: Vec<&[usize]> = p.sets().iter().map(|s| &s.members[..]).collect();
            let slice = p.next_slice(&sets_ready(&members, &runnable));
            // The halted set never takes a CPU; the two runnable ones always share the host.
            let mut chosen = slice.sets.clone();
            chosen.sort_unstable();
            assert_eq!(chosen, [0, 2], "{slice:?}");
            p.charge(&slice, 10_000_000);
        }
    }

    #[test]
    fn unchosen_threads_park_behind_a_runnable_member() {
        // full, VM1 = {0, 1} chosen on CPUs 0 and 1, VM2 = {2} waits.
        let slice = [Some(0), Some(1)];
        let chosen = [true, true, false];
        assert_eq!(park_cpus(&slice, &chosen, &[S, R, R]), [false, true]);
        assert_eq!(park_cpus(&slice, &chosen, &[R, R, R]), [true, true]);
        // Both halted: behind any chosen thread (nothing better exists).
        assert_eq!(park_cpus(&slice, &chosen, &[S, S, R]), [true, true]);
        // A CPU the plan leaves idle, or whose vCPU has no thread, is never a parking place.
        assert_eq!(
            park_cpus(&[Some(2), None], &[false, false, true], &[S, S, S]),
            [true, false]
        );
        assert_eq!(
            park_cpus(&[Some(0), Some(1)], &[false, true, false], &[R, S, R]),
            [false, true]
        );
    }
}
