//! What `preheat record` prints about a recording, line by line: the profile written, what the
//! probe did and saw (its layout, what it took again, its samples, how many of its lines the
//! vote keeps by chance), and the hybrid merge. Each line names how its numbers came about
//! (measured, modeled).

use std::path::Path;

use crate::params::{RecordStats, Recording};

/// The report on `rec`, written to `out`.
pub fn lines(out: &Path, rec: &Recording) -> Vec<String> {
    let ws = rec.profile.classes[0].ws.stats();
    let st = &rec.stats;
    // The probe's threshold, where a probe ran (probe, hybrid).
    let probed = st.threshold_ticks > 0;
    let threshold = if probed {
        format!(", probe threshold {} ticks", st.threshold_ticks)
    } else {
        String::new()
    };
    let mut v = vec![format!(
        "wrote {}: {} lines ({:.1} KiB) in {} runs, {} encoded bytes; {} requests, {:.1} s \
         [measured: {} samples{threshold}]",
        out.display(),
        ws.lines,
        ws.kib,
        ws.runs,
        ws.encoded_bytes,
        st.requests_sent,
        st.seconds,
        st.samples,
    )];
    if probed {
        v.extend(probe_lines(st));
    } else if !st.lines_per_sample.is_empty() {
        v.push(format!(
            "{} [measured]: lines seen per sample {}",
            st.backend,
            spread(&st.lines_per_sample)
        ));
    }
    if !st.step_instructions.is_empty() {
        let steps: u64 = st.step_instructions.iter().sum();
        let stepped = st.step_instructions.len();
        let fewer = if stepped < st.samples as usize {
            format!(
                "; {stepped} samples stepped, not {}: the default backend's time budget",
                st.samples
            )
        } else {
            String::new()
        };
        v.push(format!(
            "step [measured]: {} instructions single-stepped per request, {:.1} µs per \
             instruction ({:.1} s in all{fewer})",
            spread(&st.step_instructions),
            1e6 * st.step_seconds / steps.max(1) as f64,
            st.step_seconds
        ));
    }
    let remapped = st.cycles_repeated - st.probe_reconnects;
    if remapped > 0 {
        v.push(format!(
            "probe: {remapped} cycle(s) repeated because the server's mappings changed while it \
             served the request"
        ));
    }
    if st.probe_reconnects > 0 {
        v.push(format!(
            "probe: {} cycle(s) repeated on a new probe connection because the server had \
             closed the agent's (an idle timeout of its keep-alive connections)",
            st.probe_reconnects
        ));
    }
    if let Some(h) = st.hybrid {
        v.push(format!(
            "hybrid [measured]: {} code lines from step, {} data lines from probe; dropped {} \
             probe code lines, {} non-executable step lines, {} unmapped",
            h.code_lines,
            h.data_lines,
            h.probe_code_lines_dropped,
            h.step_non_exec_dropped,
            h.unmapped_dropped
        ));
    }
    v
}

/// What the probe did: its layout (and the pilot that chose it), what its samples saw, what
/// its vote keeps by chance.
fn probe_lines(st: &RecordStats) -> Vec<String> {
    let pilot = if st.layout_trials.is_empty() {
        "given".to_string()
    } else {
        let trials: Vec<String> = st
            .layout_trials
            .iter()
            .map(|t| {
                format!(
                    "{}/{} {:.1}%",
                    t.layout.stride,
                    t.layout.window_pages,
                    100.0 * t.hit_share
                )
            })
            .collect();
        format!(
            "chosen by a pilot of {} request-less samples each, lines read as hits: {}",
            st.layout_trials[0].samples,
            trials.join(", ")
        )
    };
    let mut v = vec![format!(
        "probe [measured]: stride {} over {}-page windows ({pilot}); threshold {} ticks (hit {}, \
         miss {}; {} calibration(s))",
        st.stride,
        st.window_pages,
        st.threshold_ticks,
        st.hit_ticks_p50,
        st.miss_ticks_p50,
        st.calibrations
    )];
    v.extend(
        st.redo_notes()
            .into_iter()
            .map(|n| format!("probe [measured]: {n}")),
    );
    v.push(format!(
        "probe [measured]: {} KiB of candidates in {} chunk(s); lines seen per sample {}, per \
         sample without a request {} ({:.1}% of the lines probed); {} lines seen in >= {} \
         request-less samples removed",
        st.candidate_bytes / 1024,
        st.chunks,
        spread(&st.lines_per_sample),
        spread(&st.lines_per_noise_sample),
        100.0 * st.noise_hit_share,
        st.noise_lines_removed,
        st.noise_k
    ));
    if let Some(note) = st.chance_note() {
        v.push(format!("probe [modeled]: {note}"));
    }
    v
}

/// Counts as "median [min–max], n = N" (the project's one median, `Spread`), or "n/a" without
/// any.
fn spread(v: &[u64]) -> String {
    if v.is_empty() {
        return "n/a".into();
    }
    let v: Vec<f64> = v.iter().map(|&x| x as f64).collect();
    preheat_model::stats::Spread::of(&v).show(0)
}
