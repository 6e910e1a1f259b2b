//! The probe's tests: calibration, flush and reload on our own memory, and the ignored
//! re-measurement reports.

use super::*;
use std::collections::{BTreeMap, BTreeSet};

fn probe_supported() -> bool {
    let f = crate::cache::features();
    if !cfg!(target_arch = "x86_64") || !f.clflush || !f.rdtscp {
        preheat_testsupport::skip!("x86-64", "need x86_64 with clflush and rdtscp, have {f:?}");
        return false;
    }
    true
}

#[test]
fn reload_probes_every_line_once() {
    let _shared = crate::test_lock::shared();
    let buf = vec![1u8; 5 * 4096 + 100];
    let base = buf.as_ptr() as u64;
    let ranges = [
        Range {
            start: base + 10,
            len: 3 * 4096,
        },
        Range {
            start: base + 4 * 4096,
            len: 0,
        },
    ];
    let mut hits = Vec::new();
    // Threshold u32::MAX: every probed line is a "hit", so `hits` lists the probed lines.
    // SAFETY: the ranges lie inside `buf`, a live heap allocation of this test (mapped,
    // readable), dropped only at its end.
    let n = unsafe { reload(&ranges, u32::MAX, 1, 42, &mut hits) }.unwrap();
    let expect: Vec<u64> = (((base + 10) & !63)..base + 10 + 3 * 4096)
        .step_by(64)
        .collect();
    assert_eq!(n as usize, expect.len());
    let mut got = hits.clone();
    got.sort_unstable();
    assert_eq!(got, expect);
    assert_ne!(hits, expect, "order must be permuted");
    // Threshold 0: nothing is a hit.
    hits.clear();
    // SAFETY: as above.
    assert_eq!(unsafe { reload(&ranges, 0, 16, 1, &mut hits) }, Ok(n));
    assert!(hits.is_empty());
    // SAFETY: as above.
    unsafe { flush(&ranges) }.unwrap();
}

/// A pass over memory that is gone ends at the first line there with `Err(Faulted)` (where
/// a handler resumes the guarded routines' faults, as the agent's does), with the lines
/// before it done.
#[test]
fn a_pass_over_unmapped_memory_ends_faulted() {
    let _shared = crate::test_lock::shared();
    if !crate::guard::SUPPORTED {
        return;
    }
    const PAGE: usize = 4096;
    // SAFETY: an anonymous mapping owned by this test; its third page is unmapped at once,
    // the rest at the end.
    let base = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            4 * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        std::ptr::write_bytes(p as *mut u8, 1, 4 * PAGE);
        assert_eq!(
            libc::munmap((p as usize + 2 * PAGE) as *mut libc::c_void, PAGE),
            0
        );
        p as u64
    };
    let ranges = [Range {
        start: base,
        len: 4 * PAGE as u64,
    }];
    let mut hits = Vec::new();
    crate::guard::tests::with_resume_handler(|| {
        // SAFETY: the handler resumes the faults on the unmapped page; the other pages are
        // mapped until the end of the test.
        unsafe {
            assert_eq!(flush(&ranges), Err(Faulted));
            assert_eq!(
                prepare_phase(
                    &ranges,
                    Phase {
                        stride: 2,
                        phase: 1
                    }
                ),
                Err(Faulted)
            );
            // One-page windows in address order, every line a "hit": the first two pages
            // are probed, the third ends the pass.
            assert_eq!(reload(&ranges, u32::MAX, 1, 3, &mut hits), Err(Faulted));
        }
    });
    assert_eq!(hits.len(), 2 * PAGE / LINE);
    assert!(hits.iter().all(|&a| a < base + 2 * PAGE as u64));
    // SAFETY: unmaps what is left of this test's mapping.
    unsafe { libc::munmap(base as *mut libc::c_void, 4 * PAGE) };
}

/// The probe order is a function of the seed, and over seeds every line of a window is
/// equally likely to come first (what the hand-written xorshift's range-and-spread test
/// checked of the generator, checked here of the order itself).
#[test]
fn probe_order_is_seeded_and_spread() {
    let _shared = crate::test_lock::shared();
    let buf = vec![1u8; 2 * 4096];
    let base = (buf.as_ptr() as u64 + 4095) & !4095;
    let ranges = [Range {
        start: base,
        len: 4096,
    }];
    let order = |seed: u64| {
        let mut hits = Vec::new();
        // SAFETY: one page inside `buf`, a live heap allocation of this test.
        unsafe { reload(&ranges, u32::MAX, 1, seed, &mut hits) }.unwrap();
        hits
    };
    assert_eq!(order(5), order(5));
    assert_ne!(order(5), order(6));
    let mut first = [0u32; 64];
    for seed in 0..6400 {
        first[((order(seed)[0] - base) / 64) as usize] += 1;
    }
    assert!(first.iter().all(|&c| c > 40), "{first:?}");
}

/// Validate the probe on this machine: flush a 128 KiB buffer, touch a known random 10% of
/// its lines (demand loads, fresh random order each pass), reload with a fresh seed, and vote
/// over many passes (the paper's k-of-n filter). Each of the layouts a recording chooses among
/// is measured, and the one its pilot would pick is judged. Probing every line in 16-page
/// windows (the layout before recordings chose one) read 56% of the untouched lines as hits
/// per pass in one run on the Xeon `none` host and kept 426 lines for 204 touched (precision
/// 0.62); the strided layouts there read 0.5–17% (5 runs, precision 1.00).
///
/// Two measured facts shape the method (see the module docs):
/// * single passes are noisy: 15–50% of untouched lines read as hits in a pass (lines the
///   adjacent-line prefetcher pulled in after an earlier probe of a neighbour), so 4-of-8 is
///   not enough; we take 128 passes and keep lines seen in ≥ 88 (~70%) — more samples and a
///   stricter vote. The thread is pinned (after a migration the touched lines sit in the
///   other core's caches), runs SCHED_FIFO when permitted, and a pass during which it was
///   switched out or other tasks evicted canary lines is discarded;
/// * a demand miss on a touched line X also brings X±1 into the cache (next line ~99% for an
///   isolated miss; 20–45% of neighbours of our touched lines are cached before any probe),
///   and probing a touched line leaks its neighbour again. Those lines really are in the
///   cache, and no cache-content reader (nor the paper's tag dump with prefetchers on) can
///   tell them apart. So precision is checked against the touched lines plus their
///   immediate neighbours; precision against the touched lines alone is printed.
#[test]
fn probe_finds_touched_lines() {
    let _exclusive = crate::test_lock::exclusive();
    if !probe_supported() {
        return;
    }
    // Stay on one CPU: after a migration the touched lines sit in the other core's caches.
    std::thread::spawn(probe_finds_touched_lines_pinned)
        .join()
        .unwrap();
}

/// Voluntary + involuntary context switches of the calling thread so far.
fn context_switches() -> i64 {
    // SAFETY: an all-zero `rusage` is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    ru.ru_nvcsw + ru.ru_nivcsw
}

/// What [`quiet_passes`] gathered: per line, in how many undisturbed passes it read as cached;
/// per pass, hits among the touched lines and among the others; passes thrown away and why.
struct Passes {
    counts: BTreeMap<u64, u32>,
    single_tp: usize,
    single_fp: usize,
    rejected_switch: u64,
    rejected_evicted: u64,
}

/// Per pass, for each phase of the layout (`stride` phases, lines probed in random order within
/// windows of `window_pages` pages): prepare the phase, touch `canaries` and `order` (shuffled
/// each time), reload the phase; `passes` passes among up to 4 × `passes` attempts. Quiet gate: a pass during which this thread was switched
/// out, or during which something else evicted our lines (the canaries, touched with the set,
/// must still be cached after the reload: other vCPUs and tenants share caches with us, and an
/// eviction would count as a probe miss), is discarded. `Err` says why there were too few.
#[allow(clippy::too_many_arguments)]
fn quiet_passes(
    range: &[Range],
    (stride, window_pages): (u32, u32),
    order: &mut [u64],
    touched: &BTreeSet<u64>,
    canaries: &[usize],
    threshold: u32,
    passes: u64,
    rng: &mut SmallRng,
) -> Result<Passes, String> {
    let lines = range[0].len / LINE as u64;
    let mut p = Passes {
        counts: BTreeMap::new(),
        single_tp: 0,
        single_fp: 0,
        rejected_switch: 0,
        rejected_evicted: 0,
    };
    let mut hits = Vec::new();
    let (mut pass, mut attempt) = (0u64, 0u64);
    while pass < passes {
        if attempt == 4 * passes {
            return Err(format!(
                "only {pass} of {passes} passes were undisturbed ({} context switches, {} \
                 evictions): machine too busy",
                p.rejected_switch, p.rejected_evicted
            ));
        }
        attempt += 1;
        let before = context_switches();
        hits.clear();
        let (mut n, mut canaries_cached) = (0, canaries.len());
        // One pass: every phase of the layout, each after its own touch (as a recording takes
        // a sample: one request per phase).
        for ph in 0..stride {
            let phase = Phase { stride, phase: ph };
            order.shuffle(rng);
            // SAFETY: the caller's `range` and `order` lie inside its live buffer,
            // `canaries` inside another live buffer of the caller, both kept until after
            // this returns.
            let (probed, cached) = unsafe {
                prepare_phase(range, phase).unwrap();
                let mut s = 0u8;
                for &a in canaries {
                    s = s.wrapping_add(load_byte(a));
                }
                for &a in order.iter() {
                    s = s.wrapping_add(load_byte(a as usize));
                }
                std::hint::black_box(s);
                let probed = reload_phase(
                    range,
                    threshold,
                    window_pages,
                    attempt * 8 + ph as u64,
                    phase,
                    &mut hits,
                )
                .unwrap();
                let cached = canaries
                    .iter()
                    .filter(|&&a| time_load(a) < threshold)
                    .count();
                (probed, cached)
            };
            n += probed;
            canaries_cached = canaries_cached.min(cached);
        }
        assert_eq!(n, lines);
        if context_switches() != before {
            p.rejected_switch += 1;
            continue;
        }
        if canaries_cached < canaries.len() * 15 / 16 {
            p.rejected_evicted += 1;
            continue;
        }
        pass += 1;
        let tp = hits.iter().filter(|a| touched.contains(a)).count();
        p.single_tp += tp;
        p.single_fp += hits.len() - tp;
        for &a in &hits {
            *p.counts.entry(a).or_default() += 1;
        }
    }
    Ok(p)
}

/// A random tenth of the `lines` lines from `base`, and the lines next to them (inside the
/// range): touched, adjacent.
fn touched_lines(base: u64, lines: u64, rng: &mut SmallRng) -> (BTreeSet<u64>, BTreeSet<u64>) {
    let mut touched = BTreeSet::new();
    while touched.len() < lines as usize / 10 {
        touched.insert(base + rng.gen_range(0..lines) * 64);
    }
    let adjacent = touched
        .iter()
        .flat_map(|&a| [a - 64, a + 64])
        .filter(|a| (base..base + lines * 64).contains(a))
        .collect();
    (touched, adjacent)
}

/// Print what `p`'s passes found and return (share of untouched lines read as hits in a
/// single pass, recall and precision vs touched ∪ adjacent of the lines seen in ≥ `keep`).
fn judge_passes(
    p: &Passes,
    touched: &BTreeSet<u64>,
    adjacent: &BTreeSet<u64>,
    lines: u64,
    passes: u64,
    keep: u32,
) -> (f64, f64, f64) {
    println!(
        "passes discarded: {} after a context switch, {} after an eviction",
        p.rejected_switch, p.rejected_evicted
    );
    let untouched = lines as usize - touched.len();
    let fp_share = p.single_fp as f64 / (passes as usize * untouched) as f64;
    println!(
        "single pass: recall {:.3}, untouched lines read as hits {fp_share:.3}",
        p.single_tp as f64 / (passes as usize * touched.len()) as f64,
    );
    let kept = |k: u32| -> BTreeSet<u64> {
        p.counts
            .iter()
            .filter(|(_, &c)| c >= k)
            .map(|(&a, _)| a)
            .collect()
    };
    // (recall, precision vs touched, precision vs touched ∪ adjacent) of the lines kept.
    let judge = |kk: &BTreeSet<u64>| {
        let tp = kk.intersection(touched).count() as f64;
        let explained = kk
            .iter()
            .filter(|a| touched.contains(a) || adjacent.contains(a))
            .count() as f64;
        let n = kk.len().max(1) as f64;
        (tp / touched.len() as f64, tp / n, explained / n)
    };
    let passes = passes as u32;
    for k in [passes / 2, keep, passes * 3 / 4, passes * 7 / 8] {
        let kk = kept(k);
        let (recall, vs_touched, vs_adjacent) = judge(&kk);
        println!(
            "kept ≥ {k}/{passes}: {} lines, recall {recall:.3}, precision vs touched \
             {vs_touched:.3}, vs touched ∪ adjacent {vs_adjacent:.3}",
            kk.len(),
        );
    }
    let (recall, _, precision) = judge(&kept(keep));
    (fp_share, recall, precision)
}

fn probe_finds_touched_lines_pinned() {
    crate::os::pin_current_thread(crate::os::current_cpu() as usize).unwrap();
    // Best effort: as SCHED_FIFO no normal task preempts us mid-pass (this thread ends with
    // the test; RT throttling bounds it anyway). Without the privilege the quiet gate
    // still discards disturbed passes.
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: valid sched_param; pid 0 = this (short-lived) test thread.
    let rt = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } == 0;
    println!("SCHED_FIFO: {rt}");
    let cal = calibrate_stats(2000);
    println!("calibration: {cal:?}");
    // Evictions by other vCPUs or tenants the canaries do not catch can cost a run a fifth of
    // its recall (seen once in a suite run: 0.72 with the other layout at 1.00); a broken
    // probe fails every run, so the judgement is repeated up to three times.
    let mut last = (0.0, 0.0);
    for attempt in 1..=3 {
        let Some((recall, precision)) = judge_pilots_choice(cal.threshold) else {
            return;
        };
        println!("attempt {attempt}: recall {recall:.3}, precision {precision:.3}");
        if recall >= 0.9 && precision >= 0.9 {
            return;
        }
        last = (recall, precision);
    }
    let (recall, precision) = last;
    assert!(recall >= 0.9, "recall {recall} (three attempts)");
    assert!(
        precision >= 0.9,
        "precision (vs touched ∪ adjacent) {precision} (three attempts)"
    );
}

/// One run: both layouts measured over fresh touched lines, the one a recording's pilot would
/// pick judged; its recall and precision (vs touched ∪ adjacent), or `None` where the machine
/// gave no quiet passes (skipped, and said so).
fn judge_pilots_choice(threshold: u32) -> Option<(f64, f64)> {
    // 128 KiB: one pass takes ~1 ms; with 256 KiB, evictions by other vCPUs/tenants during
    // the longer pass cost up to 20% of the touched lines on a busy machine.
    const BYTES: usize = 128 * 1024;
    const PASSES: u64 = 128;
    const KEEP: u32 = 88;
    let buf = vec![3u8; BYTES + 4096];
    let base = (buf.as_ptr() as u64 + 4095) & !4095;
    let lines = (BYTES / LINE) as u64;
    let mut rng = SmallRng::seed_from_u64(7);
    let (touched, adjacent) = touched_lines(base, lines, &mut rng);
    let mut order: Vec<u64> = touched.iter().copied().collect();
    let range = [Range {
        start: base,
        len: BYTES as u64,
    }];
    // 64 canary lines in another buffer (see quiet_passes). If the machine is too busy to
    // give us PASSES quiet passes, skip rather than judge the probe on disturbed samples.
    let canary_buf = vec![5u8; 64 * 1024 + 4096];
    let canary_base = (canary_buf.as_ptr() as usize + 4095) & !4095;
    let canaries: Vec<usize> = (0..64)
        .map(|i| canary_base + i * 1024 + 64 * (i % 7))
        .collect();
    // The layouts a recording chooses among (`preheat_estimate::layout::CANDIDATES`), each
    // measured; the one a recording's pilot would pick (the lowest share of untouched lines
    // read as hits, the cheaper on a tie within 1.5× + 0.5 points) must find the lines.
    let mut results = Vec::new();
    for layout in [(2u32, 16u32), (4, 64)] {
        let p = match quiet_passes(
            &range, layout, &mut order, &touched, &canaries, threshold, PASSES, &mut rng,
        ) {
            Ok(p) => p,
            Err(why) => {
                preheat_testsupport::skip!("quiet-machine", "{why}");
                return None;
            }
        };
        results.push((
            layout,
            judge_passes(&p, &touched, &adjacent, lines, PASSES, KEEP),
        ));
    }
    let lowest = results.iter().map(|r| r.1 .0).fold(f64::MAX, f64::min);
    let &(layout, (_, recall, precision)) = results
        .iter()
        .find(|r| r.1 .0 <= lowest * 1.5 + 0.005)
        .unwrap();
    println!(
        "the pilot's choice: stride {} over {} pages",
        layout.0, layout.1
    );
    Some((recall, precision))
}

/// Strided probing vs the plain probe on a synthetic access set: precision against the
/// touched lines alone. `cargo test --release -p preheat-engine --lib probe::tests::strided_report -- --ignored --nocapture`
#[test]
#[ignore]
fn strided_report() {
    if !probe_supported() {
        return;
    }
    crate::os::pin_current_thread(crate::os::current_cpu() as usize).unwrap();
    let cal = calibrate(2000);
    const BYTES: usize = 512 * 1024;
    let buf = vec![3u8; BYTES + 4096];
    let base = (buf.as_ptr() as u64 + 4095) & !4095;
    let lines = (BYTES / LINE) as u64;
    let mut rng = SmallRng::seed_from_u64(11);
    // Touched set shaped like code: short runs (mean ~3 lines).
    let mut touched = BTreeSet::new();
    while touched.len() < lines as usize / 12 {
        let s = rng.gen_range(0..lines - 8);
        let len = 1 + rng.gen_range(0..5);
        for i in 0..len {
            touched.insert(base + (s + i) * 64);
        }
    }
    let range = [Range {
        start: base,
        len: BYTES as u64,
    }];
    for (stride, samples, keep) in [
        (1u32, 8u32, 4u32),
        (2, 8, 4),
        (2, 8, 5),
        (2, 8, 6),
        (2, 12, 8),
        (2, 16, 10),
        (1, 16, 10),
    ] {
        let mut counts: BTreeMap<u64, u32> = BTreeMap::new();
        for s in 0..samples {
            for ph in 0..stride {
                let phase = Phase { stride, phase: ph };
                let mut order: Vec<u64> = touched.iter().copied().collect();
                order.shuffle(&mut rng);
                let mut hits = Vec::new();
                // SAFETY: `range` and `order` lie inside `buf`, a live heap allocation of
                // this function, dropped only at its end.
                unsafe {
                    prepare_phase(&range, phase).unwrap();
                    for &a in &order {
                        std::hint::black_box(load_byte(a as usize));
                    }
                    reload_phase(
                        &range,
                        cal.threshold,
                        16,
                        (s * 31 + ph) as u64,
                        phase,
                        &mut hits,
                    )
                    .unwrap();
                }
                for h in hits {
                    *counts.entry(h).or_default() += 1;
                }
            }
        }
        let kept: BTreeSet<u64> = counts
            .iter()
            .filter(|(_, c)| **c >= keep)
            .map(|(a, _)| *a)
            .collect();
        let tp = kept.intersection(&touched).count() as f64;
        println!(
            "stride {stride} samples {samples} keep {keep}: kept {} touched {} precision {:.3} recall {:.3}",
            kept.len(),
            touched.len(),
            tp / kept.len().max(1) as f64,
            tp / touched.len() as f64
        );
    }
}

/// Measurements behind the module docs; run with
/// `cargo test -p preheat-engine --lib probe::report -- --ignored --nocapture`.
#[cfg(test)]
mod report {
    use super::*;

    fn spin_ns(ns: u64) {
        let end = crate::time::now_ns() + ns;
        while crate::time::now_ns() < end {
            std::hint::spin_loop();
        }
    }

    /// What a pass costs per line and what the timed load reads, pinned to one CPU: the
    /// calibration's hit and miss ticks, and ns per line of `prepare_phase` and
    /// `reload_phase` (stride 2) over a 512 KiB buffer, 200 passes each, p10/p50/p90 over
    /// passes (the guarded routines of [`crate::guard`] against the inline sequence they
    /// replaced: run on both).
    #[test]
    #[ignore]
    fn pass_cost() {
        let _shared = crate::test_lock::shared();
        std::thread::spawn(|| {
            crate::os::pin_current_thread(crate::os::current_cpu() as usize).unwrap();
            for _ in 0..3 {
                println!("{:?}", calibrate_stats(2000));
            }
            const BYTES: usize = 512 * 1024;
            const PASSES: usize = 200;
            let buf = vec![3u8; BYTES + 4096];
            let base = (buf.as_ptr() as u64 + 4095) & !4095;
            let range = [Range {
                start: base,
                len: BYTES as u64,
            }];
            let lines = (BYTES / LINE / 2) as f64;
            let (mut prep, mut rel) = (Vec::new(), Vec::new());
            let mut hits = Vec::with_capacity(BYTES / LINE);
            for p in 0..PASSES {
                let phase = Phase {
                    stride: 2,
                    phase: (p % 2) as u32,
                };
                hits.clear();
                let t0 = crate::time::now_ns();
                // SAFETY: `range` lies inside `buf`, live until the end of the closure.
                unsafe { prepare_phase(&range, phase) }.unwrap();
                let t1 = crate::time::now_ns();
                // SAFETY: as above.
                unsafe { reload_phase(&range, 250, 16, p as u64, phase, &mut hits) }.unwrap();
                let t2 = crate::time::now_ns();
                prep.push((t1 - t0) as f64 / lines);
                rel.push((t2 - t1) as f64 / lines);
            }
            for (name, v) in [("prepare", &mut prep), ("reload", &mut rel)] {
                v.sort_by(f64::total_cmp);
                println!(
                    "{name}_phase ns per probed line over {PASSES} passes of {BYTES} B: \
                     p10 {:.1} p50 {:.1} p90 {:.1}",
                    v[PASSES / 10],
                    v[PASSES / 2],
                    v[PASSES * 9 / 10]
                );
            }
        })
        .join()
        .unwrap();
    }

    /// Per-pass false-hit rate of `reload` on a flushed, untouched 256 KiB buffer, by window
    /// size, and what one access to a line of a cold page brings in besides that line.
    #[test]
    #[ignore]
    fn probe_noise() {
        let _shared = crate::test_lock::shared();
        std::thread::spawn(|| {
            crate::os::pin_current_thread(crate::os::current_cpu() as usize).unwrap();
            let cal = calibrate_stats(2000);
            println!("{cal:?}");
            const BYTES: usize = 256 * 1024;
            let buf = vec![3u8; BYTES + 4096];
            let base = (buf.as_ptr() as u64 + 4095) & !4095;
            let lines = (BYTES / LINE) as u64;
            let range = [Range {
                start: base,
                len: BYTES as u64,
            }];
            let mut hits = Vec::new();
            for wp in [1u32, 4, 8, 12, 16, 32, 64] {
                let mut n = 0;
                for seed in 0..8 {
                    hits.clear();
                    // SAFETY: `range` lies inside `buf`, live until the end of the closure.
                    unsafe {
                        flush(&range).unwrap();
                        reload(&range, cal.threshold, wp, seed, &mut hits).unwrap();
                    }
                    n += hits.len();
                }
                println!(
                    "window {wp:2} pages: untouched lines read as hits per pass {:.3}",
                    n as f64 / (8 * lines) as f64
                );
            }
            let mut rng = SmallRng::seed_from_u64(3);
            let (mut load_next, mut load_prev, mut pf_next, mut trials) = (0, 0, 0, 0);
            for _ in 0..1000 {
                let page = (base + rng.gen_range(0..lines / 64) * 4096) as usize;
                let x = page + 64 * (8 + rng.gen_range(0..48usize));
                // SAFETY: `page` is one of the whole pages of `buf` (live until the end of
                // the closure), and `x - 64 .. x + 64` lies inside it.
                unsafe {
                    flush_range(VirtAddr(page as u64), 4096);
                    std::hint::black_box(load_byte(x));
                    spin_ns(2000);
                    load_next += (time_load(x + 64) < cal.threshold) as u32;
                    load_prev += (time_load(x - 64) < cal.threshold) as u32;
                    flush_range(VirtAddr(page as u64), 4096);
                    crate::cache::prefetch_line(VirtAddr(x as u64));
                    spin_ns(2000);
                    pf_next += (time_load(x + 64) < cal.threshold) as u32;
                }
                trials += 1;
            }
            let f = |c: u32| c as f64 / trials as f64;
            println!(
                "one demand miss at X in a cold page also caches X+1 {:.2}, X-1 {:.2}; \
             prefetcht0 X caches X+1 {:.2}",
                f(load_next),
                f(load_prev),
                f(pf_next)
            );
        })
        .join()
        .unwrap();
    }

    /// Reload on CPU 1 of lines touched on CPU 0 (the probe thread is not the one that ran the
    /// request).
    #[test]
    #[ignore]
    fn cross_core_reload() {
        let _shared = crate::test_lock::shared();
        if crate::os::online_cpus() < 2 {
            return;
        }
        let buf = vec![1u8; 1 << 20];
        let base = buf.as_ptr() as usize & !63;
        let mut rng = SmallRng::seed_from_u64(5);
        // Lines of `buf` (the first may start up to 63 bytes before it, in the same page).
        let lines: Vec<usize> = (0..2000)
            .map(|_| base + 64 * rng.gen_range(0..16000usize))
            .collect();
        let cal = std::thread::spawn(|| {
            crate::os::pin_current_thread(1).unwrap();
            calibrate_stats(1000)
        })
        .join()
        .unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                crate::os::pin_current_thread(0).unwrap();
                // SAFETY: every address is a line of `buf`, which outlives both scopes.
                unsafe {
                    for &a in &lines {
                        flush_line(VirtAddr(a as u64));
                    }
                    fence();
                    for &a in &lines {
                        std::hint::black_box(load_byte(a));
                    }
                }
            });
        });
        std::thread::scope(|s| {
            s.spawn(|| {
                crate::os::pin_current_thread(1).unwrap();
                // SAFETY: as above, lines of the live `buf`.
                let mut v: Vec<u32> = lines.iter().map(|&a| unsafe { time_load(a) }).collect();
                v.sort_unstable();
                println!(
                    "{cal:?}\ncross-core reload: p10 {} p50 {} p90 {}; below threshold {:.2}",
                    v[200],
                    v[1000],
                    v[1800],
                    v.iter().filter(|&&t| t < cal.threshold).count() as f64 / 2000.0
                );
            });
        });
    }
}
