//! The layout rule, checked on what the ranks really touched: for every kernel, each shared
//! page is accessed only by threads of its own instance, each mailbox page is written and
//! read by exactly its designed pair, the barrier page by exactly the instance's ranks, and
//! private pages by nobody else. The observed sharing equals the summary's `pattern`.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use preheat_npb::layout::PAGE_BYTES;
use preheat_npb::{run, Config, Kernel, Limit, RunOutcome, Summary};

fn traced(kernel: Kernel, threads: usize, instances: usize, shared: usize) -> RunOutcome {
    let mut c = Config::new(kernel);
    c.shared_pages = shared;
    c.threads = threads;
    c.instances = instances;
    c.limit = Limit::Iterations(4);
    c.work = 2;
    c.trace_pages = true;
    run(&c, |_| {}).expect("run")
}

fn pages(r: &Range<usize>) -> BTreeSet<usize> {
    (r.start..r.end).step_by(PAGE_BYTES).collect()
}

/// Page → designed sharers, for every page of every region.
fn designed(out: &RunOutcome) -> BTreeMap<usize, BTreeSet<usize>> {
    let ranks = out.config.ranks();
    let mut m = BTreeMap::new();
    for r in &out.regions {
        for p in pages(&r.range) {
            m.insert(p, BTreeSet::new());
        }
        if out.config.kernel.synchronised() {
            let all = (r.instance * ranks..(r.instance + 1) * ranks).collect();
            m.insert(r.barrier_page, all);
        }
        for mb in &r.mailboxes {
            for p in mb.page_addrs() {
                m.insert(p, [mb.threads.0, mb.threads.1].into());
            }
        }
    }
    m
}

fn check(kernel: Kernel, threads: usize, instances: usize) {
    check_shared(kernel, threads, instances, 0);
}

/// [`check`] with `shared` shared pages per mailbox.
fn check_shared(kernel: Kernel, threads: usize, instances: usize, shared: usize) {
    let out = traced(kernel, threads, instances, shared);
    let what = format!("{} {threads}/{instances} +{shared}", kernel.name());

    // Regions and private buffers are disjoint, page-aligned and at least 128 KiB.
    let mut owned: Vec<Range<usize>> = out.regions.iter().map(|r| r.range.clone()).collect();
    owned.extend(out.threads.iter().map(|t| t.private.clone()));
    for (i, a) in owned.iter().enumerate() {
        assert_eq!(a.start % PAGE_BYTES, 0, "{what}");
        assert!(a.len() >= 128 * 1024, "{what}: {a:x?} smaller than 128 KiB");
        for b in &owned[i + 1..] {
            assert!(
                a.end <= b.start || b.end <= a.start,
                "{what}: {a:x?} {b:x?}"
            );
        }
    }

    // Who wrote and who read each shared page.
    let mut writers: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    let mut readers: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    for t in &out.threads {
        let p = t.pages.as_ref().expect("pages recorded");
        let region = &out.regions[t.info.instance].range;
        for &page in p.written.iter().chain(&p.read) {
            assert!(
                region.contains(&page),
                "{what}: thread {} touched {page:x} outside its instance's region",
                t.info.index
            );
        }
        for &page in &p.written {
            writers.entry(page).or_default().insert(t.info.index);
        }
        for &page in &p.read {
            readers.entry(page).or_default().insert(t.info.index);
        }
    }
    for (page, sharers) in designed(&out) {
        let w = writers.remove(&page).unwrap_or_default();
        let r = readers.remove(&page).unwrap_or_default();
        assert_eq!(w, sharers, "{what}: writers of page {page:x}");
        assert_eq!(r, sharers, "{what}: readers of page {page:x}");
    }
    assert!(writers.is_empty() && readers.is_empty(), "{what}");

    // The observed "share any page" graph is the summary's pattern.
    let mut seen = vec![vec![0u8; threads]; threads];
    for sharers in designed(&out).values() {
        for &a in sharers {
            for &b in sharers {
                if a != b {
                    seen[a][b] = 1;
                }
            }
        }
    }
    assert_eq!(seen, Summary::new(&out).pattern, "{what}");
}

#[test]
fn every_kernel_keeps_to_the_layout_with_pairs() {
    for kernel in Kernel::ALL {
        check(kernel, 4, 2);
    }
}

#[test]
fn shared_pages_are_shared_by_their_pair_only() {
    for kernel in Kernel::ALL {
        check_shared(kernel, 8, 2, 5);
    }
    // The truth counts them: a ring's neighbours share 1 + 5 pages.
    let s = Summary::new(&traced(Kernel::Mg, 4, 1, 5));
    assert_eq!(s.pair_pages[0][1], 6, "{:?}", s.pair_pages);
}

#[test]
fn every_kernel_keeps_to_the_layout_with_four_ranks() {
    for kernel in Kernel::ALL {
        check(kernel, 8, 2);
    }
}

#[test]
fn four_rank_ring_and_sparse_patterns_are_not_all_to_all() {
    let out = traced(Kernel::Mg, 8, 2, 0);
    let s = Summary::new(&out);
    assert!(!s.pair_pages_all_to_all);
    assert_eq!(
        s.pair_pages[0][2], 0,
        "ranks 0 and 2 are not ring neighbours"
    );
    assert_eq!(s.pattern[0][2], 1, "but share the barrier page");
    assert_eq!(s.pattern[0][4], 0);
    let cg = Summary::new(&traced(Kernel::Cg, 8, 2, 0));
    assert!(
        !cg.pair_pages_all_to_all,
        "at most 4 of 6 pairs with 4 ranks"
    );
    assert!(cg.pair_pages[0..4]
        .iter()
        .all(|row| row.iter().any(|&n| n > 0)));
    let is = Summary::new(&traced(Kernel::Is, 8, 2, 0));
    assert!(is.pair_pages_all_to_all);
}
