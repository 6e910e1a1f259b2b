//! Stand-alone `preheat stage` (until the CLI wires it):
//! `cargo run --release -p preheat-stage --example stage -- bench --duration-s 20`.
#![forbid(unsafe_code)]

use clap::Parser;

#[derive(Parser)]
#[command(name = "stage", about = "Staged bursts: staging proxy and benchmark")]
struct Cli {
    #[command(flatten)]
    stage: preheat_stage::StageArgs,
}

fn main() {
    if let Err(e) = preheat_stage::run(Cli::parse().stage) {
        eprintln!("stage: error: {e:#}");
        std::process::exit(1);
    }
}
