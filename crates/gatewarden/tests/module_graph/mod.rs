//! The module graph of a crate's source, read as text (shared by tests/import_circles.rs,
//! which counts its circles, and tests/docs.rs, which checks the runtime's module table): all
//! `cfg`s at once (every OS's file counts), `#[cfg(test)]` modules left out; each `crate::…`,
//! `super::…` or `self::…` path, in a `use` or inline, is resolved to the deepest module it
//! names, and an edge between two modules is lifted to the two children of their nearest
//! common ancestor that contain them (`platform::linux` → `identity` becomes `platform` →
//! `identity`); edges into an ancestor (a child using its parent's items) are not kept.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

pub type ModPath = Vec<String>;

/// Each module's edges to its siblings, keyed by their parent module (`[]`: the crate's
/// top-level modules), from every `crate::`, `super::` and `self::` path outside tests.
pub fn sibling_graphs(src: &Path) -> BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> {
    let mut files = Vec::new();
    collect_rs(src, &mut files);
    let modules: BTreeMap<ModPath, PathBuf> =
        files.iter().filter_map(|f| module_of(src, f).map(|m| (m, f.clone()))).collect();
    let mut graphs: BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (from, file) in &modules {
        // Every module is a node, with or without edges.
        if let Some((last, parent)) = from.split_last() {
            graphs.entry(parent.to_vec()).or_default().entry(last.clone()).or_default();
        }
        let text = strip_comments_and_strings(&fs::read_to_string(file).expect("read source"));
        for path in referenced_paths(&text, from) {
            let Some(to) = deepest_module(&modules, &path) else { continue };
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common == from.len() || common == to.len() {
                continue; // into an ancestor or a descendant
            }
            graphs
                .entry(from[..common].to_vec())
                .or_default()
                .entry(from[common].clone())
                .or_default()
                .insert(to[common].clone());
        }
    }
    graphs
}

/// The circles of one crate's `src` tree, each as its sorted member modules (`a::b`).
pub fn circles_of(src: &Path) -> Vec<Vec<String>> {
    let mut circles = Vec::new();
    for (parent, graph) in sibling_graphs(src) {
        for scc in strongly_connected(&graph) {
            if scc.len() > 1 {
                circles.push(
                    scc.iter().map(|m| parent.iter().chain([m]).cloned().collect::<Vec<_>>().join("::")).collect(),
                );
            }
        }
    }
    circles
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_rs(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`; `lib.rs`/`main.rs` are the root; `src/bin/`
/// holds other crates and is skipped.
fn module_of(src: &Path, file: &Path) -> Option<ModPath> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: ModPath = rel.iter().map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string()).collect();
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        return Some(Vec::new());
    }
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    Some(parts)
}

fn deepest_module(modules: &BTreeMap<ModPath, PathBuf>, path: &[String]) -> Option<ModPath> {
    (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|m| modules.contains_key(m))
}

/// Blanks comments and the contents of string and char literals, so that text in them is not
/// read as a path. Lifetimes (`'a`) are kept.
fn strip_comments_and_strings(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r' && matches!(next, Some('"') | Some('#')) && !ident_char(b.get(i.wrapping_sub(1)).copied()) {
            // raw string r"…" / r#"…"#
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            'raw: while j < b.len() {
                if b[j] == '"' && (0..hashes).all(|h| b.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break 'raw;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                i += if b[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // a char literal ('x', '\n', '\u{..}') or a lifetime ('a)
            let close = if next == Some('\\') {
                (i + 2..b.len().min(i + 12)).find(|&j| b[j] == '\'')
            } else if b.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match close {
                Some(j) => {
                    out.push_str("' '");
                    i = j + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_char(c: Option<char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || c == '_')
}

#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    Sep,
    Open,
    Close,
    Comma,
    Other(char),
}

fn tokens(text: &str) -> Vec<Tok> {
    let b: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_alphabetic() || c == '_' {
            let start = i;
            while ident_char(b.get(i).copied()) {
                i += 1;
            }
            let word: String = b[start..i].iter().collect();
            out.push(Tok::Ident(word.trim_start_matches("r#").to_string()));
            continue;
        }
        if c == ':' && b.get(i + 1) == Some(&':') {
            out.push(Tok::Sep);
            i += 2;
            continue;
        }
        if !c.is_whitespace() {
            out.push(match c {
                '{' => Tok::Open,
                '}' => Tok::Close,
                ',' => Tok::Comma,
                other => Tok::Other(other),
            });
        }
        i += 1;
    }
    out
}

/// Every module path the text names through `crate::`, `super::` or `self::` (in `use` trees
/// and inline), as absolute paths within the crate. Inline `mod name { … }` blocks move what
/// `super` and `self` mean.
fn referenced_paths(text: &str, file_module: &[String]) -> Vec<ModPath> {
    let toks = tokens(text);
    let mut out = Vec::new();
    let mut here = file_module.to_vec();
    // Inline modules open here: the brace depth inside each.
    let mut inline: Vec<usize> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Open => depth += 1,
            Tok::Close => {
                if inline.last() == Some(&depth) {
                    inline.pop();
                    here.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Tok::Ident(m) if m == "mod" => {
                if let (Some(Tok::Ident(name)), Some(Tok::Open)) = (toks.get(i + 1), toks.get(i + 2)) {
                    if cfg_test_before(&toks, i) {
                        i = after_block(&toks, i + 2);
                        continue;
                    }
                    here.push(name.clone());
                    depth += 1;
                    inline.push(depth);
                    i += 3;
                    continue;
                }
            }
            Tok::Ident(u) if u == "use" => {
                let mut trees = Vec::new();
                i = use_tree(&toks, i + 1, Vec::new(), &mut trees);
                out.extend(trees.iter().filter_map(|path| absolute(path, &here)));
                continue;
            }
            Tok::Ident(start)
                if matches!(start.as_str(), "crate" | "super" | "self")
                    && toks.get(i + 1) == Some(&Tok::Sep)
                    && (i == 0 || toks[i - 1] != Tok::Sep) =>
            {
                let mut path = vec![start.clone()];
                let mut j = i + 1;
                while toks.get(j) == Some(&Tok::Sep) {
                    match toks.get(j + 1) {
                        Some(Tok::Ident(s)) => path.push(s.clone()),
                        _ => break,
                    }
                    j += 2;
                }
                out.extend(absolute(&path, &here));
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Whether the item at `i` is marked `#[cfg(test)]` (unit tests may reach anywhere).
fn cfg_test_before(toks: &[Tok], i: usize) -> bool {
    let want = [
        Tok::Other('#'),
        Tok::Other('['),
        Tok::Ident("cfg".into()),
        Tok::Other('('),
        Tok::Ident("test".into()),
        Tok::Other(')'),
        Tok::Other(']'),
    ];
    i >= want.len() && toks[i - want.len()..i] == want
}

/// The index after the block whose `{` is at `open`.
fn after_block(toks: &[Tok], open: usize) -> usize {
    let mut depth = 0usize;
    for (j, t) in toks.iter().enumerate().skip(open) {
        match t {
            Tok::Open => depth += 1,
            Tok::Close => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return j + 1;
                }
            }
            _ => {}
        }
    }
    toks.len()
}

/// Parses one use tree from `i`, pushing each leaf path (prefixed by `prefix`); returns the
/// index after it.
fn use_tree(toks: &[Tok], mut i: usize, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    loop {
        match toks.get(i) {
            Some(Tok::Ident(s)) if s == "as" => {
                // `as name`: the alias does not change what is imported
                out.push(prefix);
                return i + 2;
            }
            Some(Tok::Ident(s)) => {
                prefix.push(s.clone());
                i += 1;
                if toks.get(i) == Some(&Tok::Sep) {
                    i += 1;
                    continue;
                }
                if !matches!(toks.get(i), Some(Tok::Ident(a)) if a == "as") {
                    out.push(prefix);
                    return i;
                }
            }
            Some(Tok::Open) => {
                i += 1;
                loop {
                    match toks.get(i) {
                        Some(Tok::Close) => return i + 1,
                        Some(Tok::Comma) => i += 1,
                        None => return i,
                        _ => i = use_tree(toks, i, prefix.clone(), out),
                    }
                }
            }
            _ => {
                // `*` or the end
                out.push(prefix);
                return i + 1;
            }
        }
    }
}

fn absolute(path: &[String], here: &[String]) -> Option<ModPath> {
    let mut base: ModPath;
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => {
            base = Vec::new();
            rest = &path[1..];
        }
        Some("self") => {
            base = here.to_vec();
            rest = &path[1..];
        }
        Some("super") => {
            base = here.to_vec();
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// Tarjan's algorithm; each component sorted.
fn strongly_connected(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        if let Some(next) = s.graph.get(v) {
            for w in next {
                let w = w.as_str();
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let lw = s.low[w];
                    let lv = s.low[v];
                    s.low.insert(v, lv.min(lw));
                } else if s.on_stack.contains(w) {
                    let iw = s.index[w];
                    let lv = s.low[v];
                    s.low.insert(v, lv.min(iw));
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            scc.sort();
            s.out.push(scc);
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    let nodes: BTreeSet<&str> =
        graph.iter().flat_map(|(k, v)| std::iter::once(k.as_str()).chain(v.iter().map(String::as_str))).collect();
    for v in nodes {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}
