//! Stand-alone front end for `preheat io` (until the CLI wires it in):
//! `cargo run --release -p preheat-predict --example io -- bench --device emulated`.

use clap::Parser;

#[derive(Parser)]
#[command(name = "io")]
struct Cli {
    #[command(flatten)]
    io: preheat_predict::IoArgs,
}

fn main() -> anyhow::Result<()> {
    preheat_predict::run(Cli::parse().io)
}
