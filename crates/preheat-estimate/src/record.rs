//! The working-set estimation phase (paper §3.1): sample the lines a request touches several
//! times, keep the stable ones (k of n), sort and run-length encode them.
//!
//! Backends:
//! * `probe` — flush+reload through the agent inside the server: for each ≤ 1 MiB chunk of the
//!   server's resident memory, flush the chunk, send one request, wait for the server to go idle,
//!   time a reload of every line. Our user-space stand-in for the paper's L2 tag dump; chunking
//!   because the probe itself evicts what it measures in larger passes. Optionally subtracts
//!   "noise" samples taken with no request (the agent's own control thread touches libc lines).
//! * `trace` — exact user-space lines of each busy period from our Valgrind tool (ground truth;
//!   this and `step` are in [`crate::exact`]).
//! * `step` — exact native code lines by single-stepping the serving thread (ptrace); no data.
//! * `hybrid` — step's code lines plus the probe's data lines (see [`crate::hybrid`]).
//! * `pmu` — hardware sampling of data addresses; detected at run time (absent on KVM guests
//!   without a virtual PMU, as on our development machines).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use preheat_model::proto::{ProbeCycle, Range, Reply, Request};
use preheat_model::{filter_k_of_n, remove_noise, Backend, LineSet, RegionTable};

use crate::params::{Enriched, Vote, CHANCE_UNRELIABLE};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::layout::{self, Layout, Trial};
use crate::params::{RecordParams, RecordStats, Recording};
use crate::profile::{make_profile, now_unix};
use preheat_launch::agentctl::AgentClient;
use preheat_launch::launch::Server;
use preheat_launch::progress::Progress;
use preheat_launch::servers::Workload;

/// How often in a row a probe cycle the agent skipped is repeated before the recording fails.
const MAX_CYCLE_REPEATS: u32 = 3;

/// Split ranges into pieces of at most `max` bytes (page aligned).
pub fn chunk_ranges(ranges: &[Range], max: u64) -> Vec<Vec<Range>> {
    let max = max.max(4096) & !4095;
    let mut chunks: Vec<Vec<Range>> = Vec::new();
    let mut cur: Vec<Range> = Vec::new();
    let mut cur_len = 0u64;
    for r in ranges {
        let mut start = r.start;
        let mut left = r.len;
        while left > 0 {
            let take = left.min(max - cur_len);
            cur.push(Range { start, len: take });
            cur_len += take;
            start += take;
            left -= take;
            if cur_len == max {
                chunks.push(std::mem::take(&mut cur));
                cur_len = 0;
            }
        }
    }
    if !cur.is_empty() {
        chunks.push(cur);
    }
    chunks
}

/// Estimate with the flush+reload probe through the agent of `pid`; `client` is a connection
/// that `pid`'s process serves (the one [`crate::serving::serving_agent`] found it with,
/// or [`crate::serving::connect_served_by`]).
///
/// The probe's request goes on the agent's own loopback connection, which the agent keeps only if
/// its process serves it (`ProbeConnect`; a prefork server's other workers may accept it). Where
/// it cannot get one — a worker that serves one connection at a time (Apache prefork, a blocking
/// Python worker) is busy with `client` and takes no second connection; an event-loop sibling
/// wins every accept — `client`'s connection is handed to the agent (`open_probe_conn`). Only
/// where that fails too does the CLI send the request on `client`, inside a request-less probe
/// window (as for workloads without a fixed byte exchange), and say so.
pub fn record_probe(
    server: &Server,
    pid: u32,
    w: &Workload,
    p: &RecordParams,
    client: &mut preheat_launch::servers::Requester,
    progress: &dyn Progress,
) -> Result<Recording> {
    let t0 = Instant::now();
    let mut agent = AgentClient::connect(&server.run_dir, pid)?;
    let mut stats = RecordStats::started("probe", p);
    let threshold = calibrate(&mut agent, &mut stats)?;
    let ranges = candidates(&mut agent, &mut stats)?;
    let chunks = chunk_ranges(&ranges, p.chunk_bytes);
    stats.chunks = chunks.len() as u64;
    let table = RegionTable::build(
        preheat_engine::maps::read_maps(Some(pid)).context("reading the server's mappings")?,
    );
    let exe = preheat_engine::maps::exe_ident(Some(pid))?;
    // Warm the path, settle lazy initialisation.
    crate::serving::warm_up(p, || client.request_ok(), progress)?;
    // Without a fixed byte exchange (MySQL), or where the agent cannot open a connection its
    // process serves (see above), the request is sent by us, from another thread, inside a
    // request-less probe window long enough to hold it (see `external_request`).
    let external = !probe_connect(&mut agent, client, server.spec.port, w, p, &mut stats);
    let external_window_ns = if external {
        external_window_ns(client)?
    } else {
        0
    };
    let (request, until) = raw_exchange(w);
    let mut run = ProbeRun {
        agent,
        client,
        chunks,
        threshold,
        window_pages: layout::DEFAULT.window_pages,
        port: server.spec.port,
        request,
        until,
        external,
        external_window_ns,
        adopted: stats.probe_adopted.is_some(),
        stride: layout::DEFAULT.stride,
        // Each probe cycle scrambles its probe order with its own seed.
        seeds: StdRng::seed_from_u64(now_unix()),
        windows: Vec::new(),
    };
    let chosen = match p.layout {
        Some(l) => l,
        None => run.pilot(&mut stats, progress)?,
    };
    run.stride = chosen.stride.max(1);
    run.window_pages = chosen.window_pages.max(1);
    stats.stride = run.stride;
    stats.window_pages = run.window_pages;
    let (samples, noise) = run.checked_samples(p, chosen, &table, &mut stats, progress)?;
    stats.unreliable = stats.noise_hit_share > layout::UNRELIABLE_SHARE;
    // The model's median (the lower middle of an even sample); 0 without a window.
    let windows_us: Vec<f64> = run.windows.iter().map(|w| *w as f64 / 1e3).collect();
    stats.window_us_p50 = preheat_model::stats::summarize(&windows_us).p50;
    let lines = stable_lines(&samples, &noise, p, &mut stats);
    stats.seconds = t0.elapsed().as_secs_f64();
    Ok(Recording {
        profile: make_profile(
            Backend::Probe,
            p.filter,
            exe,
            &table,
            server.spec.port,
            &lines,
        ),
        stats,
    })
}

/// Calibrations asked for at most, while the threshold does not separate hits from misses.
const MAX_CALIBRATIONS: u32 = 3;

/// Whether a threshold separates the calibration's hits from its misses: it lies in the lower
/// three quarters between their medians. The calibration clamps its threshold to at most the
/// miss median, which it reaches when its hits were timed slow (a disturbed calibration); a
/// recording with such a threshold reads about half the misses as hits. (On the Xeon host two
/// of some forty recordings read 62–64% of untouched lines as hits in every sample; their thresholds
/// were not printed then, so that this was the cause is presumed, not shown.)
fn separates(hit_p50: u32, miss_p50: u32, threshold: u32) -> bool {
    miss_p50 > hit_p50 && threshold <= hit_p50 + (miss_p50 - hit_p50) * 3 / 4
}

/// Ask the agent to calibrate its hit/miss threshold (noted in `stats`), again while it does not
/// [`separates`] hits from misses (at most [`MAX_CALIBRATIONS`] times); returns it, in ticks.
fn calibrate(agent: &mut AgentClient, stats: &mut RecordStats) -> Result<u32> {
    for attempt in 1..=MAX_CALIBRATIONS {
        match agent.call(&Request::Calibrate)? {
            Reply::Calibration {
                hit_ticks_p50,
                miss_ticks_p50,
                threshold,
                ..
            } => {
                stats.hit_ticks_p50 = hit_ticks_p50;
                stats.miss_ticks_p50 = miss_ticks_p50;
                stats.threshold_ticks = threshold;
                stats.calibrations = attempt;
                if separates(hit_ticks_p50, miss_ticks_p50, threshold) {
                    break;
                }
            }
            other => bail!("unexpected reply to calibrate: {other:?}"),
        }
    }
    Ok(stats.threshold_ticks)
}

/// The ranges of the server's memory the agent would probe (their size noted in `stats`).
fn candidates(agent: &mut AgentClient, stats: &mut RecordStats) -> Result<Vec<Range>> {
    match agent.call(&Request::Candidates)? {
        Reply::Candidates {
            ranges,
            total_bytes,
        } => {
            stats.candidate_bytes = total_bytes;
            Ok(ranges)
        }
        other => bail!("unexpected reply to candidates: {other:?}"),
    }
}

/// The workload's fixed byte exchange, as the agent takes it: (request, reply end); empty
/// without one.
fn raw_exchange(w: &Workload) -> (String, String) {
    match &w.raw {
        Some(r) => (
            String::from_utf8_lossy(&r.request).into_owned(),
            String::from_utf8_lossy(&r.until).into_owned(),
        ),
        None => (String::new(), String::new()),
    }
}

/// Whether the agent got a connection to `port` that its process serves, for the probe's
/// requests ([`open_probe_conn`]); if not (or without a fixed byte exchange), the requests are
/// external (noted in `stats`, and said unless quiet).
fn probe_connect(
    agent: &mut AgentClient,
    client: &preheat_launch::servers::Requester,
    port: u16,
    w: &Workload,
    p: &RecordParams,
    stats: &mut RecordStats,
) -> bool {
    if w.raw.is_none() {
        stats.external = true;
        stats.external_reason = Some("the workload has no fixed byte exchange".into());
        return false;
    }
    let (request, until) = raw_exchange(w);
    match open_probe_conn(agent, client, port, &request, &until) {
        Ok(adopted) => {
            stats.probe_adopted = adopted;
            true
        }
        Err(e) => {
            if !p.quiet {
                eprintln!(
                    "preheat: note: the probe's requests go on our own connection, inside \
                     request-less probe windows: {e:#}"
                );
            }
            stats.external = true;
            stats.external_reason = Some(format!("{e:#}"));
            false
        }
    }
}

/// Give the agent its probe connection: one it opens itself and its process serves
/// (`ProbeConnect`; `Ok(None)`), or else `client`'s own connection, which that process serves
/// (that is how the agent was chosen), handed over (`ProbeAdopt`; `Ok(Some(why the agent's
/// own failed))`). A prefork worker's siblings can take every connection the agent opens: the
/// kernel wakes every worker waiting on the listening socket, and which accepts first is the
/// scheduler's choice (measured: under load, one sibling took all 24 of the agent's attempts
/// in 1 of 6 runs of the lighttpd test). The caller leaves `client` alone until
/// `ProbeRelease`.
fn open_probe_conn(
    agent: &mut AgentClient,
    client: &preheat_launch::servers::Requester,
    port: u16,
    request: &str,
    until: &str,
) -> Result<Option<String>> {
    let own = agent.call(&Request::ProbeConnect {
        port,
        request: request.to_string(),
        until: until.to_string(),
    });
    let Err(own) = own else {
        return Ok(None);
    };
    let Some(fd) = client.connection_fd() else {
        return Err(own);
    };
    let adopt = Request::ProbeAdopt {
        port,
        request: request.to_string(),
        until: until.to_string(),
    };
    match agent.call_with_fd(&adopt, fd) {
        Ok(_) => Ok(Some(format!("{own:#}"))),
        Err(e) => Err(anyhow::anyhow!(
            "{own:#}; handing it our connection failed too: {e:#}"
        )),
    }
}

/// The probe window of an external request: 2 ms lead-in plus twice the median of five
/// requests' durations plus 2 ms.
fn external_window_ns(client: &mut preheat_launch::servers::Requester) -> Result<u64> {
    let mut t = Vec::new();
    for _ in 0..5 {
        let a = Instant::now();
        client.request_ok()?;
        t.push(a.elapsed().as_nanos() as u64);
    }
    t.sort_unstable();
    Ok(EXTERNAL_LEAD_NS + 2 * t[t.len() / 2] + 2_000_000)
}

/// The enrichment test's false-discovery rate: the share of the lines it keeps expected to be
/// unrelated to the request (Benjamini–Hochberg over every line the request samples saw).
pub const ENRICHED_FDR: f64 = 0.1;

/// A line seen in at most this many fewer request-less samples than request samples is still
/// noise (see [`preheat_model::remove_noise`]).
const NOISE_SLACK: usize = 2;

/// The k-of-n stable lines of the request samples, less (with `p.subtract_noise`) the lines
/// that come about as often without a request (their count noted in `stats`).
///
/// Measured on the Xeon host (preheat-kv against the exact trace, stride 8 over 64-page
/// windows, 3 recordings each): without the subtraction recall 0.96 and precision 0.43; removing
/// every line seen in ≥ 2 of 8 request-less samples (the rule before) precision 0.76–0.84 but
/// recall 0.84–0.92, and 0.42–0.91 with stride 4: the agent's own calls into libc share lines
/// with the server's request path.
fn stable_lines(
    samples: &[LineSet],
    noise: &[LineSet],
    p: &RecordParams,
    stats: &mut RecordStats,
) -> LineSet {
    let mut lines = filter_k_of_n(samples, p.filter.k as usize);
    if p.subtract_noise {
        stats.noise_k = layout::noise_k(noise.len() as u32, stats.noise_hit_share, p.noise_k);
        let before = lines.len();
        lines = remove_noise(&lines, samples, noise, stats.noise_k as usize, NOISE_SLACK);
        stats.noise_lines_removed = (before - lines.len()) as u64;
    }
    stats.kept_lines = lines.len() as u64;
    stats.chance_kept = (!noise.is_empty()).then(|| {
        let noise_k = p.subtract_noise.then_some(stats.noise_k as usize);
        preheat_model::chance_kept(samples, noise, p.filter.k as usize, noise_k, NOISE_SLACK)
    });
    let enrich = match p.vote {
        Vote::Default => false,
        Vote::Enriched => !noise.is_empty(),
        Vote::Auto => {
            p.subtract_noise && stats.chance_share().is_some_and(|x| x > CHANCE_UNRELIABLE)
        }
    };
    if enrich {
        let tested = enriched_lines(samples, noise, p, stats);
        // `auto` keeps the vote's lines where the test finds none: it had too few samples to
        // tell any line apart (said in the report), and an empty working set helps nobody.
        if !tested.is_empty() || p.vote == Vote::Enriched {
            lines = tested;
            if let Some(e) = stats.enriched.as_mut() {
                e.used = true;
            }
        }
    }
    lines
}

/// The lines the enrichment test keeps ([`preheat_model::keep_enriched`]), at the level that
/// expects at most a share [`ENRICHED_FDR`] of them to be unrelated to the request, tested
/// against every line the request samples saw (noted in `stats`).
fn enriched_lines(
    samples: &[LineSet],
    noise: &[LineSet],
    p: &RecordParams,
    stats: &mut RecordStats,
) -> LineSet {
    let seen = filter_k_of_n(samples, 1);
    let k = p.filter.k as usize;
    let tested = preheat_model::enrichment_ps(&filter_k_of_n(samples, k), samples, noise, k);
    let ps: Vec<f64> = tested.iter().map(|&(_, p)| p).collect();
    let alpha = preheat_model::fdr_level(&ps, seen.len(), ENRICHED_FDR);
    let lines = preheat_model::enriched_at(&tested, alpha);
    stats.enriched = Some(Enriched {
        candidates: seen.len() as u64,
        alpha,
        fdr: ENRICHED_FDR,
        kept: lines.len() as u64,
        used: false,
    });
    lines
}

/// The share of `probed` lines a sample read as hits.
fn hit_share(hits: &[u64], probed: u64) -> f64 {
    hits.len() as f64 / probed.max(1) as f64
}

/// The probe cycles of one recording: what each asks the agent for, and the probe windows
/// of the request passes so far.
struct ProbeRun<'a> {
    agent: AgentClient,
    client: &'a mut preheat_launch::servers::Requester,
    chunks: Vec<Vec<Range>>,
    threshold: u32,
    window_pages: u32,
    port: u16,
    request: String,
    until: String,
    external: bool,
    external_window_ns: u64,
    /// The probe's connection is `client`'s, handed to the agent.
    adopted: bool,
    stride: u32,
    seeds: StdRng,
    windows: Vec<u64>,
}

/// The agent gives back a connection of ours it was handed (`ProbeAdopt`) when the recording
/// ends, whichever way: our requests go on it again.
impl Drop for ProbeRun<'_> {
    fn drop(&mut self) {
        if self.adopted {
            let _ = self.agent.call(&Request::ProbeRelease);
        }
    }
}

impl ProbeRun<'_> {
    /// The pilot of [`layout`]: [`layout::PILOT_SAMPLES`] request-less samples of the first
    /// [`layout::PILOT_CHUNKS`] chunks with every candidate layout (noted in `stats`); returns
    /// the one [`layout::pick`] takes.
    fn pilot(&mut self, stats: &mut RecordStats, pb: &dyn Progress) -> Result<Layout> {
        let all = std::mem::take(&mut self.chunks);
        let step = all.len().div_ceil(layout::PILOT_CHUNKS).max(1);
        self.chunks = all.iter().step_by(step).cloned().collect();
        let cycles: u32 = layout::CANDIDATES.iter().map(|l| l.stride).sum();
        pb.start(
            (layout::PILOT_SAMPLES * cycles) as u64 * self.chunks.len() as u64,
            "probe layout",
        );
        let trials = self.trials(stats, pb);
        pb.finish();
        self.chunks = all;
        let trials = trials?;
        let chosen = layout::pick(&trials);
        stats.layout_trials = trials;
        Ok(chosen)
    }

    /// One [`Trial`] per candidate layout, [`layout::PILOT_SAMPLES`] request-less samples of
    /// the current chunks each.
    fn trials(&mut self, stats: &mut RecordStats, pb: &dyn Progress) -> Result<Vec<Trial>> {
        let mut trials = Vec::new();
        for l in layout::CANDIDATES {
            self.stride = l.stride;
            self.window_pages = l.window_pages;
            let mut shares = Vec::new();
            for s in 0..layout::PILOT_SAMPLES {
                let (hits, probed) = self.sample(s, false, stats, pb)?;
                shares.push(hit_share(&hits, probed));
            }
            trials.push(Trial {
                layout: l,
                hit_share: shares.iter().copied().fold(f64::NAN, f64::max),
                samples: layout::PILOT_SAMPLES,
            });
        }
        Ok(trials)
    }

    /// The recording's samples ([`ProbeRun::samples`]), taken again where they read too many
    /// untouched lines as hits: with the next wider layout where the pilot chose `chosen`, then
    /// once after a new calibration (see [`layout`]).
    fn checked_samples(
        &mut self,
        p: &RecordParams,
        chosen: Layout,
        table: &RegionTable,
        stats: &mut RecordStats,
        progress: &dyn Progress,
    ) -> Result<(Vec<LineSet>, Vec<LineSet>)> {
        let (mut samples, mut noise) = self.samples(p, table, stats, progress)?;
        // A layout the pilot chose that reads too many false hits in the recording itself: take
        // the samples again with the next wider one (see `layout`).
        if let Some(next) = layout::retry(chosen, p.layout.is_none(), stats.noise_hit_share) {
            stats.layout_retried = Some(layout::Retried {
                layout: chosen,
                hit_share: stats.noise_hit_share,
            });
            self.stride = next.stride;
            self.window_pages = next.window_pages;
            stats.stride = next.stride;
            stats.window_pages = next.window_pages;
            stats.restart_samples();
            (samples, noise) = self.samples(p, table, stats, progress)?;
        }
        // The pilot's layout (or the wider one after it) still reads most untouched lines as hits:
        // not the layout but a threshold or a host disturbed meanwhile (the Xeon host once read 89%
        // with both layouts). Calibrate anew and take the samples once more.
        if p.layout.is_none() && stats.noise_hit_share > layout::UNRELIABLE_SHARE {
            stats.retaken = Some(stats.noise_hit_share);
            self.threshold = calibrate(&mut self.agent, stats)?;
            stats.restart_samples();
            (samples, noise) = self.samples(p, table, stats, progress)?;
        }
        Ok((samples, noise))
    }

    /// The recording's samples, `p.filter.n` with the request and as many without (with
    /// `p.subtract_noise`), as line sets relative to `table` (counts noted in `stats`).
    fn samples(
        &mut self,
        p: &RecordParams,
        table: &RegionTable,
        stats: &mut RecordStats,
        pb: &dyn Progress,
    ) -> Result<(Vec<LineSet>, Vec<LineSet>)> {
        let rounds = if p.subtract_noise { 2 } else { 1 };
        pb.start(
            p.filter.n as u64 * self.chunks.len() as u64 * rounds * self.stride as u64,
            "probe",
        );
        let (mut samples, mut noise, mut shares) = (Vec::new(), Vec::new(), Vec::new());
        for s in 0..p.filter.n {
            for with_request in [true, false].into_iter().take(rounds as usize) {
                let (hits, probed) = self.sample(s, with_request, stats, pb)?;
                if !with_request {
                    shares.push(hit_share(&hits, probed));
                }
                let (set, unmapped) = table.relative_lines(hits.iter().copied());
                stats.unmapped_hits += unmapped;
                if with_request {
                    stats.lines_per_sample.push(set.len() as u64);
                    samples.push(set);
                } else {
                    stats.lines_per_noise_sample.push(set.len() as u64);
                    noise.push(set);
                }
            }
        }
        pb.finish();
        stats.noise_hit_share = preheat_model::stats::median(&shares).unwrap_or(0.0);
        Ok((samples, noise))
    }

    /// Sample `s`: one probe cycle per chunk and stride phase, with or without the request;
    /// returns the lines hit (absolute addresses) and the lines probed.
    fn sample(
        &mut self,
        s: u32,
        with_request: bool,
        stats: &mut RecordStats,
        pb: &dyn Progress,
    ) -> Result<(Vec<u64>, u64)> {
        let mut hits: Vec<u64> = Vec::new();
        let mut probed_lines = 0u64;
        // Visit chunks in a different order each sample.
        let mut order: Vec<usize> = (0..self.chunks.len()).collect();
        let k = s as usize % order.len().max(1);
        order.rotate_left(k);
        // A noise sample waits as long as a request pass took; an external request gets
        // its fixed window.
        let idle_ns = if self.external {
            self.external_window_ns
        } else {
            let mut sorted = self.windows.clone();
            sorted.sort_unstable();
            sorted.get(sorted.len() / 2).copied().unwrap_or(200_000)
        };
        let stride = self.stride;
        let passes = order
            .iter()
            .flat_map(|ci| (0..stride).map(move |ph| (*ci, ph)));
        for (ci, phase) in passes {
            match self.cycle(ci, phase, with_request, idle_ns, stats)? {
                Reply::Probed {
                    hits: h,
                    window_ns,
                    probed,
                    ..
                } => {
                    hits.extend(h);
                    probed_lines += probed;
                    if with_request {
                        self.windows.push(window_ns);
                        stats.requests_sent += 1;
                    }
                }
                other => bail!("unexpected reply to probe_cycle: {other:?}"),
            }
            pb.inc(1);
        }
        Ok((hits, probed_lines))
    }

    /// One probe cycle of chunk `ci` at stride phase `phase`. A cycle the agent skipped (the
    /// mappings changed under it) is repeated, and one whose probe connection the server closed
    /// (an idle timeout of its keep-alive connections) is repeated on a new one, at most
    /// MAX_CYCLE_REPEATS times in a row; anything else fails the recording.
    fn cycle(
        &mut self,
        ci: usize,
        phase: u32,
        with_request: bool,
        idle_ns: u64,
        stats: &mut RecordStats,
    ) -> Result<Reply> {
        let seed: u64 = self.seeds.gen();
        let cycle = Request::ProbeCycle(ProbeCycle {
            ranges: self.chunks[ci].clone(),
            threshold: self.threshold,
            window_pages: self.window_pages,
            seed,
            port: self.port,
            request: (with_request && !self.external).then(|| self.request.clone()),
            until: self.until.clone(),
            idle_ns,
            stride: self.stride,
            phase,
        });
        let mut attempt = 0;
        loop {
            let r = if self.external && with_request {
                external_request(&mut self.agent, &cycle, self.client)
            } else {
                self.agent.call(&cycle)
            };
            let why = match &r {
                Err(e) if attempt < MAX_CYCLE_REPEATS => format!("{e:#}"),
                _ => return r,
            };
            if why.ends_with(preheat_model::proto::ROUND_SKIPPED) {
                stats.cycles_repeated += 1;
            } else if !self.external && why.ends_with(preheat_model::proto::PROBE_CONN_CLOSED) {
                stats.cycles_repeated += 1;
                stats.probe_reconnects += 1;
                self.adopted = open_probe_conn(
                    &mut self.agent,
                    self.client,
                    self.port,
                    &self.request,
                    &self.until,
                )?
                .is_some();
            } else {
                return r;
            }
            attempt += 1;
        }
    }
}

/// How long after asking the agent for a request-less probe cycle we send an external request:
/// the agent first waits for the server to be idle and flushes one ≤ 1 MiB chunk (~0.1 ms).
const EXTERNAL_LEAD_NS: u64 = 2_000_000;

/// One probe cycle around a request we send ourselves (workloads without a fixed byte
/// exchange, e.g. a MySQL transaction): the agent flushes and then spins for the cycle's
/// `idle_ns` window while this thread, `EXTERNAL_LEAD_NS` after asking, sends the request on its
/// own connection; the agent then waits for the server threads to be idle and reloads. The
/// noise samples of the same recording use the same window without a request, so lines that
/// background threads touch in such a window are subtracted as usual.
fn external_request(
    agent: &mut AgentClient,
    cycle: &Request,
    client: &mut preheat_launch::servers::Requester,
) -> Result<Reply> {
    std::thread::scope(|s| {
        let call = s.spawn(|| agent.call(cycle));
        std::thread::sleep(Duration::from_nanos(EXTERNAL_LEAD_NS));
        let sent = client.request_ok();
        let reply = call
            .join()
            .map_err(|_| anyhow::anyhow!("probe cycle thread panicked"))??;
        sent?;
        Ok(reply)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use preheat_model::RegionLine;

    /// Eight request and eight request-less samples: lines 0..10 are the request's (every
    /// request sample, no request-less one); lines 100..2100 background seen in each window
    /// with probability 1/2 (a fixed pseudo-random pattern).
    fn background_heavy() -> (Vec<LineSet>, Vec<LineSet>) {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut bit = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x & 1 == 1
        };
        let line = |l: u64| RegionLine { region: 0, line: l };
        let mut window = |request: bool| {
            let own = (0..10u64).filter(|_| request).map(line);
            let bg: Vec<RegionLine> = (100..2100u64).filter(|_| bit()).map(line).collect();
            LineSet::from_lines(own.chain(bg))
        };
        let samples = (0..8).map(|_| window(true)).collect();
        let noise = (0..8).map(|_| window(false)).collect();
        (samples, noise)
    }

    #[test]
    fn the_vote_turns_to_the_enrichment_test_where_chance_would_fill_it() {
        let (samples, noise) = background_heavy();
        let run = |vote| {
            let p = RecordParams {
                vote,
                ..Default::default()
            };
            let mut st = RecordStats::default();
            (stable_lines(&samples, &noise, &p, &mut st), st)
        };
        let (default, st) = run(Vote::Default);
        assert!(st.enriched.is_none());
        let own = (0..10u64).map(|l| RegionLine { region: 0, line: l });
        assert!(own.clone().all(|l| default.contains(&l)));
        // Background at rate 1/2 passes the default vote by chance, and the model says so.
        assert!(default.len() > 60, "{}", default.len());
        assert!(st.chance_share().unwrap() > CHANCE_UNRELIABLE, "{st:?}");
        // `auto` therefore tests each line: the request's ten stay, and (nearly) nothing of
        // the background beside them (a tenth of the kept lines expected at most).
        let (auto, st) = run(Vote::Auto);
        let e = st.enriched.expect("the enrichment test ran");
        assert_eq!(e.kept, auto.len() as u64);
        assert!(own.clone().all(|l| auto.contains(&l)));
        assert!(auto.len() <= 13, "{}", auto.len());
        assert!(st.chance_note().unwrap().contains("Fisher"));
        // With four samples each way no line can meet the test's level among ~2,000: `auto`
        // keeps the vote's lines and says why; `enriched` keeps what the test kept (none).
        let (few, few_noise) = (&samples[..4], &noise[..4]);
        let run4 = |vote| {
            let p = RecordParams {
                vote,
                filter: preheat_model::FilterParams { k: 3, n: 4, gap: 0 },
                ..Default::default()
            };
            let mut st = RecordStats {
                samples: 4,
                ..Default::default()
            };
            (stable_lines(few, few_noise, &p, &mut st), st)
        };
        let (auto4, st) = run4(Vote::Auto);
        assert_eq!(st.enriched.map(|e| e.kept), Some(0));
        assert_eq!(auto4, run4(Vote::Default).0);
        let note = st.chance_note().unwrap();
        assert!(
            note.starts_with("WARNING") && note.contains("found none"),
            "{note}"
        );
        assert!(run4(Vote::Enriched).0.is_empty());
    }

    #[test]
    fn a_threshold_at_the_miss_median_does_not_separate() {
        // The Xeon host's usual calibration: hits ~80 ticks, misses ~330, threshold ~190.
        assert!(super::separates(80, 330, 190));
        // Clamped to the miss median: not separated; nor without a gap at all.
        assert!(!super::separates(80, 330, 330));
        assert!(!super::separates(300, 300, 301));
    }
}
