//! The rules ARCHITECTURE.md states about the workspace, checked against the build: the crate
//! layering it draws (every workspace dependency goes to a lower layer), one `rust-version` that
//! every crate inherits, every crate opting in to the workspace lints, no module import cycle,
//! and the sizes issue 21 sets: the CLI's source at most 4,000 lines, no function over 100
//! lines but the listed ones, no source file (tests included) over 800 lines outside its test
//! modules.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Crate → layer, from the ```text block after "## Code map" in ARCHITECTURE.md.
fn layers() -> BTreeMap<String, u32> {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let map = text
        .split("## Code map")
        .nth(1)
        .expect("a Code map section");
    let block = map
        .split("```text")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a ```text block with the layers in the Code map");
    let mut out = BTreeMap::new();
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let mut f = line.split_whitespace();
        let layer: u32 = f.next().unwrap().parse().expect("a layer number first");
        for c in f {
            assert!(out.insert(c.to_string(), layer).is_none(), "{c} twice");
        }
    }
    out
}

/// (name, manifest path, rust_version, workspace dependencies) of every workspace package.
fn packages() -> Vec<(String, PathBuf, Option<String>, Vec<String>)> {
    let o = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let members: Vec<String> = v["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    v["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                // Normal and build dependencies; dev-dependencies (tests) may reach anywhere.
                .filter(|d| d["kind"].as_str() != Some("dev"))
                .map(|d| d["name"].as_str().unwrap().to_string())
                .filter(|d| members.contains(d))
                .collect();
            (
                p["name"].as_str().unwrap().to_string(),
                PathBuf::from(p["manifest_path"].as_str().unwrap()),
                p["rust_version"].as_str().map(String::from),
                deps,
            )
        })
        .collect()
}

#[test]
fn crates_depend_only_on_lower_layers() {
    let layers = layers();
    let pkgs = packages();
    for (name, _, _, deps) in &pkgs {
        let mine = *layers
            .get(name)
            .unwrap_or_else(|| panic!("{name} is missing from ARCHITECTURE.md's layers"));
        for d in deps {
            let theirs = layers[d];
            assert!(
                theirs < mine,
                "{name} (layer {mine}) depends on {d} (layer {theirs}): not a lower layer"
            );
        }
    }
    for name in layers.keys() {
        assert!(
            pkgs.iter().any(|p| &p.0 == name),
            "ARCHITECTURE.md lists {name}, which is not a workspace crate"
        );
    }
}

#[test]
fn every_crate_inherits_the_msrv_and_the_lints() {
    let pkgs = packages();
    let msrv = &pkgs[0].2;
    assert!(msrv.is_some(), "{} has no rust-version", pkgs[0].0);
    for (name, manifest, rv, _) in &pkgs {
        assert_eq!(rv, msrv, "{name}: rust-version");
        let toml = std::fs::read_to_string(manifest).unwrap();
        assert!(
            toml.contains("rust-version.workspace = true"),
            "{name} does not inherit the workspace's rust-version"
        );
        assert!(
            toml.contains("[lints]\nworkspace = true"),
            "{name} does not opt in to the workspace lints"
        );
    }
}

/// The top-level modules of the crate whose sources are in `src` (`X.rs` or `X/mod.rs`; the
/// root `lib.rs`/`main.rs` is not one), each with the files that make it up.
fn top_modules(src: &Path) -> BTreeMap<String, Vec<PathBuf>> {
    fn files(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(src).unwrap().flatten() {
        let p = e.path();
        let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
        let mut fs = Vec::new();
        if p.is_dir() {
            files(&p, &mut fs);
        } else if p.extension().is_some_and(|x| x == "rs") && stem != "lib" && stem != "main" {
            fs.push(p);
        }
        if !fs.is_empty() {
            out.entry(stem).or_insert_with(Vec::new).extend(fs);
        }
    }
    out
}

/// The top-level modules named by `crate::NAME` paths in `code` (comments skipped), including
/// those in `use crate::{a, b::c}` groups.
fn crate_refs(code: &str, modules: &BTreeMap<String, Vec<PathBuf>>) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    let code: String = code
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    for (i, _) in code.match_indices("crate::") {
        let rest = code[i + "crate::".len()..].trim_start();
        let names: Vec<String> = match rest.strip_prefix('{') {
            // The group's top-level items: split at commas outside nested braces.
            Some(group) => {
                let (mut depth, mut start, mut names) = (0, 0, Vec::new());
                for (j, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            names.push(ident(group[start..j].trim()));
                            break;
                        }
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            names.push(ident(group[start..j].trim()));
                            start = j + 1;
                        }
                        _ => {}
                    }
                }
                names
            }
            None => vec![ident(rest)],
        };
        out.extend(names.into_iter().filter(|n| modules.contains_key(n)));
    }
    out
}

/// Imports that close a module cycle, each to be removed (the test fails when one is gone, so
/// the list only shrinks): (crate, from, to). Empty: a new cycle is a failure, not an entry.
const KNOWN_BACK_EDGES: &[(&str, &str, &str)] = &[];

/// No crate's top-level modules import each other in a cycle (ARCHITECTURE.md: modules in one
/// direction), read from the `crate::` paths in their sources; a file's unit tests (from
/// `#[cfg(test)] mod tests` on) may use any module.
#[test]
fn no_module_import_cycle_in_any_crate() {
    for (name, manifest, _, _) in packages() {
        let src = manifest.parent().unwrap().join("src");
        if !src.is_dir() {
            continue;
        }
        let modules = top_modules(&src);
        let mut edges: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
        for (m, files) in &modules {
            for f in files {
                let code = std::fs::read_to_string(f).unwrap();
                let code = code.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
                for r in crate_refs(code, &modules) {
                    if &r != m {
                        edges.entry(m.clone()).or_default().insert(r);
                    }
                }
            }
        }
        for (c, from, to) in KNOWN_BACK_EDGES.iter().filter(|e| e.0 == name) {
            let gone = edges.get_mut(*from).is_none_or(|e| !e.remove(*to));
            assert!(
                !gone,
                "{c}: {from} no longer imports {to}: drop it from KNOWN_BACK_EDGES"
            );
        }
        // Depth-first search with the path on a stack: a module met again on it closes a cycle.
        fn visit(
            m: &str,
            edges: &BTreeMap<String, std::collections::BTreeSet<String>>,
            done: &mut std::collections::BTreeSet<String>,
            path: &mut Vec<String>,
        ) -> Option<Vec<String>> {
            if let Some(i) = path.iter().position(|p| p == m) {
                let mut cycle = path[i..].to_vec();
                cycle.push(m.to_string());
                return Some(cycle);
            }
            if done.contains(m) {
                return None;
            }
            path.push(m.to_string());
            for n in edges.get(m).into_iter().flatten() {
                if let Some(c) = visit(n, edges, done, path) {
                    return Some(c);
                }
            }
            path.pop();
            done.insert(m.to_string());
            None
        }
        let mut done = std::collections::BTreeSet::new();
        for m in modules.keys() {
            if let Some(cycle) = visit(m, &edges, &mut done, &mut Vec::new()) {
                panic!("{name}: module import cycle {}", cycle.join(" → "));
            }
        }
    }
}

#[test]
fn the_cycle_check_reads_groups_and_skips_comments() {
    let modules: BTreeMap<String, Vec<PathBuf>> = ["a", "b", "c", "d"]
        .iter()
        .map(|m| (m.to_string(), vec![]))
        .collect();
    let code = "use crate::{a::X, b::{Y, Z}, Other};\n// see crate::c\nlet v = crate::d::f();\n";
    assert_eq!(crate_refs(code, &modules), ["a", "b", "d"]);
}

/// The CLI's source, in lines: it parses arguments and prints (issue 21: ≤ 4k lines).
const CLI_MAX_LINES: usize = 4000;

/// The longest a function in any crate's `src` may be, in lines from its `fn` line to its
/// closing brace.
const FN_MAX_LINES: usize = 100;

/// Functions longer than [`FN_MAX_LINES`] today: (file under `crates/`, function, lines). The
/// test fails when one grows, shrinks or gets under the limit, so the list can only shrink:
/// split one, then lower its count or drop it here.
const LONG_FNS: &[(&str, &str, usize)] = &[];

/// The most lines a source file may have outside its `#[cfg(test)] mod … { … }` blocks: one
/// concept per file; past this, split it (every crate's `src`, `tests`, `examples` and
/// `benches`, and the Python package).
const FILE_MAX_LINES: usize = 800;

/// Every `.rs` file under `dir`, recursively.
fn rs_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(rs_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// The functions in `code` with their lengths in lines. rustfmt'd code: a function starts at a
/// line `[pub[(…)]] [const] [async] [unsafe] [extern "C"] fn NAME` and ends at the first later
/// line at the same indentation that is `}` (its body's end) or ends with `;` (a declaration
/// without a body); a function on one line is one line long.
fn functions(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let rest = line.trim_start_matches(' ');
        let indent = line.len() - rest.len();
        let mut rest = rest;
        if let Some(r) = rest.strip_prefix("pub") {
            rest = match r.strip_prefix('(') {
                Some(vis) => vis.split_once(") ").map_or("", |(_, r)| r),
                None => r.strip_prefix(' ').unwrap_or(""),
            };
        }
        for q in ["const ", "async ", "unsafe ", "extern \"C\" "] {
            rest = rest.strip_prefix(q).unwrap_or(rest);
        }
        let Some(r) = rest.strip_prefix("fn ") else {
            continue;
        };
        let name: String = r
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let first = line.trim_end();
        let len = if first.ends_with(';') || first.ends_with('}') {
            1
        } else {
            let end = lines[i + 1..].iter().position(|l| {
                let t = l.trim_end();
                let b = t.as_bytes();
                b.len() > indent
                    && b[..indent].iter().all(|&c| c == b' ')
                    && !matches!(b[indent], b' ' | b'\t')
                    && (&b[indent..] == b"}" || t.ends_with(';'))
            });
            end.map_or(lines.len() - i, |e| e + 2)
        };
        out.push((name, len));
    }
    out
}

#[test]
fn the_cli_is_small() {
    let lines: usize = rs_files(&root().join("crates/preheat-cli/src"))
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap().lines().count())
        .sum();
    assert!(
        lines <= CLI_MAX_LINES,
        "preheat-cli has {lines} lines of source (at most {CLI_MAX_LINES}): move the work into \
         a library crate, the CLI parses arguments and prints"
    );
}

/// `code`'s lines outside its test modules (rustfmt'd: `#[cfg(test)]` at column 0, then
/// `mod NAME {`, up to the first later line that is `}`).
fn non_test_lines(code: &str) -> usize {
    let lines: Vec<&str> = code.lines().collect();
    let (mut n, mut i) = (0, 0);
    while i < lines.len() {
        let test_mod = lines[i] == "#[cfg(test)]"
            && lines
                .get(i + 1)
                .is_some_and(|l| l.starts_with("mod ") && l.ends_with('{'));
        if test_mod {
            i += 2;
            while i < lines.len() && lines[i] != "}" {
                i += 1;
            }
            i += 1;
        } else {
            n += 1;
            i += 1;
        }
    }
    n
}

#[test]
fn test_modules_do_not_count_as_lines() {
    let code = "use a;\n\nfn f() {}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn t() {}\n}\n";
    assert_eq!(non_test_lines(code), 4);
    // A cfg(test) item that is not a module counts.
    assert_eq!(non_test_lines("#[cfg(test)]\nuse b;\nfn g() {}\n"), 3);
}

#[test]
fn no_source_file_is_longer_than_the_limit() {
    let mut files: Vec<PathBuf> = Vec::new();
    for e in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        for dir in ["src", "tests", "examples", "benches"] {
            let d = e.path().join(dir);
            if d.is_dir() {
                files.extend(rs_files(&d));
            }
        }
    }
    for e in std::fs::read_dir(root().join("python/preheat_lab"))
        .unwrap()
        .flatten()
    {
        if e.path().extension().is_some_and(|x| x == "py") {
            files.push(e.path());
        }
    }
    assert!(files.len() > 100, "found only {} source files", files.len());
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = non_test_lines(&std::fs::read_to_string(f).unwrap());
            (n > FILE_MAX_LINES).then(|| {
                let rel = f.strip_prefix(root()).unwrap().display();
                format!("{rel}: {n} lines outside its tests (at most {FILE_MAX_LINES}): split it")
            })
        })
        .collect();
    assert!(long.is_empty(), "{}", long.join("\n"));
}

#[test]
fn no_function_is_longer_than_the_limit() {
    let crates = root().join("crates");
    let mut long = BTreeMap::new();
    for e in std::fs::read_dir(&crates).unwrap().flatten() {
        let src = e.path().join("src");
        if !src.is_dir() {
            continue;
        }
        for f in rs_files(&src) {
            let rel = f
                .strip_prefix(&crates)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            for (name, len) in functions(&std::fs::read_to_string(&f).unwrap()) {
                if len > FN_MAX_LINES {
                    let prev = long.insert((rel.clone(), name.clone()), len);
                    assert!(prev.is_none(), "{rel}: two functions {name} over the limit");
                }
            }
        }
    }
    let mut wrong = Vec::new();
    for &(file, name, listed) in LONG_FNS {
        match long.remove(&(file.to_string(), name.to_string())) {
            None => wrong.push(format!(
                "{file}: {name} is now at most {FN_MAX_LINES} lines: drop it from LONG_FNS"
            )),
            Some(n) if n > listed => wrong.push(format!(
                "{file}: {name} has grown to {n} lines (listed at {listed}): split it"
            )),
            Some(n) if n < listed => wrong.push(format!(
                "{file}: {name} is down to {n} lines: lower its count in LONG_FNS to {n}"
            )),
            Some(_) => {}
        }
    }
    for ((file, name), n) in long {
        wrong.push(format!(
            "{file}: {name} has {n} lines (at most {FN_MAX_LINES}): split it"
        ));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn functions_are_measured_from_fn_to_the_brace() {
    let code = "\
pub(crate) fn a(x: u32) -> u32 {
    let y = x;
    y
}
    pub unsafe fn b() {}
trait T {
    fn c(
        &self,
    ) -> u32;
    async fn d(&self) {
        let s = \"}\";
    }
}
";
    assert_eq!(
        functions(code),
        [("a", 4), ("b", 1), ("c", 3), ("d", 3)].map(|(n, l)| (n.to_string(), l))
    );
}
