//! What the architecture documents generate from the code stays generated (issue 32 §6): the
//! crate map is `cargo metadata`'s, the exit table is `ExitIntent`'s, and the runtime's module
//! table names each module's imports of its siblings as its source has them (tests/module_graph). A drift fails here with
//! the expected text; `GATEWARDEN_BLESS_DOCS=1` writes it into the documents instead.
#![cfg(unix)]

mod module_graph;

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn bless() -> bool {
    std::env::var_os("GATEWARDEN_BLESS_DOCS").is_some_and(|v| v == "1")
}

/// Replaces (bless) or checks the text between `<!-- BEGIN generated: NAME … -->` and
/// `<!-- END generated: NAME -->` in `file`.
fn generated_block(file: &Path, name: &str, expected: &str) {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let begin = format!("<!-- BEGIN generated: {name}");
    let end = format!("<!-- END generated: {name} -->");
    let b = text.find(&begin).unwrap_or_else(|| panic!("{} has no `{begin}` marker", file.display()));
    let body = b + text[b..].find("-->\n").expect("the BEGIN marker ends with -->") + 4;
    let e = text[body..].find(&end).map(|i| body + i).unwrap_or_else(|| panic!("{} has no `{end}`", file.display()));
    if bless() {
        let new = format!("{}{expected}{}", &text[..body], &text[e..]);
        std::fs::write(file, new).expect("bless the document");
        return;
    }
    assert!(
        text[body..e] == *expected,
        "{} drifted from the code in its generated `{name}` block; it should read:\n{expected}\n\
         (or run the test with GATEWARDEN_BLESS_DOCS=1)",
        file.display()
    );
}

fn short(name: &str) -> &str {
    name.strip_prefix("gatewarden-").unwrap_or(name)
}

/// `crate ──▶ its workspace dependencies` (normal and build, not dev), the crates most
/// depended upon last; then the crates only tests use.
fn crate_map() -> String {
    let out = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let members: BTreeSet<String> = packages.iter().filter_map(|p| p["name"].as_str().map(str::to_owned)).collect();
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut dev_users: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in packages {
        let name = p["name"].as_str().expect("name").to_owned();
        let entry = deps.entry(name.clone()).or_default();
        for d in p["dependencies"].as_array().into_iter().flatten() {
            let dep = d["name"].as_str().unwrap_or_default();
            if !members.contains(dep) || dep == name {
                continue;
            }
            if d["kind"].as_str() == Some("dev") {
                dev_users.entry(dep.to_owned()).or_default().insert(name.clone());
            } else {
                entry.insert(dep.to_owned());
            }
        }
    }
    // Height: the longest chain of dependencies below a crate (the graph has no cycles).
    fn height(c: &str, deps: &BTreeMap<String, BTreeSet<String>>, memo: &mut BTreeMap<String, usize>) -> usize {
        if let Some(h) = memo.get(c) {
            return *h;
        }
        let h = deps[c].iter().map(|d| 1 + height(d, deps, memo)).max().unwrap_or(0);
        memo.insert(c.to_owned(), h);
        h
    }
    let mut memo = BTreeMap::new();
    // The product: the binary and what it builds on; the rest only tests use (crates/fakewire is
    // a normal dependency of the fakes, which are tests only).
    let mut product_set: BTreeSet<&String> = BTreeSet::new();
    let mut todo: Vec<&String> = deps.keys().filter(|c| *c == "gatewarden").collect();
    while let Some(c) = todo.pop() {
        if product_set.insert(c) {
            todo.extend(deps[c].iter());
        }
    }
    let (mut product, mut tests_only): (Vec<&String>, Vec<&String>) =
        deps.keys().partition(|c| product_set.contains(c));
    product.sort_by_key(|c| (std::cmp::Reverse(height(c, &deps, &mut memo)), (*c).clone()));
    tests_only.sort();
    let width = deps.keys().map(|c| short(c).len()).max().unwrap_or(0);
    let mut s = String::from("```\n");
    let uses = |c: &String| {
        let list: Vec<&str> = deps[c].iter().map(|d| short(d)).collect();
        if list.is_empty() { "(nothing of ours)".to_owned() } else { list.join(", ") }
    };
    for c in product {
        s.push_str(&format!("{:width$} ──▶ {}\n", short(c), uses(c)));
    }
    for c in tests_only {
        // Its users: the crates whose tests use it, and the tests-only crates built on it.
        let normal_users = deps.iter().filter(|(u, d)| d.contains(c) && !product_set.contains(u)).map(|(u, _)| u);
        let by: BTreeSet<&String> = dev_users.get(c).into_iter().flatten().chain(normal_users).collect();
        let by: Vec<&str> = by.into_iter().map(|u| short(u)).collect();
        s.push_str(&format!("{:width$} ──▶ {} (tests only: {})\n", short(c), uses(c), by.join(", ")));
    }
    s.push_str("```\n");
    s
}

#[test]
fn the_crate_map_is_cargo_metadata() {
    generated_block(&root().join("docs/architecture.md"), "crate-map", &crate_map());
}

/// The one exit table, in every document that shows it (architecture, README "Exit codes",
/// protocol §6.1): no hand-written copy to fall behind `ExitIntent`.
#[test]
fn the_exit_table_is_the_code() {
    let table = gatewarden_lifecycle::exit::ExitIntent::markdown_table();
    for doc in ["docs/architecture.md", "README.md", "docs/protocol.md"] {
        generated_block(&root().join(doc), "exit-table", &table);
    }
}

/// Splits a Markdown table row on its unescaped bars.
fn cells(row: &str) -> Vec<String> {
    let (mut out, mut cur, mut escaped) = (Vec::new(), String::new(), false);
    for c in row.trim().trim_start_matches('|').chars() {
        match c {
            '|' if !escaped => out.push(std::mem::take(&mut cur).trim().to_owned()),
            _ => cur.push(c),
        }
        escaped = c == '\\';
    }
    out
}

#[test]
fn runtime_modules_import_what_the_table_says() {
    let doc = root().join("crates/runtime/README.md");
    let graph =
        module_graph::sibling_graphs(&root().join("crates/runtime/src")).remove(&Vec::new()).unwrap_or_default();
    let mods: Vec<&String> = graph.keys().collect();
    let imports: BTreeMap<&str, String> = graph
        .iter()
        .map(|(m, to)| {
            let list: Vec<&str> = to.iter().map(String::as_str).collect();
            (m.as_str(), if list.is_empty() { "—".to_owned() } else { list.join(", ") })
        })
        .collect();
    let text = std::fs::read_to_string(&doc).expect("crates/runtime/README.md");
    let mut seen = BTreeSet::new();
    let mut out = String::new();
    let mut wrong = Vec::new();
    for line in text.split_inclusive('\n') {
        let c = cells(line);
        let name = c.first().and_then(|n| n.strip_prefix('`')).and_then(|n| n.strip_suffix('`'));
        match name.map(|n| n.trim_end_matches('/')).and_then(|n| imports.get_key_value(n)) {
            Some((m, want)) if c.len() == 3 && line.starts_with('|') => {
                seen.insert(m.to_string());
                if c[2] != *want {
                    wrong.push(format!("`{m}` imports {want} (the table says {})", c[2]));
                }
                out.push_str(&format!("| {} | {} | {want} |\n", c[0], c[1]));
            }
            _ => out.push_str(line),
        }
    }
    let missing: Vec<&String> = mods.iter().copied().filter(|m| !seen.contains(*m)).collect();
    assert!(missing.is_empty(), "crates/runtime/README.md's module table lacks {missing:?}");
    if bless() {
        std::fs::write(&doc, out).expect("bless crates/runtime/README.md");
        return;
    }
    assert!(wrong.is_empty(), "crates/runtime/README.md's module table drifted:\n{}", wrong.join("\n"));
}

/// Every path the invariants table names (enforced in, tested by) exists: below `crates/`, and
/// `tests/…` below `crates/gatewarden/`.
#[test]
fn every_path_the_invariants_table_names_exists() {
    let text = std::fs::read_to_string(root().join("docs/architecture.md")).expect("architecture.md");
    let start = text.find("| invariant | enforced in | tested by |").expect("the invariants table");
    let table = text[start..].split("\n\n").next().unwrap_or_default();
    let mut checked = 0;
    let mut missing = Vec::new();
    for row in table.lines().skip(2) {
        let c = cells(row);
        for cell in c.iter().skip(1) {
            for (k, token) in cell.split('`').enumerate() {
                if k % 2 == 0 || !(token.contains('/') || token.ends_with(".rs")) {
                    continue;
                }
                let base = if token.starts_with("tests/") { "crates/gatewarden" } else { "crates" };
                checked += 1;
                if !root().join(base).join(token).exists() {
                    missing.push(format!("{base}/{token}"));
                }
            }
        }
    }
    assert!(checked > 40, "the table names {checked} paths: the parser lost them");
    assert!(missing.is_empty(), "docs/architecture.md names paths that do not exist: {missing:?}");
}

#[test]
fn table_cells_split_on_unescaped_bars() {
    assert_eq!(cells("| `x` | a \\| b | c |"), ["`x`", "a \\| b", "c"]);
}
