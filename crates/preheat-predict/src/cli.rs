//! `preheat io …` command-line interface (the binary wires [`IoArgs`] in as a subcommand and
//! calls [`run`]).

use std::str::FromStr;

use anyhow::Result;
use clap::{Args, Subcommand};

use crate::anticipatory_read::{Feedback, Policy, ServiceModel};
use crate::bench::{print_bench, run_bench, BenchConfig, DeviceSpec};
use crate::kernels::{print_kernels, run_kernels, KernelsConfig, PredictorChoice, WaitMode};
use crate::linear::{MarginConfig, PredictorConfig};

/// Anticipatory CPU wakeup for fast devices (Zhu et al., §2): SSD reads and accelerator kernels.
#[derive(Args, Debug)]
pub struct IoArgs {
    #[command(subcommand)]
    pub cmd: IoCmd,
}

#[derive(Subcommand, Debug)]
pub enum IoCmd {
    /// Repeated random reads with idle gaps: latency and requester CPU per waiting policy.
    #[command(
        long_about = "Repeated random synchronous reads with an idle gap before each \
(paper Figure 1), waited for by each policy: default (block until completion), awake (spin for \
the whole I/O), anticipatory (block until the predicted completion minus a margin, then spin). \
Prints per policy and gap: p50/p99 latency with 95% CIs, requester awake and CPU time per \
request, Pearson r of completion time vs size, censored share, sample counts. Numbers from \
file:PATH (O_DIRECT) are measured; numbers from the emulated SSD are emulated.\n\nExamples:\n  \
preheat io bench --device emulated\n  preheat io bench --device file:/var/tmp --requests 1000 --json"
    )]
    Bench(BenchArgs),
    /// Iterative K-means with kernels on a worker thread: interrupt vs busy vs anticipatory.
    Kernels(KernelsArgs),
}

/// CPU placement: `auto` (see [`PinSpec::resolve`]), `none`, or `REQ,HELPER`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinSpec {
    Auto,
    None,
    Cpus(usize, usize),
}

impl FromStr for PinSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(PinSpec::Auto),
            "none" => Ok(PinSpec::None),
            _ => {
                let (a, b) = s
                    .split_once(',')
                    .ok_or_else(|| format!("--pin: auto, none or REQ,HELPER (got {s:?})"))?;
                let p = |x: &str| x.trim().parse::<usize>().map_err(|e| format!("--pin: {e}"));
                Ok(PinSpec::Cpus(p(a)?, p(b)?))
            }
        }
    }
}

impl PinSpec {
    /// (requester/control CPU, helper/worker CPU). `auto` with two or more allowed CPUs puts the
    /// requester on the second one and the helper on the same CPU when `colocate` (the helper
    /// stands in for the requester's own blocked `read`, so the CPU the completion wakes is the
    /// requester's), else on the first (the helper is the device or accelerator).
    pub fn resolve(self, colocate: bool) -> (Option<usize>, Option<usize>) {
        match self {
            PinSpec::None => (None, None),
            PinSpec::Cpus(a, b) => (Some(a), Some(b)),
            PinSpec::Auto => {
                let cpus = preheat_engine::os::get_affinity();
                if cpus.len() >= 2 {
                    (
                        Some(cpus[1]),
                        Some(if colocate { cpus[1] } else { cpus[0] }),
                    )
                } else {
                    (None, None)
                }
            }
        }
    }
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// `file:PATH` (a file, created with --file-mib of random data if missing; a directory
    /// means DIR/preheat-io-bench.dat) or `emulated`.
    #[arg(long, default_value = "emulated")]
    pub device: DeviceSpec,
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "default,awake,anticipatory"
    )]
    pub policy: Vec<Policy>,
    /// Idle gaps before each read, µs.
    #[arg(
        long = "gap-us",
        value_delimiter = ',',
        default_value = "0,100,1000,10000"
    )]
    pub gap_us: Vec<u64>,
    /// Read sizes, KiB (multiples of 4), drawn uniformly per request.
    #[arg(long, value_delimiter = ',', default_value = "4,16,64")]
    pub sizes: Vec<u32>,
    /// Recorded requests per policy and gap.
    #[arg(long, default_value_t = 500)]
    pub requests: usize,
    /// Unrecorded warm-up requests per policy and gap (they train the model).
    #[arg(long, default_value_t = 64)]
    pub warmup: usize,
    /// Size of the test file created when missing, MiB.
    #[arg(long, default_value_t = 256)]
    pub file_mib: u64,
    /// CPU placement: auto, none, or REQ,HELPER. auto: requester on the second allowed CPU;
    /// the helper on the same CPU for file: (it stands in for the requester's own blocked read),
    /// on the first CPU for the emulated device (it is the device).
    #[arg(long, default_value = "auto")]
    pub pin: PinSpec,
    /// What feeds the online model: requester (exact only when it was spinning; censored
    /// otherwise) or device (helper completion timestamps).
    #[arg(long, value_enum, default_value = "requester")]
    pub feedback: Feedback,
    /// Residual quantile of the wake-up point.
    #[arg(long, default_value_t = 0.05)]
    pub wake_quantile: f64,
    /// Initial early-wake margin, µs.
    #[arg(long, default_value_t = 30.0)]
    pub margin_us: f64,
    /// Share of late wake-ups the margin controller settles at.
    #[arg(long, default_value_t = 0.05)]
    pub target_censored: f64,
    /// A planned wake-up that left less than this much spinning counts as late, µs.
    #[arg(long, default_value_t = 10.0)]
    pub min_spin_us: f64,
    /// Emulated SSD: base service time, µs.
    #[arg(long, default_value_t = 60.0)]
    pub emu_base_us: f64,
    /// Emulated SSD: service time per KiB, µs.
    #[arg(long, default_value_t = 1.0)]
    pub emu_per_kib_us: f64,
    /// Emulated SSD: lognormal jitter σ (multiplicative, mean-preserving).
    #[arg(long, default_value_t = 0.1)]
    pub emu_sigma: f64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct KernelsArgs {
    /// Kernel launches per mode.
    #[arg(long, default_value_t = 300)]
    pub iterations: usize,
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "interrupt,busy,anticipatory"
    )]
    pub mode: Vec<WaitMode>,
    /// Synthetic points (10240 × 16 × 8 gives ~0.5 ms kernels here, like the paper's 540 µs).
    #[arg(long, default_value_t = 10240)]
    pub points: usize,
    #[arg(long, default_value_t = 16)]
    pub k: usize,
    #[arg(long, default_value_t = 8)]
    pub dims: usize,
    /// Iterations per interleaved block.
    #[arg(long, default_value_t = 10)]
    pub block: usize,
    /// History statistic that drives the anticipatory wait.
    #[arg(long, value_enum, default_value = "median")]
    pub predictor: PredictorChoice,
    /// Accuracy band: share of predictions within ±this fraction.
    #[arg(long, default_value_t = 0.10)]
    pub tolerance: f64,
    /// Initial early-wake margin, µs.
    #[arg(long, default_value_t = 30.0)]
    pub margin_us: f64,
    /// A planned wake-up that left less than this much polling counts as late, µs.
    #[arg(long, default_value_t = 10.0)]
    pub min_spin_us: f64,
    /// CPU placement: auto, none, or CONTROL,WORKER.
    #[arg(long, default_value = "auto")]
    pub pin: PinSpec,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long)]
    pub json: bool,
}

impl BenchArgs {
    pub fn to_config(&self) -> BenchConfig {
        let file = matches!(self.device, DeviceSpec::File(_));
        let (requester_cpu, helper_cpu) = self.pin.resolve(file);
        BenchConfig {
            device: self.device.clone(),
            model: ServiceModel {
                base_ns: self.emu_base_us * 1e3,
                per_kib_ns: self.emu_per_kib_us * 1e3,
                sigma: self.emu_sigma,
            },
            policies: self.policy.clone(),
            gaps_us: self.gap_us.clone(),
            sizes_kib: self.sizes.clone(),
            requests: self.requests,
            warmup: self.warmup,
            seed: self.seed,
            file_mib: self.file_mib,
            requester_cpu,
            helper_cpu,
            feedback: self.feedback,
            min_spin_ns: (self.min_spin_us * 1e3) as u64,
            predictor: PredictorConfig {
                wake_quantile: self.wake_quantile,
                margin: MarginConfig {
                    initial_ns: self.margin_us * 1e3,
                    target_censored: self.target_censored,
                    ..MarginConfig::default()
                },
                ..PredictorConfig::default()
            },
        }
    }
}

impl KernelsArgs {
    pub fn to_config(&self) -> KernelsConfig {
        let (control_cpu, worker_cpu) = self.pin.resolve(false);
        KernelsConfig {
            iterations: self.iterations,
            points: self.points,
            k: self.k,
            dims: self.dims,
            block: self.block,
            modes: self.mode.clone(),
            predictor: self.predictor,
            tolerance: self.tolerance,
            seed: self.seed,
            control_cpu,
            worker_cpu,
            margin: MarginConfig {
                initial_ns: self.margin_us * 1e3,
                ..MarginConfig::default()
            },
            min_spin_ns: (self.min_spin_us * 1e3) as u64,
            ..KernelsConfig::default()
        }
    }
}

/// Run `preheat io …`.
pub fn run(args: IoArgs) -> Result<()> {
    match args.cmd {
        IoCmd::Bench(b) => {
            let report = run_bench(&b.to_config())?;
            if b.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print_bench(&report);
            }
        }
        IoCmd::Kernels(k) => {
            let report = run_kernels(&k.to_config())?;
            if k.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print_kernels(&report);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Top {
        #[command(subcommand)]
        cmd: TopCmd,
    }
    #[derive(clap::Subcommand)]
    enum TopCmd {
        Io(IoArgs),
    }

    #[test]
    fn parses_the_documented_command_lines() {
        let t = Top::try_parse_from([
            "preheat",
            "io",
            "bench",
            "--device",
            "file:/tmp/x",
            "--policy",
            "default,awake,anticipatory",
            "--gap-us",
            "0,100,1000,10000",
            "--sizes",
            "4,16,64",
            "--requests",
            "7",
            "--json",
        ])
        .unwrap();
        let TopCmd::Io(IoArgs {
            cmd: IoCmd::Bench(b),
        }) = t.cmd
        else {
            panic!("not bench")
        };
        assert_eq!(b.device, DeviceSpec::File("/tmp/x".into()));
        assert_eq!(b.policy.len(), 3);
        assert_eq!(b.gap_us, vec![0, 100, 1000, 10000]);
        assert_eq!(b.requests, 7);
        assert!(b.json);
        let t = Top::try_parse_from(["preheat", "io", "kernels", "--iterations", "5", "--json"])
            .unwrap();
        let TopCmd::Io(IoArgs {
            cmd: IoCmd::Kernels(k),
        }) = t.cmd
        else {
            panic!("not kernels")
        };
        assert_eq!(k.iterations, 5);
        assert_eq!("1,0".parse::<PinSpec>(), Ok(PinSpec::Cpus(1, 0)));
        assert!("x".parse::<PinSpec>().is_err());
    }
}
