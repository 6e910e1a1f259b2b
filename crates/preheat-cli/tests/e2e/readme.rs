//! The commands the README (and `docs/*.md`) shows are real: every `preheat …` (and
//! `preheatd …`) it writes, in a `sh` block or inline, names subcommands that exist, only
//! options that their `--help` lists, and every option their usage requires. A renamed flag or
//! command otherwise leaves the README wrong without any test failing; this runs no command,
//! only `--help`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn readme() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::read_to_string(root.join("README.md")).unwrap()
}

/// The documents under `docs/` (the results log keeps the README's earlier commands).
fn docs() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The commands in `md`: the lines of its `sh` blocks and its inline code spans (which may wrap
/// across lines), split at `;` and `&&`, comments removed, that run `preheat` or `preheatd` —
/// written as such, as `./target/release/preheat` or as `cargo run --release --bin preheat --`.
/// Spans that show a syntax (`[…]`, `\|`, `…`) are not commands.
fn commands(md: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut prose = String::new();
    let mut in_sh = false;
    let mut in_other = false;
    for line in md.lines() {
        if let Some(info) = line.strip_prefix("```") {
            match (in_sh || in_other, info.trim()) {
                (true, _) => (in_sh, in_other) = (false, false),
                (false, "sh") => in_sh = true,
                (false, _) => in_other = true,
            }
            continue;
        }
        if in_sh {
            let code = line.split(" #").next().unwrap_or("");
            found.extend(
                code.split(';')
                    .flat_map(|c| c.split("&&"))
                    .map(str::to_string),
            );
        } else if !in_other {
            prose.push_str(line);
            prose.push(' ');
        }
    }
    found.extend(prose.split('`').skip(1).step_by(2).map(str::to_string));
    found
        .into_iter()
        .filter_map(|c| {
            let c = c.trim();
            let c = c
                .strip_prefix("cargo run --release --bin preheat -- ")
                .map(|r| format!("preheat {r}"))
                .or_else(|| c.strip_prefix("./target/release/").map(str::to_string))
                .unwrap_or_else(|| c.to_string());
            let runs = c.starts_with("preheat ") || c.starts_with("preheatd ");
            // A syntax, not a command: optional parts, alternatives among subcommands.
            let syntax = ["[", "\\|", "…", "...", "<"].iter().any(|s| c.contains(s))
                || c.split(" -").next().is_some_and(|head| head.contains('|'));
            (runs && !syntax).then_some(c)
        })
        .collect()
}

/// `--help` of the subcommand path `path` (`path[0]` is the program), cached.
struct Helps {
    preheatd: PathBuf,
    seen: BTreeMap<Vec<String>, String>,
}

impl Helps {
    fn get(&mut self, path: &[String]) -> &str {
        if !self.seen.contains_key(path) {
            let exe = match path[0].as_str() {
                "preheatd" => self.preheatd.clone(),
                _ => PathBuf::from(env!("CARGO_BIN_EXE_preheat")),
            };
            let o = Command::new(exe)
                .args(&path[1..])
                .arg("--help")
                .output()
                .expect("run --help");
            assert!(
                o.status.success(),
                "{} --help failed: {}",
                path.join(" "),
                String::from_utf8_lossy(&o.stderr)
            );
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            self.seen.insert(path.to_vec(), text);
        }
        &self.seen[path]
    }
}

/// The subcommands a help lists: lines of two spaces, a lower-case name, two or more spaces
/// and its description — clap's `Commands:` section and the lab's (argparse) command list alike;
/// options (`  -h, --help`) and arguments (`  <MATRIX>`) do not match.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("  ")?;
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
                .collect();
            let after = &rest[name.len()..];
            let described = after.starts_with("  ") && !after.trim_start().is_empty();
            (rest.starts_with(|c: char| c.is_ascii_lowercase()) && described).then_some(name)
        })
        .collect()
}

/// Whether `help` lists the option `name` (`--lead-us`): followed by a space, `=`, `,`, `<` or
/// the line's end, so `--out` does not match `--out-dir`.
fn lists_option(help: &str, name: &str) -> bool {
    help.match_indices(name).any(|(i, _)| {
        let before = help[..i].chars().next_back();
        let after = help[i + name.len()..].chars().next();
        before.is_none_or(|c| !c.is_alphanumeric() && c != '-')
            && after.is_none_or(|c| matches!(c, ' ' | '=' | ',' | '<' | '\n' | ']' | '\''))
    })
}

/// The options a help's usage requires: `--name` tokens outside brackets in its `Usage:` /
/// `usage:` block (clap and argparse both bracket the optional ones).
fn required_options(help: &str) -> Vec<String> {
    let Some(start) = help.find("Usage:").or_else(|| help.find("usage:")) else {
        return Vec::new();
    };
    let usage = help[start..].split("\n\n").next().unwrap_or("");
    let mut depth = 0i32;
    let mut flat = String::new();
    for c in usage.chars() {
        match c {
            '[' | '(' => depth += 1,
            ']' | ')' => depth -= 1,
            _ if depth == 0 => flat.push(c),
            _ => {}
        }
    }
    flat.split_whitespace()
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| w.split('=').next().unwrap_or(w).to_string())
        .collect()
}

/// What is wrong with one README command (`None`: nothing). Words up to the first option or
/// argument must be subcommands; after that, options must be listed by the deepest
/// subcommand's help, and every option its usage requires must be given (a command shown
/// without one fails when run verbatim; a bare subcommand path names a command and is not
/// checked for them); a bare `--` ends the check (the program to run follows).
fn check(cmd: &str, helps: &mut Helps) -> Option<String> {
    let words: Vec<&str> = cmd.split_whitespace().collect();
    let mut path = vec![words[0].to_string()];
    let mut in_args = false;
    for w in &words[1..] {
        if *w == "--" {
            break;
        }
        if let Some(opt) = w.strip_prefix("--") {
            let name = format!("--{}", opt.split('=').next().unwrap_or(""));
            if !lists_option(helps.get(&path), &name) {
                return Some(format!("`{}` has no option {name}", path.join(" ")));
            }
            in_args = true;
        } else if !in_args && !w.starts_with('-') {
            let help = helps.get(&path);
            let subs = subcommands(help);
            // argparse lists its subcommands as the one positional argument.
            let argparse_subs = help.contains("positional arguments")
                && !help.contains("Arguments:")
                && !subs.is_empty();
            if subs.iter().any(|s| s == w) {
                path.push(w.to_string());
            } else if !argparse_subs
                && (help.contains("Arguments:") || help.contains("positional arguments"))
            {
                in_args = true;
            } else {
                return Some(format!("`{}` has no subcommand {w}", path.join(" ")));
            }
        }
    }
    // A bare subcommand path (`preheat record` in prose) names the command, it is no call.
    let asks_help = words.len() == path.len() || words.iter().any(|w| *w == "--help" || *w == "-h");
    let given = |o: &str| {
        words
            .iter()
            .any(|w| *w == o || w.strip_prefix(o).is_some_and(|r| r.starts_with('=')))
    };
    let missing: Vec<String> = required_options(helps.get(&path))
        .into_iter()
        .filter(|o| !given(o))
        .collect();
    if !asks_help && !missing.is_empty() {
        return Some(format!(
            "`{}` requires {} (its usage), which the command does not give",
            path.join(" "),
            missing.join(", ")
        ));
    }
    None
}

#[test]
fn required_options_are_read_from_both_usage_styles() {
    let clap = "Do it\n\nUsage: preheat x [OPTIONS] --out <OUT> [-- <CMD>...]\n\nOptions:\n  --out <OUT>  where\n";
    assert_eq!(required_options(clap), ["--out"]);
    let argparse = "usage: python -m preheat_lab report [-h] --out OUT\n                 [--bootstrap BOOTSTRAP]\n\noptions:\n";
    assert_eq!(required_options(argparse), ["--out"]);
    assert!(required_options("usage: x [-h] [--out OUT] (--a | --b)\n").is_empty());
}

#[test]
fn the_readmes_commands_name_real_subcommands_and_options() {
    let preheatd = preheat_testsupport::built("preheatd");
    if !preheatd.exists() {
        let st = preheat_testsupport::cargo_build(&["preheatd"])
            .status()
            .expect("running cargo");
        assert!(st.success(), "building preheatd failed");
    }
    let cmds = commands(&readme());
    assert!(
        cmds.len() > 40,
        "found only {} commands: {cmds:?}",
        cmds.len()
    );
    let cmds = [cmds, commands(&docs())].concat();
    let mut helps = Helps {
        preheatd,
        seen: BTreeMap::new(),
    };
    let wrong: Vec<String> = cmds
        .iter()
        .filter_map(|c| check(c, &mut helps).map(|why| format!("{c}\n    {why}")))
        .collect();
    assert!(
        wrong.is_empty(),
        "README commands that do not parse:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn readme_commands_are_found_and_checked() {
    let md = "Run `preheat demo --lead-us 200`, or\n`preheat wake\ncalibrate`.\n\n```sh\n\
              cargo run --release --bin preheat -- topology   # what it has\n\
              preheat bench cosched; preheat bench cosim\n```\n\n```text\npreheat:auto 1 2\n```\n\
              Not commands: `preheat demo [--server kv\\|nginx]`, `preheat run|record --x`,\n\
              `preheatd`.\n";
    assert_eq!(
        commands(md),
        [
            "preheat topology",
            "preheat bench cosched",
            "preheat bench cosim",
            "preheat demo --lead-us 200",
            "preheat wake calibrate",
        ]
    );
    let demo = "Usage: preheat demo [OPTIONS]\n\nOptions:\n      --lead-us <LEAD_US>\n      \
                --out-dir <D>\n";
    assert!(lists_option(demo, "--lead-us"));
    assert!(!lists_option(demo, "--out"));
    assert_eq!(
        subcommands("Commands:\n  run   Run\n  help  Help\n\nOptions:\n  -h, --help  Help\n"),
        ["run", "help"]
    );
    assert_eq!(
        subcommands("usage: lab [-h] COMMAND ...\n\n  table1    Table 1\n\nArguments:\n  <M>  M\n"),
        ["table1"]
    );
}
