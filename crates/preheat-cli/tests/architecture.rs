//! The rules ARCHITECTURE.md states about the workspace, checked against the build: the crate
//! layering it draws (every workspace dependency goes to a lower layer), one `rust-version` that
//! every crate inherits, and every crate opting in to the workspace lints.

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
