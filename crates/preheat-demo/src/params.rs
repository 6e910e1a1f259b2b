//! What a demo run is asked for: the server, the modes and strategies, the measurement's sizes.
//! Plain data; the CLI's `DemoArgs` fills it from the command line (same defaults).

use std::path::PathBuf;

use preheat_launch::servers::ServerKind;

use crate::custom::CustomProtocol;

/// A demo run's parameters. [`Default`] gives the CLI's defaults.
#[derive(Debug, Clone)]
pub struct DemoParams {
    /// The catalog server to run on (default kv); ignored when `command` is given.
    pub server: ServerKind,
    /// Any server: the port it listens on (it must listen there itself).
    pub port: Option<u16>,
    /// Any server: its protocol (default HTTP).
    pub protocol: CustomProtocol,
    /// Any server: the request to measure — an HTTP path, a memcached or redis key, or raw
    /// request bytes (\r \n escapes) with the raw protocol.
    pub request: Option<String>,
    /// Any server, raw protocol: the bytes its reply ends with (\r \n escapes; default `\r\n`).
    pub until: String,
    /// Any server: its command line, started pinned to the server CPU with the agent attached
    /// (empty: the catalog server `server`).
    pub command: Vec<String>,
    /// Rounds, each measuring every mode once in shuffled order (default 150).
    pub rounds: usize,
    /// Announcement lead time, µs (default 65: Fastpass schedules ~65 µs ahead).
    pub lead_us: u64,
    /// Idle gap before a cold-idle request, ms (default 20).
    pub idle_ms: u64,
    /// Eviction sweep size, MiB (default 128).
    pub sweep_mib: usize,
    /// Gap after the sweep before the request, µs (default 1000).
    pub post_gap_us: u64,
    /// Preheat strategies to compare, comma separated, each may combine with `+`; `auto` is
    /// chosen by a pilot (default `auto,wake,lines,replay,wake+lines,all`).
    pub strategies: String,
    /// Rounds of `auto`'s pilot (default 15).
    pub pilot_rounds: usize,
    /// Use this working-set file instead of recording one.
    pub profile: Option<PathBuf>,
    /// Samples for the recording (default 8, as the paper).
    pub samples: u32,
    /// Keep lines seen in at least this many samples (default 6).
    pub keep: u32,
    /// Merge runs separated by at most this many unused lines when encoding (default 0).
    pub gap_merge: u32,
    /// Append every sample as one JSON line to this file as it is measured.
    pub records: Option<PathBuf>,
    /// Where the caller writes all results as JSON when the run ends (checked before it
    /// starts: minutes of rounds are not lost to a path that cannot be written).
    pub out: Option<PathBuf>,
    /// Server CPU (default: the last CPU); the client uses another one.
    pub server_cpu: Option<usize>,
    /// Run the server in a network namespace of its own, reached over a veth pair, instead of
    /// on the loopback (root and iproute2; [`preheat_engine::netns`]).
    pub netns: bool,
    /// Where the loopback's receive processing runs: measured (default), steered to the server's
    /// CPU, or left on the sender's ([`crate::SteerRx`]).
    pub steer_rx: crate::SteerRx,
    /// Keep the agents' logs in the run directory after a demo that ended well (a failed one
    /// always keeps them).
    pub keep_agent_logs: bool,
    /// Split every response time at the server's system calls with the outside observer
    /// attached (root; the `sysstages` module).
    pub syscall_stages: bool,
    /// Add the `conn-primed` row (`connection.rs`): a diagnostic of what `auto` leaves above
    /// the floor.
    pub connection_row: bool,
    /// Where the agent runs: inside the server where it loads, else outside (default).
    pub agent: AgentPlace,
}

/// Where the demo's agent runs (`--agent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentPlace {
    /// Inside the server (`LD_PRELOAD`) wherever the pre-flight says it loads; outside a server
    /// given by its command that it cannot enter (a static binary, a Go program).
    Auto,
    /// Inside only: a server the agent cannot enter is refused.
    Inside,
    /// Outside, even where it could load (to compare the two on one server).
    Outside,
}

impl AgentPlace {
    /// `inside` or `outside`; anything else is [`AgentPlace::Auto`] (the CLI offers only the
    /// three names).
    pub fn parse(s: &str) -> AgentPlace {
        match s {
            "inside" => AgentPlace::Inside,
            "outside" => AgentPlace::Outside,
            _ => AgentPlace::Auto,
        }
    }
}

/// The longest lead a demo accepts, µs (10 s: every round waits it once per mode).
pub const MAX_LEAD_US: u64 = 10_000_000;

impl DemoParams {
    /// Refuse sizes that cannot make a measurement, before anything starts: no rounds (the
    /// table had only zeros), no pilot rounds, no lead or one of hours.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.rounds == 0 {
            anyhow::bail!("--rounds 0: the table needs at least one round of every mode");
        }
        if self.pilot_rounds == 0 {
            anyhow::bail!("--pilot-rounds 0: `auto`'s pilot needs at least one round");
        }
        for (flag, p) in [("--out", &self.out), ("--records", &self.records)] {
            if let Some(p) = p {
                preheat_engine::host::check_writable(p).map_err(|e| {
                    anyhow::anyhow!("{flag} {}: cannot be written: {e}", p.display())
                })?;
            }
        }
        if !(1..=MAX_LEAD_US).contains(&self.lead_us) {
            anyhow::bail!(
                "--lead-us {}: the lead must be 1 to {MAX_LEAD_US} µs (announced that far ahead; \
                 every round waits it once per mode)",
                self.lead_us
            );
        }
        Ok(())
    }
}

impl Default for DemoParams {
    fn default() -> DemoParams {
        DemoParams {
            server: ServerKind::Kv,
            port: None,
            protocol: CustomProtocol::Http,
            request: None,
            until: "\\r\\n".into(),
            command: Vec::new(),
            rounds: 150,
            lead_us: 65,
            idle_ms: 20,
            sweep_mib: 128,
            post_gap_us: 1000,
            strategies: "auto,wake,lines,replay,wake+lines,all".into(),
            pilot_rounds: 15,
            profile: None,
            samples: 8,
            keep: 6,
            gap_merge: 0,
            records: None,
            out: None,
            server_cpu: None,
            netns: false,
            steer_rx: crate::SteerRx::Auto,
            keep_agent_logs: false,
            syscall_stages: false,
            connection_row: false,
            agent: AgentPlace::Auto,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_that_measure_nothing_are_refused() {
        assert!(DemoParams::default().check().is_ok());
        let with = |f: fn(&mut DemoParams)| {
            let mut p = DemoParams::default();
            f(&mut p);
            p.check().unwrap_err().to_string()
        };
        assert!(with(|p| p.rounds = 0).contains("--rounds 0"));
        assert!(with(|p| p.pilot_rounds = 0).contains("--pilot-rounds 0"));
        assert!(with(|p| p.lead_us = 0).contains("--lead-us 0"));
        assert!(with(|p| p.lead_us = 99_999_999_999).contains("1 to 10000000"));
        assert!(
            with(|p| p.out = Some(PathBuf::from("/nonexistent/dir/x.json")))
                .starts_with("--out /nonexistent/dir/x.json: cannot be written")
        );
        let longest = DemoParams {
            lead_us: MAX_LEAD_US,
            ..Default::default()
        };
        assert!(longest.check().is_ok());
    }
}
