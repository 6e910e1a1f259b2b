//! Modeled energy from idle-state residency. **Nothing here is measured**: our machines have no
//! RAPL/powercap, MSR or APERF/MPERF (see `../shared/notes/measured-here.md`, Energy). Every
//! value in an [`EnergyReport`] is labeled `modeled`.
//!
//! # The model
//!
//! A [`PowerProfile`] gives the package power as a function of the number `k` of *active* CPUs
//! (Zhu et al. §3, Fig. 3A, "disproportionate multicore power"):
//!
//! ```text
//! P(k) = package_idle_w                                   k = 0
//! P(k) = package_idle_w + first_active_w + (k−1)·additional_active_w   k ≥ 1
//! ```
//!
//! plus, per CPU, `idle_extra_w` for each idle state it sits in (a shallow state may keep more of
//! the core powered than the deepest one; the default profile sets 0 everywhere).
//!
//! A CPU is *active* while it is not in an idle state, and also while it is in a state the
//! profile marks `active` (by default `POLL`: the idle task spinning, which burns as much as
//! work). Its active share over the interval, `b_i = busy_i / wall`, comes from
//! [`crate::residency`].
//!
//! # Co-activity (the assumption)
//!
//! Residency counters give each CPU's *total* active time, not *when* it was active, so the
//! distribution of `k` over time is unknown. With `A = P(k ≥ 1)` (share of time at least one
//! CPU is active) and `E[k] = Σ b_i`, the average power is exactly
//!
//! ```text
//! P̄ = package_idle_w + A·first_active_w + (E[k] − A)·additional_active_w + Σ_i Σ_s r_is·idle_extra_w(s)
//! ```
//!
//! (`r_is`: share of the interval CPU `i` spent in idle state `s`), so only `A` needs an
//! assumption:
//!
//! * **estimate — independent**: CPUs are active independently of each other,
//!   `A = 1 − Π(1 − b_i)`;
//! * **lower bound — maximal overlap**: active periods nest (all CPUs wake and sleep together as
//!   far as their shares allow), `A = max b_i`. This is what perfect sleep shaping achieves;
//! * **upper bound — minimal overlap**: active periods are spread out so that as few CPUs as
//!   possible are active at once, `A = min(1, Σ b_i)`.
//!
//! Since `first_active_w ≥ additional_active_w` in every sensible profile, larger `A` means more
//! energy, so the two extremes bound the true modeled energy for any interleaving. Energy is
//! `P̄ · wall`.
//!
//! # The default profile and its sources
//!
//! * `first_active_w = 37`, `additional_active_w = 8`: Zhu et al. §3, Fig. 3A, Intel E5-2620 v3
//!   (Haswell, dual socket, 24 hardware threads), package + DRAM power from the RAPL MSRs:
//!   "activating the first CPU consumes 37 Watts of power beyond idling while activating each
//!   additional CPU consumes 8 Watts or less" (so 8 W is the paper's upper figure).
//! * `package_idle_w = 5`: **assumption**. The paper plots power *beyond idling* and gives no
//!   absolute idle figure; 5 W for the package (+DRAM) with every CPU in deep idle (package C6)
//!   is our placeholder. It only shifts every result by `5 W · wall`; differences between runs
//!   of equal length do not depend on it.
//! * per-state `idle_extra_w = 0` for every hardware idle state: **assumption** (the paper gives
//!   no per-C-state figures). `POLL` is active. `C1`/`C1E` (also the `-HSW` names older
//!   `intel_idle` uses) are idle but not *deep*; every other non-POLL state — including the
//!   guest's `haltpoll idle` (cpuidle-haltpoll's halt, the deepest state a KVM guest can ask
//!   for; what the host does underneath is invisible) — is deep idle.
//!
//! Profiles are plain JSON ([`PowerProfile::to_json`], [`PowerProfile::load`]); `preheat power
//! profile` prints the default as a starting point.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::residency::{CounterKind, ResidencyDiff, NO_CPUIDLE_REASON};
use crate::{Label, Quantity};

/// The `format` string of profile files this version reads and writes.
pub const PROFILE_FORMAT: &str = "preheat-power-profile/1";

/// How one idle state is accounted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatePower {
    /// The cpuidle state name (`cpuidle/stateK/name`), matched exactly.
    pub name: String,
    /// True if the CPU counts as active (busy) while in this state (e.g. `POLL`).
    pub active: bool,
    /// Extra power of one CPU in this idle state above the package idle power, W (ignored for
    /// active states).
    pub idle_extra_w: f64,
    /// True if the state counts as *deep* idle in "deep-idle share" figures.
    pub deep: bool,
}

/// How states not listed in [`PowerProfile::states`] are accounted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnlistedState {
    pub active: bool,
    pub idle_extra_w: f64,
    pub deep: bool,
}

/// A per-state power profile. See the module documentation for the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PowerProfile {
    /// Must be [`PROFILE_FORMAT`].
    pub format: String,
    pub name: String,
    /// Where the figures come from.
    pub source: String,
    /// Package power with every CPU idle, W.
    pub package_idle_w: f64,
    /// Where `package_idle_w` comes from, or that it is an assumption.
    pub package_idle_source: String,
    /// Extra power when the first CPU becomes active, W.
    pub first_active_w: f64,
    /// Extra power for each further active CPU, W.
    pub additional_active_w: f64,
    pub states: Vec<StatePower>,
    pub unlisted_state: UnlistedState,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("reading power profile {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("power profile {path}: {source}")]
    Json {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("power profile {path}: {problem}")]
    Invalid { path: String, problem: String },
}

impl Default for PowerProfile {
    fn default() -> Self {
        PowerProfile::haswell()
    }
}

impl PowerProfile {
    /// The default profile: Zhu et al.'s Haswell E5-2620 v3 figures (see the module docs).
    pub fn haswell() -> PowerProfile {
        let shallow = |name: &str| StatePower {
            name: name.into(),
            active: false,
            idle_extra_w: 0.0,
            deep: false,
        };
        PowerProfile {
            format: PROFILE_FORMAT.into(),
            name: "haswell-e5-2620v3".into(),
            source: "Zhu et al., Software Engagement with Sleeping CPUs, §3 Fig. 3A: Intel E5-2620 \
                     v3, package+DRAM power from RAPL MSRs; first active CPU 37 W beyond idle, each \
                     further CPU 8 W or less"
                .into(),
            package_idle_w: 5.0,
            package_idle_source: "assumption: the paper reports power beyond idling only; 5 W with \
                                  every CPU in deep idle is a placeholder (shifts all results by \
                                  5 W x wall)"
                .into(),
            first_active_w: 37.0,
            additional_active_w: 8.0,
            states: vec![
                StatePower {
                    name: "POLL".into(),
                    active: true,
                    idle_extra_w: 0.0,
                    deep: false,
                },
                shallow("C1"),
                shallow("C1E"),
                shallow("C1-HSW"),
                shallow("C1E-HSW"),
            ],
            unlisted_state: UnlistedState {
                active: false,
                idle_extra_w: 0.0,
                deep: true,
            },
        }
    }

    /// Check that the numbers are finite and non-negative, names unique, format known.
    pub fn validate(&self) -> Result<(), String> {
        if self.format != PROFILE_FORMAT {
            return Err(format!(
                "format {:?}, expected {PROFILE_FORMAT:?}",
                self.format
            ));
        }
        let check = |what: &str, v: f64| -> Result<(), String> {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(format!("{what} = {v}: must be finite and >= 0"))
            }
        };
        check("package_idle_w", self.package_idle_w)?;
        check("first_active_w", self.first_active_w)?;
        check("additional_active_w", self.additional_active_w)?;
        check(
            "unlisted_state.idle_extra_w",
            self.unlisted_state.idle_extra_w,
        )?;
        for (i, s) in self.states.iter().enumerate() {
            check(
                &format!("states[{i}] ({}).idle_extra_w", s.name),
                s.idle_extra_w,
            )?;
            if self.states[..i].iter().any(|o| o.name == s.name) {
                return Err(format!("state {:?} listed twice", s.name));
            }
        }
        Ok(())
    }

    pub fn from_json(text: &str) -> Result<PowerProfile, ProfileError> {
        PowerProfile::from_json_named(text, "<string>")
    }

    fn from_json_named(text: &str, path: &str) -> Result<PowerProfile, ProfileError> {
        let p: PowerProfile = serde_json::from_str(text).map_err(|source| ProfileError::Json {
            path: path.into(),
            source,
        })?;
        p.validate().map_err(|problem| ProfileError::Invalid {
            path: path.into(),
            problem,
        })?;
        Ok(p)
    }

    /// Load and validate a profile from a JSON file.
    pub fn load(path: &Path) -> Result<PowerProfile, ProfileError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Io {
            path: name.clone(),
            source,
        })?;
        PowerProfile::from_json_named(&text, &name)
    }

    /// Pretty JSON; [`PowerProfile::from_json`] reads it back unchanged.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a profile always serialises")
    }

    fn class(&self, name: &str) -> (bool, f64, bool) {
        match self.states.iter().find(|s| s.name == name) {
            Some(s) => (s.active, s.idle_extra_w, s.deep),
            None => (
                self.unlisted_state.active,
                self.unlisted_state.idle_extra_w,
                self.unlisted_state.deep,
            ),
        }
    }

    /// True if a CPU in state `name` counts as active.
    pub fn is_active(&self, name: &str) -> bool {
        self.class(name).0
    }

    /// True if state `name` counts as deep idle.
    pub fn is_deep(&self, name: &str) -> bool {
        let (active, _, deep) = self.class(name);
        !active && deep
    }

    /// Modeled energy and average power over the interval of `diff`. Declines, with the reason,
    /// where the counters have no per-state time (no cpuidle driver): the profile prices idle
    /// states one by one, and an undivided idle time would price every sleep as the profile's
    /// unlisted state, a number that looks modeled from data but is not.
    pub fn model(&self, diff: &ResidencyDiff) -> Result<EnergyReport, String> {
        if diff.kind != CounterKind::Cpuidle {
            return Err(format!("modeled energy unavailable: {NO_CPUIDLE_REASON}"));
        }
        let wall_s = diff.wall_us as f64 / 1e6;
        let busy = diff.busy(|name| !self.is_active(name));
        let shares: Vec<f64> = busy.iter().map(|b| b.share).collect();
        let mean_active: f64 = shares.iter().sum();
        let any_independent = 1.0 - shares.iter().map(|b| 1.0 - b).product::<f64>();
        let any_max_overlap = shares.iter().copied().fold(0.0, f64::max);
        let any_min_overlap = mean_active.min(1.0);

        // Σ_i Σ_s time_is · idle_extra_w(s), J.
        let idle_extra_j: f64 = diff
            .cpus
            .iter()
            .flat_map(|c| c.states.iter())
            .map(|s| {
                let (active, extra, _) = self.class(&s.name);
                if active {
                    0.0
                } else {
                    s.time_us as f64 / 1e6 * extra
                }
            })
            .sum();
        let idle_extra_w = if wall_s > 0.0 {
            idle_extra_j / wall_s
        } else {
            0.0
        };

        let power = |any: f64| {
            self.package_idle_w
                + any * self.first_active_w
                + (mean_active - any).max(0.0) * self.additional_active_w
                + idle_extra_w
        };
        let w = |a: f64| Quantity::modeled(a, "W");
        let j = |a: f64| Quantity::modeled(a * wall_s, "J");
        let share = |a: f64| Quantity::modeled(a, "share");
        let (pi, plo, phi) = (
            power(any_independent),
            power(any_max_overlap),
            power(any_min_overlap),
        );
        Ok(EnergyReport {
            label: Label::Modeled,
            profile: self.name.clone(),
            assumption: "co-activity of CPUs estimated as independent (per-CPU residency has no \
                         timestamps); max_overlap (all CPUs active together) and min_overlap \
                         (active periods spread out) bound it"
                .into(),
            interval: Quantity::modeled(wall_s, "s"),
            cpus: diff.cpus.len(),
            active_share: busy
                .iter()
                .map(|b| CpuShare {
                    cpu: b.cpu,
                    share: share(b.share),
                    clamped: b.clamped,
                })
                .collect(),
            mean_active_cpus: Quantity::modeled(mean_active, "CPUs"),
            any_active_share: Bounds {
                independent: share(any_independent),
                max_overlap: share(any_max_overlap),
                min_overlap: share(any_min_overlap),
            },
            idle_state_power: w(idle_extra_w),
            average_power: Bounds {
                independent: w(pi),
                max_overlap: w(plo),
                min_overlap: w(phi),
            },
            energy: Bounds {
                independent: j(pi),
                max_overlap: j(plo),
                min_overlap: j(phi),
            },
        })
    }
}

/// One modeled quantity under the three co-activity assumptions. For energy and power,
/// `max_overlap` is the lower bound and `min_overlap` the upper bound.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bounds {
    /// The estimate: CPUs active independently of each other.
    pub independent: Quantity,
    /// All CPUs active together as far as their shares allow (lower energy bound).
    pub max_overlap: Quantity,
    /// Active periods spread out as far as possible (upper energy bound).
    pub min_overlap: Quantity,
}

impl Bounds {
    /// Every value divided by `n` with a new unit (e.g. J → J/request). `n = 0` gives NaN-free
    /// zeros.
    pub fn per(&self, n: f64, unit: &str) -> Bounds {
        let d =
            |q: &Quantity| Quantity::new(if n > 0.0 { q.value / n } else { 0.0 }, unit, q.label);
        Bounds {
            independent: d(&self.independent),
            max_overlap: d(&self.max_overlap),
            min_overlap: d(&self.min_overlap),
        }
    }
}

/// Active share of one CPU, as the model uses it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CpuShare {
    pub cpu: u32,
    pub share: Quantity,
    /// The idle counters exceeded the wall time (see [`crate::residency`] caveats).
    pub clamped: bool,
}

/// Modeled energy for one interval. Every value is labeled `modeled`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EnergyReport {
    pub label: Label,
    pub profile: String,
    pub assumption: String,
    pub interval: Quantity,
    pub cpus: usize,
    pub active_share: Vec<CpuShare>,
    /// `E[k] = Σ b_i`.
    pub mean_active_cpus: Quantity,
    /// `A = P(k ≥ 1)` under each assumption.
    pub any_active_share: Bounds,
    /// Average power added by the per-state `idle_extra_w` terms (included in `average_power`).
    pub idle_state_power: Quantity,
    pub average_power: Bounds,
    pub energy: Bounds,
}
