//! A demo's `auto` choice read back from the JSON `preheat demo --out FILE` wrote, so a server
//! run later (`preheat run --auto-choice FILE`) announces what the demo measured to help.

use std::path::Path;

use anyhow::{bail, Context, Result};
use preheat_model::proto::Strategies;

/// What a demo chose for `auto`, and where it was measured.
#[derive(Debug, Clone, PartialEq)]
pub struct SavedChoice {
    pub strategies: Strategies,
    /// The demo's server (its catalog name or command line).
    pub server: String,
    /// The announcement lead the pilot ran at, µs.
    pub lead_us: u64,
    /// The machine line of the demo ("2 CPUs, cpuidle haltpoll", …).
    pub machine: String,
    /// Why the demo chose it.
    pub why: String,
}

impl SavedChoice {
    /// One line for the user: what `auto` does and where that was measured.
    pub fn describe(&self) -> String {
        format!(
            "{} (measured by the demo of {} at a {} µs lead on {}: {})",
            self.strategies.name(),
            self.server,
            self.lead_us,
            self.machine,
            self.why
        )
    }
}

/// Read the `auto` choice of the demo output at `path`.
pub fn read_saved_choice(path: &Path) -> Result<SavedChoice> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_saved_choice(&text).with_context(|| format!("{}", path.display()))
}

/// [`read_saved_choice`] on the text of the file.
pub fn parse_saved_choice(text: &str) -> Result<SavedChoice> {
    let v: serde_json::Value = serde_json::from_str(text)
        .context("not the JSON of `preheat demo --out FILE` (it does not parse as JSON)")?;
    let auto = &v["auto"];
    if auto.is_null() {
        bail!(
            "the demo that wrote this did not run `auto` (run `preheat demo` with `auto` among \
             --strategies, the default, and --out FILE)"
        );
    }
    let Some(chosen) = auto["chosen"].as_str() else {
        bail!("its `auto.chosen` is missing or not a string");
    };
    let strategies = Strategies::parse(chosen)
        .map_err(|e| anyhow::anyhow!("its `auto.chosen` ({chosen:?}): {e}"))?;
    if strategies.contains(Strategies::AUTO) {
        bail!("its `auto.chosen` is itself `auto`");
    }
    let text_of = |k: &str| v[k].as_str().unwrap_or("?").to_string();
    Ok(SavedChoice {
        strategies,
        server: text_of("server"),
        lead_us: v["lead_us"].as_u64().unwrap_or(0),
        machine: text_of("machine"),
        why: auto["why"].as_str().unwrap_or("").to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_choice_and_refuses_what_is_not_one() {
        let ok = r#"{"server":"kv","lead_us":200,"machine":"2 CPUs, cpuidle haltpoll",
            "auto":{"chosen":"wake+lines+replay","why":"largest gain","candidates":[]}}"#;
        let c = parse_saved_choice(ok).unwrap();
        assert_eq!(c.strategies, Strategies::ALL);
        assert_eq!(c.lead_us, 200);
        assert!(
            c.describe().contains("kv at a 200 µs lead"),
            "{}",
            c.describe()
        );
        let none = ok.replace("wake+lines+replay", "none");
        assert_eq!(
            parse_saved_choice(&none).unwrap().strategies,
            Strategies::NONE
        );
        for bad in [
            "not json",
            r#"{"server":"kv"}"#,
            r#"{"auto":{"chosen":3}}"#,
            r#"{"auto":{"chosen":"warp"}}"#,
            r#"{"auto":{"chosen":"auto"}}"#,
        ] {
            assert!(parse_saved_choice(bad).is_err(), "{bad}");
        }
    }
}
