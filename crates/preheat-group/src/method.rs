//! Which rule chooses the sets from the dependency tree: the paper's split rule (the default)
//! or the cut with the highest modularity ([`crate::modularity`]); [`crate::group_with`] groups
//! with either.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How the sets are chosen from the tree. Both walk the same tree (eq. 1, average linkage);
/// they differ in where they cut it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize)]
pub enum GroupMethod {
    /// Busse et al. §3: split a node when a child's d is more than t times its own
    /// ([`crate::split`]). The default.
    #[default]
    #[serde(rename = "paper")]
    PaperSplit,
    /// The cut of the tree whose sets have the highest modularity Q; no threshold
    /// ([`crate::modularity`]).
    #[serde(rename = "modularity")]
    Modularity,
}

impl GroupMethod {
    /// Both methods, the default first.
    pub const ALL: [GroupMethod; 2] = [GroupMethod::PaperSplit, GroupMethod::Modularity];

    /// The name on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            GroupMethod::PaperSplit => "paper",
            GroupMethod::Modularity => "modularity",
        }
    }
}

impl fmt::Display for GroupMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for GroupMethod {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GroupMethod::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown grouping method {s:?} (paper or modularity)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for m in GroupMethod::ALL {
            assert_eq!(m.name().parse::<GroupMethod>(), Ok(m));
            let json = serde_json::to_string(&m).unwrap();
            assert_eq!(json, format!("\"{m}\""));
            assert_eq!(serde_json::from_str::<GroupMethod>(&json).unwrap(), m);
        }
        assert_eq!(GroupMethod::default(), GroupMethod::PaperSplit);
        assert!("louvain".parse::<GroupMethod>().is_err());
    }
}
