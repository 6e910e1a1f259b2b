//! `PowerArgs` parses as the lead will wire it (`preheat power …`) and its commands run.

use clap::{CommandFactory, Parser};
use preheat_engine::machine;
use preheat_power::cli::PowerCommand;
use preheat_power::PowerArgs;

#[derive(Parser)]
#[command(name = "preheat")]
enum Top {
    Power(PowerArgs),
}

fn parse(args: &[&str]) -> PowerArgs {
    let Top::Power(p) = Top::try_parse_from(args).unwrap();
    p
}

#[test]
fn clap_definition_is_consistent() {
    Top::command().debug_assert();
}

#[test]
fn subcommands_parse() {
    let p = parse(&["preheat", "power", "residency", "--for-s", "0.5", "--json"]);
    match p.command {
        PowerCommand::Residency(a) => assert!(a.for_s == 0.5 && a.json),
        other => panic!("{other:?}"),
    }
    let p = parse(&[
        "preheat",
        "power",
        "quiesce-bench",
        "--json",
        "--io-file",
        "/tmp/x",
        "--freezer",
        "v1",
    ]);
    match p.command {
        PowerCommand::QuiesceBench(a) => {
            assert!(a.json);
            assert_eq!(a.duration_s, 9.0);
            assert_eq!(a.io_wait_us, 2000);
            assert_eq!(a.io_file.as_deref(), Some(std::path::Path::new("/tmp/x")));
        }
        other => panic!("{other:?}"),
    }
    assert!(Top::try_parse_from(["preheat", "power", "residency"]).is_err());
}

#[test]
fn residency_runs_on_a_synthetic_tree_and_profile_prints() {
    // Both machine variants: with cpuidle states (haltpoll) and without a driver (none).
    for variant in [machine::HALTPOLL, machine::NO_CPUIDLE] {
        let tmp = tempfile::tempdir().unwrap();
        machine::write_fake(tmp.path(), &variant).unwrap();
        let root = tmp.path().to_str().unwrap();
        for json in [true, false] {
            let mut args = vec![
                "preheat",
                "power",
                "residency",
                "--for-s",
                "0.05",
                "--machine-root",
                root,
            ];
            if json {
                args.push("--json");
            }
            preheat_power::run(parse(&args)).unwrap();
        }
    }
    preheat_power::run(parse(&["preheat", "power", "profile"])).unwrap();
    let e = preheat_power::run(parse(&["preheat", "power", "residency", "--for-s=0"])).unwrap_err();
    assert!(e.to_string().contains("--for-s"), "{e}");
}
