//! Online completion-time model for fast-device I/O (paper §2, "SSD Case Study": the I/O time on
//! a flash SSD "can be modeled on the operation type (read / write) and I/O size", with Pearson
//! r close to 1.00 for reads and 0.91 for writes; the measured-here notes give ~60 µs + 1.0 µs/KiB
//! with r 0.91 over single samples on our host-cached virtual disk).
//!
//! Pure: no I/O, no clocks, deterministic.
//!
//! * [`OnlineFit`]: least-squares line `latency = a + b·size`, updated one sample at a time with
//!   Welford-style co-moments (numerically stable, O(1) memory), plus Pearson r.
//! * [`Reservoir`]: the most recent exact samples (bounded ring), from which residual quantiles
//!   against the *current* fit are computed, so a prediction can carry a safety quantile
//!   ("by this time the operation is done with probability ≥ q").
//! * [`WakeMargin`]: the early-wake margin subtracted from the prediction before the requester
//!   stops blocking. It absorbs what the fit does not know — the timer-wake lag of the requester's
//!   CPU (≥ 15–30 µs here, ≥ 150 µs after 10 ms idle) and prediction error.
//! * [`CompletionPredictor`]: one fit + reservoir + margin per [`OpKind`].
//!
//! **Censoring.** A requester that wakes at `t` and finds the operation already complete only
//! learns `latency ≤ t − submit` (a right-censored, or rather upper-bounded, sample). Entering
//! `t − submit` as if it were exact makes the model ratchet up: a late wake produces a larger
//! "latency", the next wake is later still, and so on. Such samples therefore never enter the
//! fit; instead the margin backs off multiplicatively (`margin ← margin·growth`), which moves the
//! next wake-up *earlier*. Every exact sample decays the margin by a factor chosen so that the
//! loop settles where a share `target_censored` of wake-ups are late (AIMD-style: at equilibrium
//! `p·ln(growth) = (1−p)·ln(1/decay)`). Invariant (proptested): a censored observation never
//! changes the fit and never moves the planned wake-up later.

use std::collections::VecDeque;

use serde::Serialize;

/// Operation type: the paper models reads and writes separately.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    Read,
    Write,
}

impl OpKind {
    fn index(self) -> usize {
        match self {
            OpKind::Read => 0,
            OpKind::Write => 1,
        }
    }
}

/// Online simple linear regression `y = a + b·x` with Welford-style updates of the means and the
/// second (co-)moments.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OnlineFit {
    n: u64,
    mean_x: f64,
    mean_y: f64,
    m2_x: f64,
    m2_y: f64,
    c_xy: f64,
}

impl OnlineFit {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add one sample. Non-finite values are ignored.
    pub fn push(&mut self, x: f64, y: f64) {
        if !x.is_finite() || !y.is_finite() {
            return;
        }
        self.n += 1;
        let n = self.n as f64;
        let dx = x - self.mean_x;
        let dy = y - self.mean_y;
        self.mean_x += dx / n;
        self.mean_y += dy / n;
        // Co-moments use the old deviation times the new one (Welford).
        self.m2_x += dx * (x - self.mean_x);
        self.m2_y += dy * (y - self.mean_y);
        self.c_xy += dx * (y - self.mean_y);
    }

    pub fn n(&self) -> u64 {
        self.n
    }

    pub fn mean_x(&self) -> f64 {
        self.mean_x
    }

    pub fn mean_y(&self) -> f64 {
        self.mean_y
    }

    /// True when x has (numerically) no spread: the slope is not identifiable.
    fn x_degenerate(&self) -> bool {
        self.m2_x <= 1e-12 * self.n as f64 * (self.mean_x * self.mean_x + 1.0)
    }

    /// `(a, b)`: intercept and slope. With a single distinct x the slope is 0 and the intercept
    /// is the mean of y. `None` without samples.
    pub fn line(&self) -> Option<(f64, f64)> {
        if self.n == 0 {
            return None;
        }
        if self.x_degenerate() {
            return Some((self.mean_y, 0.0));
        }
        let b = self.c_xy / self.m2_x;
        Some((self.mean_y - b * self.mean_x, b))
    }

    pub fn predict(&self, x: f64) -> Option<f64> {
        self.line().map(|(a, b)| a + b * x)
    }

    /// Pearson's correlation coefficient, in [−1, 1]; `None` with fewer than two samples or
    /// when x or y has no spread.
    pub fn pearson_r(&self) -> Option<f64> {
        if self.n < 2 || self.x_degenerate() || self.m2_y <= 0.0 {
            return None;
        }
        let r = self.c_xy / (self.m2_x.sqrt() * self.m2_y.sqrt());
        r.is_finite().then(|| r.clamp(-1.0, 1.0))
    }
}

/// Bounded ring of the most recent `(x, y)` samples, for residual quantiles.
#[derive(Clone, Debug)]
pub struct Reservoir {
    cap: usize,
    items: VecDeque<(f64, f64)>,
}

impl Reservoir {
    pub fn new(cap: usize) -> Self {
        let cap = cap.max(1);
        Self {
            cap,
            items: VecDeque::with_capacity(cap),
        }
    }

    pub fn push(&mut self, x: f64, y: f64) {
        if self.items.len() == self.cap {
            self.items.pop_front();
        }
        self.items.push_back((x, y));
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The `q`-quantile (nearest rank) of the residuals `y − fit(x)` of the stored samples.
    pub fn residual_quantile(&self, fit: &OnlineFit, q: f64) -> Option<f64> {
        let (a, b) = fit.line()?;
        if self.items.is_empty() {
            return None;
        }
        let mut r: Vec<f64> = self.items.iter().map(|&(x, y)| y - (a + b * x)).collect();
        let k = ((q.clamp(0.0, 1.0) * r.len() as f64).ceil() as usize).clamp(1, r.len()) - 1;
        let (_, v, _) = r.select_nth_unstable_by(k, |p, q| p.total_cmp(q));
        Some(*v)
    }
}

/// Parameters of the early-wake margin.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct MarginConfig {
    /// Starting margin (ns). The notes: timer-driven wakeup lags ~30 µs up to 1 ms idle.
    pub initial_ns: f64,
    /// Lower bound (ns); must be > 0 so multiplicative growth can leave it.
    pub min_ns: f64,
    /// Upper bound (ns).
    pub max_ns: f64,
    /// Multiplicative back-off on a censored (late) wake-up, > 1.
    pub growth: f64,
    /// Share of late wake-ups the loop settles at (sets the per-exact-sample decay).
    pub target_censored: f64,
}

impl Default for MarginConfig {
    fn default() -> Self {
        Self {
            initial_ns: 30_000.0,
            min_ns: 1_000.0,
            max_ns: 5_000_000.0,
            growth: 2.0,
            target_censored: 0.05,
        }
    }
}

/// The early-wake margin controller (multiplicative back-off on censoring, slow decay on exact
/// samples).
#[derive(Clone, Debug)]
pub struct WakeMargin {
    cfg: MarginConfig,
    margin_ns: f64,
    decay: f64,
}

impl WakeMargin {
    pub fn new(cfg: MarginConfig) -> Self {
        let growth = if cfg.growth.is_finite() && cfg.growth > 1.0 {
            cfg.growth
        } else {
            2.0
        };
        let p = cfg.target_censored.clamp(1e-4, 0.5);
        // Equilibrium p·ln(growth) = (1−p)·ln(1/decay).
        let decay = (-(p / (1.0 - p)) * growth.ln()).exp();
        let min_ns = cfg.min_ns.max(1.0);
        let max_ns = cfg.max_ns.max(min_ns);
        let cfg = MarginConfig {
            growth,
            min_ns,
            max_ns,
            ..cfg
        };
        Self {
            margin_ns: cfg.initial_ns.clamp(min_ns, max_ns),
            cfg,
            decay,
        }
    }

    pub fn margin_ns(&self) -> f64 {
        self.margin_ns
    }

    pub fn decay(&self) -> f64 {
        self.decay
    }

    /// A wake-up found the operation already complete: wake earlier next time.
    pub fn on_late(&mut self) {
        self.margin_ns = (self.margin_ns * self.cfg.growth).clamp(self.cfg.min_ns, self.cfg.max_ns);
    }

    /// The requester was awake (spinning) when the operation completed: creep back.
    pub fn on_in_time(&mut self) {
        self.margin_ns = (self.margin_ns * self.decay).clamp(self.cfg.min_ns, self.cfg.max_ns);
    }
}

/// Predictor configuration.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct PredictorConfig {
    /// Residual samples kept per kind.
    pub reservoir: usize,
    /// Quantile of the residuals added to the line for the wake-up point (low: wake before the
    /// operation is likely to be done).
    pub wake_quantile: f64,
    /// Exact samples needed before [`CompletionPredictor::wake_delay_ns`] answers.
    pub min_exact: u64,
    pub margin: MarginConfig,
}

impl Default for PredictorConfig {
    fn default() -> Self {
        Self {
            reservoir: 256,
            wake_quantile: 0.05,
            min_exact: 16,
            margin: MarginConfig::default(),
        }
    }
}

/// What a requester learned about one operation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Observation {
    /// The completion time is known exactly and the requester was awake in time.
    Exact { latency_ns: f64 },
    /// The requester woke and found the operation done: only `latency ≤ upper_bound_ns` is
    /// known. Not entered into the fit; backs the margin off.
    Censored { upper_bound_ns: f64 },
    /// The completion time is known exactly, but the requester's wake-up was (nearly) late:
    /// the device side timestamped a completion the requester found done, or the requester
    /// woke so close to the completion that the wake-up overlapped it. Enters the fit *and*
    /// backs the margin off.
    ExactLate { latency_ns: f64 },
}

#[derive(Clone, Debug)]
struct KindModel {
    fit: OnlineFit,
    reservoir: Reservoir,
    margin: WakeMargin,
    exact: u64,
    censored: u64,
    late: u64,
}

/// Snapshot of one kind's model, in µs and KiB for humans.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct ModelStats {
    pub exact_samples: u64,
    pub censored_samples: u64,
    /// Exact samples whose wake-up was (nearly) late ([`Observation::ExactLate`]).
    pub late_exact_samples: u64,
    pub intercept_us: Option<f64>,
    pub slope_us_per_kib: Option<f64>,
    pub pearson_r: Option<f64>,
    pub margin_us: f64,
}

/// Completion-time predictor for one device: a line per [`OpKind`], residual safety quantile,
/// censoring-aware early-wake margin.
#[derive(Clone, Debug)]
pub struct CompletionPredictor {
    cfg: PredictorConfig,
    kinds: [KindModel; 2],
}

impl CompletionPredictor {
    pub fn new(cfg: PredictorConfig) -> Self {
        let km = || KindModel {
            fit: OnlineFit::new(),
            reservoir: Reservoir::new(cfg.reservoir),
            margin: WakeMargin::new(cfg.margin),
            exact: 0,
            censored: 0,
            late: 0,
        };
        Self {
            cfg,
            kinds: [km(), km()],
        }
    }

    pub fn config(&self) -> &PredictorConfig {
        &self.cfg
    }

    fn k(&self, kind: OpKind) -> &KindModel {
        &self.kinds[kind.index()]
    }

    /// Record what was learned about one operation of `size_bytes`.
    pub fn observe(&mut self, kind: OpKind, size_bytes: u64, obs: Observation) {
        let m = &mut self.kinds[kind.index()];
        let x = size_bytes as f64;
        match obs {
            Observation::Exact { latency_ns } => {
                if latency_ns.is_finite() {
                    m.fit.push(x, latency_ns);
                    m.reservoir.push(x, latency_ns);
                    m.exact += 1;
                }
                m.margin.on_in_time();
            }
            Observation::ExactLate { latency_ns } => {
                if latency_ns.is_finite() {
                    m.fit.push(x, latency_ns);
                    m.reservoir.push(x, latency_ns);
                    m.exact += 1;
                }
                m.late += 1;
                m.margin.on_late();
            }
            Observation::Censored { .. } => {
                m.censored += 1;
                m.margin.on_late();
            }
        }
    }

    /// Point prediction (the fitted line), ns.
    pub fn predict(&self, kind: OpKind, size_bytes: u64) -> Option<f64> {
        self.k(kind).fit.predict(size_bytes as f64)
    }

    /// The line plus the `q`-quantile of recent residuals, ns: "done by then with probability
    /// ≈ q" under the recent error distribution.
    pub fn predict_quantile(&self, kind: OpKind, size_bytes: u64, q: f64) -> Option<f64> {
        let m = self.k(kind);
        let base = m.fit.predict(size_bytes as f64)?;
        let r = m.reservoir.residual_quantile(&m.fit, q).unwrap_or(0.0);
        Some(base + r)
    }

    /// How long after submission the requester should stop blocking and start spinning, ns:
    /// `max(0, predict_quantile(wake_quantile) − margin)`. `None` until `min_exact` exact
    /// samples were seen (the caller then spins, so it collects exact samples).
    pub fn wake_delay_ns(&self, kind: OpKind, size_bytes: u64) -> Option<f64> {
        let m = self.k(kind);
        if m.exact < self.cfg.min_exact.max(1) {
            return None;
        }
        let p = self.predict_quantile(kind, size_bytes, self.cfg.wake_quantile)?;
        Some((p - m.margin.margin_ns()).max(0.0))
    }

    pub fn margin_ns(&self, kind: OpKind) -> f64 {
        self.k(kind).margin.margin_ns()
    }

    pub fn fit(&self, kind: OpKind) -> &OnlineFit {
        &self.k(kind).fit
    }

    pub fn stats(&self, kind: OpKind) -> ModelStats {
        let m = self.k(kind);
        let line = m.fit.line();
        ModelStats {
            exact_samples: m.exact,
            censored_samples: m.censored,
            late_exact_samples: m.late,
            intercept_us: line.map(|(a, _)| a / 1e3),
            slope_us_per_kib: line.map(|(_, b)| b * 1024.0 / 1e3),
            pearson_r: m.fit.pearson_r(),
            margin_us: m.margin.margin_ns() / 1e3,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn two_pass_r(xs: &[f64], ys: &[f64]) -> f64 {
        let n = xs.len() as f64;
        let mx = xs.iter().sum::<f64>() / n;
        let my = ys.iter().sum::<f64>() / n;
        let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
        for (x, y) in xs.iter().zip(ys) {
            sxy += (x - mx) * (y - my);
            sxx += (x - mx) * (x - mx);
            syy += (y - my) * (y - my);
        }
        sxy / (sxx.sqrt() * syy.sqrt())
    }

    #[test]
    fn known_line_and_r() {
        let mut f = OnlineFit::new();
        for (x, y) in [(1.0, 3.0), (2.0, 5.0), (3.0, 7.0)] {
            f.push(x, y);
        }
        let (a, b) = f.line().unwrap();
        assert!((a - 1.0).abs() < 1e-12 && (b - 2.0).abs() < 1e-12);
        assert!((f.pearson_r().unwrap() - 1.0).abs() < 1e-12);
        let mut g = OnlineFit::new();
        for (x, y) in [(1.0, 1.0), (2.0, 3.0), (3.0, 2.0), (4.0, 5.0)] {
            g.push(x, y);
        }
        let r = two_pass_r(&[1.0, 2.0, 3.0, 4.0], &[1.0, 3.0, 2.0, 5.0]);
        assert!((g.pearson_r().unwrap() - r).abs() < 1e-12);
    }

    #[test]
    fn single_size_gives_flat_line_and_no_r() {
        let mut f = OnlineFit::new();
        assert_eq!(f.line(), None);
        for y in [10.0, 12.0, 14.0] {
            f.push(4096.0, y);
        }
        assert_eq!(f.line(), Some((12.0, 0.0)));
        assert_eq!(f.pearson_r(), None);
    }

    #[test]
    fn residual_quantiles() {
        let mut f = OnlineFit::new();
        let mut r = Reservoir::new(4);
        for (i, y) in [100.0, 0.0, 1.0, 2.0, 3.0].into_iter().enumerate() {
            f.push(i as f64, 0.0);
            r.push(i as f64, y);
        }
        // Fit is y = 0 (pushed zeros); the ring keeps the last 4: residuals 0,1,2,3.
        assert_eq!(r.len(), 4);
        assert_eq!(r.residual_quantile(&f, 0.0), Some(0.0));
        assert_eq!(r.residual_quantile(&f, 0.5), Some(1.0));
        assert_eq!(r.residual_quantile(&f, 1.0), Some(3.0));
    }

    #[test]
    fn margin_settles_near_target_censored_share() {
        // Simulate: lag ~ fixed 20 µs needs margin ≥ 20 µs; wake is late iff margin < lag.
        let mut m = WakeMargin::new(MarginConfig::default());
        let mut late = 0;
        let n = 20_000;
        let mut rng = StdRng::seed_from_u64(12345);
        for _ in 0..n {
            let lag = 15_000.0 + rng.gen_range(0..10_000) as f64;
            if m.margin_ns() < lag {
                late += 1;
                m.on_late();
            } else {
                m.on_in_time();
            }
        }
        let share = late as f64 / n as f64;
        assert!(share > 0.01 && share < 0.10, "late share {share}");
    }

    #[test]
    fn bootstrap_then_wake_delay() {
        let mut p = CompletionPredictor::new(PredictorConfig::default());
        assert_eq!(p.wake_delay_ns(OpKind::Read, 4096), None);
        for i in 0..32u64 {
            let size = 4096 << (i % 3);
            let lat = 60_000.0 + size as f64 / 1024.0 * 1_000.0;
            p.observe(OpKind::Read, size, Observation::Exact { latency_ns: lat });
        }
        let d = p.wake_delay_ns(OpKind::Read, 4096).unwrap();
        let pred = p.predict(OpKind::Read, 4096).unwrap();
        assert!((pred - 64_000.0).abs() < 1e-6);
        assert!(d < pred && d > 0.0);
        let s = p.stats(OpKind::Read);
        assert!((s.slope_us_per_kib.unwrap() - 1.0).abs() < 1e-9);
        assert!((s.intercept_us.unwrap() - 60.0).abs() < 1e-6);
        // The write model is separate and still empty.
        assert_eq!(p.predict(OpKind::Write, 4096), None);
    }

    fn arb_samples() -> impl Strategy<Value = Vec<(u64, f64)>> {
        prop::collection::vec((512u64..=1 << 20, 1_000.0f64..10_000_000.0), 0..60)
    }

    proptest! {
        #[test]
        fn noiseless_line_is_recovered(
            a in 0.0f64..1e6,
            b in -50.0f64..50.0,
            xs in prop::collection::vec(512u64..=1 << 20, 2..80),
        ) {
            prop_assume!(xs.iter().any(|&x| x != xs[0]));
            let mut f = OnlineFit::new();
            for &x in &xs {
                f.push(x as f64, a + b * x as f64);
            }
            let (ah, bh) = f.line().unwrap();
            let scale = a.abs() + b.abs() * (1u64 << 20) as f64 + 1.0;
            prop_assert!((ah - a).abs() <= 1e-7 * scale, "a {} vs {}", ah, a);
            prop_assert!((bh - b).abs() <= 1e-9 * (b.abs() + 1.0), "b {} vs {}", bh, b);
            if b.abs() > 1e-6 {
                let r = f.pearson_r().unwrap();
                prop_assert!((r.abs() - 1.0).abs() < 1e-9);
                prop_assert_eq!(r.signum(), b.signum());
            }
        }

        #[test]
        fn r_is_in_range_and_matches_two_pass(
            pts in prop::collection::vec((-1e6f64..1e6, -1e6f64..1e6), 0..100),
        ) {
            let mut f = OnlineFit::new();
            for &(x, y) in &pts {
                f.push(x, y);
            }
            if let Some(r) = f.pearson_r() {
                prop_assert!((-1.0..=1.0).contains(&r));
                let xs: Vec<f64> = pts.iter().map(|p| p.0).collect();
                let ys: Vec<f64> = pts.iter().map(|p| p.1).collect();
                let r2 = two_pass_r(&xs, &ys);
                prop_assert!((r - r2).abs() < 1e-6, "{} vs {}", r, r2);
            }
        }

        /// A censored observation never moves the planned wake-up later (no ratchet), never
        /// changes the fit, and backs the margin off (it never shrinks).
        #[test]
        fn censoring_never_delays_wakeup(
            samples in arb_samples(),
            late in prop::collection::vec(any::<bool>(), 0..60),
            size in 512u64..=1 << 20,
            upper in 0.0f64..1e9,
            query in 512u64..=1 << 20,
        ) {
            let mut p = CompletionPredictor::new(PredictorConfig { min_exact: 1, ..Default::default() });
            for (i, &(s, l)) in samples.iter().enumerate() {
                let obs = if late.get(i).copied().unwrap_or(false) {
                    Observation::Censored { upper_bound_ns: l }
                } else {
                    Observation::Exact { latency_ns: l }
                };
                p.observe(OpKind::Read, s, obs);
            }
            let before_delay = p.wake_delay_ns(OpKind::Read, query);
            let before_fit = p.fit(OpKind::Read).clone();
            let before_margin = p.margin_ns(OpKind::Read);
            p.observe(OpKind::Read, size, Observation::Censored { upper_bound_ns: upper });
            prop_assert_eq!(p.fit(OpKind::Read), &before_fit);
            prop_assert!(p.margin_ns(OpKind::Read) >= before_margin);
            match (before_delay, p.wake_delay_ns(OpKind::Read, query)) {
                (Some(b), Some(a)) => prop_assert!(a <= b, "wake moved later: {} -> {}", b, a),
                (None, None) => {}
                (b, a) => prop_assert!(false, "availability changed: {:?} -> {:?}", b, a),
            }
        }
    }
}
