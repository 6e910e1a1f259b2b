//! What an estimation is asked for and what it reports: the backend, the parameters, the
//! statistics and the recorded profile (shared by every backend, so none depends on another's
//! module for them).

use preheat_model::{FilterParams, Profile};

use crate::layout::{Layout, Trial};
use serde::Serialize;

/// Which backend records (see the crate's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum BackendChoice {
    /// Best available: hybrid where ptrace is permitted and the workload is a fixed byte
    /// request, else probe (with a one-line note saying why).
    Auto,
    Probe,
    Trace,
    Pmu,
    /// Exact native code lines: single-step the serving thread with ptrace (slow; no data).
    Step,
    /// Code lines from step, data lines from probe, recorded on the same server and merged.
    Hybrid,
}

#[derive(Debug, Clone)]
pub struct RecordParams {
    pub filter: FilterParams,
    /// Largest probe pass, bytes.
    pub chunk_bytes: u64,
    /// Subtract lines that also show up in no-request samples.
    pub subtract_noise: bool,
    /// A line seen in at least this many of the n no-request samples is noise (the least such
    /// vote: a probe reading many false hits raises it, see [`crate::layout::noise_k`]).
    pub noise_k: u32,
    /// The probe layout (stride and window, see [`crate::layout`]); `None`: chosen by a pilot
    /// on the server's memory.
    pub layout: Option<Layout>,
    /// Requests sent before any sample (every backend): the server's lazy initialisation
    /// settles, and a runtime with a JIT (the JVM, V8) reaches the code it runs in its steady
    /// state only after thousands of requests, which the probe's calibration and pilot send
    /// anyway but the exact backends would not (see `--warm-up`).
    pub warm_up: u32,
    /// Which vote makes the working set of the samples.
    pub vote: Vote,
    pub quiet: bool,
}

/// The vote over the probe's samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Vote {
    /// k of n, less the lines that come about as often without a request; the enrichment
    /// test instead where the model says more than half of what that keeps would be kept by
    /// chance ([`RecordStats::chance_note`]).
    Auto,
    /// k of n, less the lines that come about as often without a request.
    Default,
    /// k of n, and each line seen significantly more often with the request than without
    /// (`preheat_model::keep_enriched`).
    Enriched,
}

/// What the enrichment test did.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Enriched {
    /// Lines the request samples saw (the tests made).
    pub candidates: u64,
    /// The level each line's p-value had to meet, and the false-discovery rate it was chosen
    /// for (Benjamini–Hochberg).
    pub alpha: f64,
    pub fdr: f64,
    pub kept: u64,
    /// Its lines are the working set (not where `auto` found it kept none).
    pub used: bool,
}

/// [`RecordParams::warm_up`]'s default: enough for a server without a JIT.
pub const DEFAULT_WARM_UP: u32 = 8;

impl Default for RecordParams {
    fn default() -> Self {
        RecordParams {
            filter: FilterParams::default(),
            chunk_bytes: 1 << 20,
            subtract_noise: true,
            noise_k: 2,
            layout: None,
            warm_up: DEFAULT_WARM_UP,
            vote: Vote::Auto,
            quiet: false,
        }
    }
}

/// What the estimation did, for reports.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RecordStats {
    pub backend: String,
    pub samples: u32,
    pub requests_sent: u64,
    pub candidate_bytes: u64,
    pub chunks: u64,
    pub threshold_ticks: u32,
    /// The probe layout recorded with (stride 0 for backends without a probe).
    pub stride: u32,
    pub window_pages: u32,
    /// The pilot's measurements, one per candidate layout (empty where the layout was given).
    pub layout_trials: Vec<Trial>,
    /// Median share of probed lines read as hits in the request-less samples.
    pub noise_hit_share: f64,
    /// The pilot's layout, given up on because it read more than
    /// [`crate::layout::UNRELIABLE_SHARE`] of untouched lines as hits (the samples were taken
    /// again with the next wider layout).
    pub layout_retried: Option<crate::layout::Retried>,
    /// The samples were taken once more after a new calibration, because those before read
    /// this share of untouched lines as hits with the pilot's layout (and any wider one).
    pub retaken: Option<f64>,
    /// The recording's request-less samples still read more than that: false hits in every
    /// sample survive the vote, so the working set holds lines no request touches.
    pub unreliable: bool,
    /// The noise vote used: lines in at least this many request-less samples were removed.
    pub noise_k: u32,
    /// Lines the vote kept, and how many of them it would keep although no request touches
    /// them (modeled from each line's rate in the request-less samples:
    /// [`preheat_model::chance_kept`]); `None` without request-less samples.
    pub kept_lines: u64,
    pub chance_kept: Option<f64>,
    /// Where the enrichment test ran.
    pub enriched: Option<Enriched>,
    /// Threshold calibrations the agent was asked for (more than one: an earlier one did not
    /// separate hits from misses).
    pub calibrations: u32,
    pub hit_ticks_p50: u32,
    pub miss_ticks_p50: u32,
    /// Lines per sample before filtering (relative lines, all chunks).
    pub lines_per_sample: Vec<u64>,
    /// Lines per no-request (noise) sample, as `lines_per_sample`.
    pub lines_per_noise_sample: Vec<u64>,
    /// Median flush-to-reload window of the request passes, µs.
    pub window_us_p50: f64,
    /// Lines seen in ≥ noise_k noise samples and removed.
    pub noise_lines_removed: u64,
    /// Probed hits outside any region (e.g. the mapping went away mid-run).
    pub unmapped_hits: u64,
    pub seconds: f64,
    /// The step backend: instructions single-stepped per request, and the seconds all of
    /// them took.
    pub step_instructions: Vec<u64>,
    pub step_seconds: f64,
    /// The hybrid backend's merge.
    pub hybrid: Option<HybridStats>,
    /// The probe's requests were sent by the CLI inside request-less windows because the agent
    /// could not open a connection its process serves (a prefork worker busy with ours).
    pub external: bool,
    /// Why the agent's own probe connection was not used (its error), where `external`.
    pub external_reason: Option<String>,
    /// The probe's requests went on our connection, handed to the agent (`ProbeAdopt`),
    /// because the agent could not open one its process serves: why not.
    pub probe_adopted: Option<String>,
    /// Probe cycles repeated because the agent skipped them: the server's mappings changed
    /// while it served the request (its allocator returned memory, say).
    pub cycles_repeated: u64,
    /// Of those, cycles repeated on a new probe connection because the server had closed the
    /// agent's (an idle timeout of its keep-alive connections).
    pub probe_reconnects: u64,
}

/// A recording of which more than this share of the kept lines would be kept by chance
/// ([`RecordStats::chance_kept`]) is called unreliable.
pub const CHANCE_UNRELIABLE: f64 = 0.5;

impl RecordStats {
    /// A recording's statistics as `backend` starts: its samples, and the warm-up requests it
    /// sends first counted.
    pub(crate) fn started(backend: &str, p: &RecordParams) -> RecordStats {
        RecordStats {
            backend: backend.into(),
            samples: p.filter.n,
            requests_sent: u64::from(p.warm_up),
            ..Default::default()
        }
    }

    /// The modeled share of the kept lines kept by chance.
    pub fn chance_share(&self) -> Option<f64> {
        let kept = self.kept_lines.max(1) as f64;
        self.chance_kept.map(|c| (c / kept).min(1.0))
    }

    /// How many kept lines the vote would keep by chance (modeled), one sentence; a warning
    /// where that is more than [`CHANCE_UNRELIABLE`] of them. `None` without request-less
    /// samples.
    pub fn chance_note(&self) -> Option<String> {
        let (chance, share) = (self.chance_kept?, self.chance_share()?);
        let mut s = format!(
            "of the {} lines kept, about {chance:.0} ({:.0}%) would pass the vote by chance, at \
             the rates the {} request-less samples saw them (not counted: false hits that come \
             with the request's own lines, such as code fetched but not run)",
            self.kept_lines,
            100.0 * share,
            self.lines_per_noise_sample.len()
        );
        match self.enriched {
            Some(e) if e.used => {
                return Some(format!(
                    "{s}; so the working set is instead the {} of the {} lines the requests saw \
                     that were seen significantly more often with a request than without \
                     (one-sided Fisher tests, false-discovery rate {:.0}%: level {:.1e})",
                    e.kept,
                    e.candidates,
                    100.0 * e.fdr,
                    e.alpha
                ));
            }
            Some(e) => {
                s = format!(
                    "{s}; a test of each line (seen more often with a request than without) found \
                 none at a false-discovery rate of {:.0}% among {} lines with {} samples each \
                 way, so the vote's lines are kept (more `--samples` give the test its power)",
                    100.0 * e.fdr,
                    e.candidates,
                    self.samples
                );
            }
            None => {}
        }
        if share > CHANCE_UNRELIABLE {
            s = format!(
                "WARNING: {s}: this estimate is mostly the server's other activity, not the \
                 request's lines (`preheat ws compare` against a `--backend trace` recording \
                 measures it)"
            );
        }
        Some(s)
    }

    /// What the probe had to take again, and a warning where its estimate stays unreliable:
    /// one sentence each, for `record` and the demo.
    pub fn redo_notes(&self) -> Vec<String> {
        let limit = 100.0 * crate::layout::UNRELIABLE_SHARE;
        let mut v = Vec::new();
        if let Some(r) = &self.layout_retried {
            v.push(format!(
                "stride {} over {}-page windows read {:.1}% of untouched lines as hits in the \
                 recording's request-less samples (more than {limit:.0}%): the samples were \
                 taken again with stride {} over {}-page windows",
                r.layout.stride,
                r.layout.window_pages,
                100.0 * r.hit_share,
                self.stride,
                self.window_pages
            ));
        }
        if let Some(why) = &self.probe_adopted {
            v.push(format!(
                "the agent's own connections were not served by its process ({why}): the \
                 probe's requests went on ours, handed to the agent"
            ));
        }
        if let Some(share) = self.retaken {
            v.push(format!(
                "the samples read {:.1}% of untouched lines as hits: taken again after a new \
                 calibration",
                100.0 * share
            ));
        }
        if self.unreliable {
            v.push(format!(
                "WARNING: the probe read {:.1}% of untouched lines as hits in the recording's \
                 request-less samples (more than {limit:.0}%): false hits in every sample \
                 survive the vote, so this working set holds lines no request touches (try \
                 `--backend step` or `hybrid`, or record again)",
                100.0 * self.noise_hit_share
            ));
        }
        v
    }

    /// Forget what the samples saw, before they are taken again.
    pub(crate) fn restart_samples(&mut self) {
        self.lines_per_sample.clear();
        self.lines_per_noise_sample.clear();
        self.unmapped_hits = 0;
    }
}

pub struct Recording {
    pub profile: Profile,
    pub stats: RecordStats,
}

/// What the merge kept and dropped (lines).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct HybridStats {
    /// Code lines, from `step`.
    pub code_lines: u64,
    /// Data lines, from the probe.
    pub data_lines: u64,
    /// Probe lines in executable mappings, replaced by the step's code lines.
    pub probe_code_lines_dropped: u64,
    /// Step lines outside executable mappings (expected 0).
    pub step_non_exec_dropped: u64,
    /// Lines of either profile whose region is no longer mapped at merge time.
    pub unmapped_dropped: u64,
}

#[cfg(test)]
mod redo_tests {
    use super::*;
    use crate::layout::{Retried, CANDIDATES};

    #[test]
    fn the_redo_notes_say_what_was_taken_again() {
        let mut st = RecordStats::default();
        assert!(st.redo_notes().is_empty());
        st.layout_retried = Some(Retried {
            layout: CANDIDATES[0],
            hit_share: 0.425,
        });
        st.stride = CANDIDATES[1].stride;
        st.window_pages = CANDIDATES[1].window_pages;
        st.retaken = Some(0.89);
        st.unreliable = true;
        st.noise_hit_share = 0.5;
        let n = st.redo_notes();
        assert_eq!(n.len(), 3, "{n:?}");
        assert!(
            n[0].starts_with("stride 2 over 16-page windows read 42.5%"),
            "{n:?}"
        );
        assert!(n[0].ends_with("stride 4 over 64-page windows"), "{n:?}");
        assert!(n[1].contains("89.0%") && n[2].starts_with("WARNING") && n[2].contains("50.0%"));
    }

    #[test]
    fn an_adopted_probe_connection_is_said() {
        let st = RecordStats {
            probe_adopted: Some("none of 24 connections".into()),
            ..Default::default()
        };
        let n = st.redo_notes();
        assert_eq!(n.len(), 1, "{n:?}");
        assert!(n[0].contains("(none of 24 connections)") && n[0].contains("handed to the agent"));
    }

    #[test]
    fn the_chance_note_warns_only_above_half() {
        let mut st = RecordStats {
            kept_lines: 400,
            chance_kept: Some(120.0),
            lines_per_noise_sample: vec![1; 8],
            ..Default::default()
        };
        let note = st.chance_note().unwrap();
        assert!(
            note.starts_with("of the 400 lines kept, about 120 (30%)"),
            "{note}"
        );
        assert!(note.contains("8 request-less samples"), "{note}");
        st.chance_kept = Some(312.0);
        let note = st.chance_note().unwrap();
        assert!(
            note.starts_with("WARNING: of the 400 lines kept, about 312 (78%)"),
            "{note}"
        );
        assert!(note.contains("--backend trace"), "{note}");
        // More expected by chance than kept (a model, not a count): capped at all of them.
        st.chance_kept = Some(500.0);
        assert_eq!(st.chance_share(), Some(1.0));
        // Without request-less samples there is no note.
        st.chance_kept = None;
        assert_eq!(st.chance_note(), None);
    }
}
