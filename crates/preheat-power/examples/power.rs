//! Stand-alone front end until the CLI wires `preheat power`:
//! `cargo run --release -p preheat-power --example power -- quiesce-bench`.

use clap::Parser;

#[derive(Parser)]
#[command(name = "power")]
struct Cli {
    #[command(flatten)]
    args: preheat_power::PowerArgs,
}

fn main() -> anyhow::Result<()> {
    preheat_power::run(Cli::parse().args)
}
