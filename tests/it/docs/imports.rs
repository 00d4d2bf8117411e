//! The crate doc (`src/lib.rs`) says imports between the modules of `src/`
//! run one way. A cycle (`app` importing from `proxy` while `proxy` imports
//! `app`) means neither side can be read or changed alone; this keeps the
//! claim true at every level: between the top-level modules, and between
//! the modules inside each one (`ledger::file::disk` and a sibling of it).
//!
//! An edge is a path outside comments and string literals that starts with
//! `crate::`, `super::` or `self::` (a `use` or a call), in any file of
//! `src/` or an inline `mod` in one, and names a module other than one of
//! its own ancestors: it is counted between the two siblings under their
//! closest common ancestor (`ledger::file::disk` → `ledger::saved` is an
//! edge `ledger::file` → `ledger::saved`). A path through a re-export
//! (`super::State`, which `proxy` re-exports from `proxy::state`) is an
//! edge to the module that defines the item, not to the one re-exporting
//! it: a re-export must not hide a cycle.
//!
//! Elsewhere a module using its parent, or a parent its children, is no
//! cycle (Rust's module tree runs both ways: `impl Cache` in a child file
//! of `cache`). Under the modules of [`STRICT`] it is: there every file is
//! a node, a child naming an item of its parent's file is an edge to that
//! file, a parent naming a child (`child::f()`, `use child::X`) an edge to
//! the child, and no file may reach itself again.

use super::root;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The modules whose files import one way among themselves, parents and
/// children included: the request path, read top to bottom.
const STRICT: &[&str] = &["proxy"];

/// A module, as its path from the crate root: `["ledger", "file", "disk"]`.
type Module = Vec<String>;
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The module a file of `src/` is; `None` for the crate root (`lib.rs`,
/// `main.rs`), which wires everything.
fn module_of(rel: &Path) -> Option<Module> {
    let mut parts: Module = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let file = parts.pop()?;
    let stem = file.strip_suffix(".rs")?;
    if parts.is_empty() && (stem == "lib" || stem == "main") {
        return None;
    }
    if stem != "mod" {
        parts.push(stem.to_string());
    }
    Some(parts)
}

/// `text` with comments removed and string and char literals emptied, so
/// neither a `crate::` in prose nor a `{` in a format string counts.
fn code_of(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
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
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&chars, i) {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            while j < chars.len() {
                if chars[j] == '"' && (1..=hashes).all(|h| chars.get(j + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && (next == Some('\\') || chars.get(i + 2) == Some(&'\'')) {
            // A char literal ('{', '\n'), not a lifetime ('a).
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && is_ident(chars[i - 1])
}

/// Reads an identifier at `at`.
fn ident_at(code: &[char], at: usize) -> Option<(String, usize)> {
    let end = (at..code.len()).find(|j| !is_ident(code[*j])).unwrap_or(code.len());
    (end > at).then(|| (code[at..end].iter().collect(), end))
}

fn skip_space(code: &[char], mut at: usize) -> usize {
    while at < code.len() && code[at].is_whitespace() {
        at += 1;
    }
    at
}

/// The paths a use tree at `at` names (`a::b`, `a::{b, c::d}`), each
/// appended to `prefix`.
fn use_tree(code: &[char], at: usize, prefix: &Module, out: &mut Vec<Module>) {
    let mut path = prefix.clone();
    let mut at = skip_space(code, at);
    loop {
        if code.get(at) == Some(&'{') {
            let mut depth = 0;
            let mut start = at + 1;
            for j in at..code.len() {
                match code[j] {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            use_tree(code, start, &path, out);
                            return;
                        }
                    }
                    ',' if depth == 1 => {
                        use_tree(code, start, &path, out);
                        start = j + 1;
                    }
                    _ => {}
                }
            }
            return;
        }
        let Some((name, end)) = ident_at(code, at) else { break };
        if name != "self" {
            path.push(name);
        }
        let after = skip_space(code, end);
        if code.get(after) == Some(&':') && code.get(after + 1) == Some(&':') {
            at = skip_space(code, after + 2);
        } else {
            break;
        }
    }
    out.push(path);
}

/// The child modules a file declares in files of their own (`mod x;`).
fn child_modules(code: &[char]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let Some((word, end)) = ident_at(code, i).filter(|_| !ident_before(code, i)) else {
            i += 1;
            continue;
        };
        if word == "mod" {
            let at = skip_space(code, end);
            if let Some((name, after)) = ident_at(code, at) {
                if code.get(skip_space(code, after)) == Some(&';') {
                    out.push(name);
                }
            }
        }
        i = end;
    }
    out
}

/// The modules the file of module `file` names, each with the module it
/// is named from (the file's, or an inline `mod` in it). Besides paths
/// from `crate::`, `super::` and `self::`, a path that starts with one of
/// the file's own child modules (`child::f()`) is named from the file.
fn names_in(text: &str, file: &Module) -> Vec<(Module, Module)> {
    let code: Vec<char> = code_of(text).chars().collect();
    let children = child_modules(&code);
    // Inline modules open here: (name, the brace depth inside them).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut named = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let c = code[i];
        if c == '{' {
            depth += 1;
            i += 1;
            continue;
        }
        if c == '}' {
            if inline.last().is_some_and(|(_, d)| *d == depth) {
                inline.pop();
            }
            depth = depth.saturating_sub(1);
            i += 1;
            continue;
        }
        if !is_ident(c) || ident_before(&code, i) || (i > 0 && code[i - 1] == ':') {
            i += 1;
            continue;
        }
        let Some((word, end)) = ident_at(&code, i) else {
            i += 1;
            continue;
        };
        let here: Module = file
            .iter()
            .cloned()
            .chain(inline.iter().map(|(n, _)| n.clone()))
            .collect();
        if word == "mod" {
            let at = skip_space(&code, end);
            if let Some((name, after)) = ident_at(&code, at) {
                if code.get(skip_space(&code, after)) == Some(&'{') {
                    inline.push((name, depth + 1));
                }
            }
            i = end;
            continue;
        }
        if inline.is_empty() && children.contains(&word) {
            let sep = skip_space(&code, end);
            if code.get(sep) == Some(&':') && code.get(sep + 1) == Some(&':') {
                let mut out = Vec::new();
                use_tree(&code, i, &here, &mut out);
                named.extend(out.into_iter().map(|p| (here.clone(), p)));
            }
            i = end;
            continue;
        }
        let base = match word.as_str() {
            "crate" => Some(Vec::new()),
            "self" => Some(here.clone()),
            "super" => {
                let mut base = here.clone();
                let mut at = end;
                base.pop();
                // super::super::…
                loop {
                    let sep = skip_space(&code, at);
                    let next = skip_space(&code, sep + 2);
                    let is_sep = code.get(sep) == Some(&':') && code.get(sep + 1) == Some(&':');
                    match ident_at(&code, next) {
                        Some((w, e)) if is_sep && w == "super" => {
                            base.pop();
                            at = e;
                        }
                        _ => break,
                    }
                }
                // Where the path after the last `super` starts.
                let mut out = Vec::new();
                let sep = skip_space(&code, at);
                if code.get(sep) == Some(&':') && code.get(sep + 1) == Some(&':') {
                    use_tree(&code, sep + 2, &base, &mut out);
                }
                named.extend(out.into_iter().map(|p| (here.clone(), p)));
                i = at;
                continue;
            }
            _ => None,
        };
        if let Some(base) = base {
            let sep = skip_space(&code, end);
            if code.get(sep) == Some(&':') && code.get(sep + 1) == Some(&':') {
                let mut out = Vec::new();
                use_tree(&code, sep + 2, &base, &mut out);
                named.extend(out.into_iter().map(|p| (here.clone(), p)));
            }
        }
        i = end;
    }
    named
}

/// The longest prefix of `path` that is a module of `modules`.
fn resolve(path: &Module, modules: &BTreeSet<Module>) -> Module {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| modules.contains(p))
        .unwrap_or_default()
}

/// Items a module re-exports from a module below it (`pub use state::State;`
/// in `proxy` makes (`proxy`, `State`) → `proxy::state`).
type Reexports = BTreeMap<(Module, String), Module>;

/// The re-exports of the file of `module`.
fn reexports_in(text: &str, module: &Module, modules: &BTreeSet<Module>, out: &mut Reexports) {
    let code: Vec<char> = code_of(text).chars().collect();
    let mut i = 0;
    while i < code.len() {
        let Some((word, end)) = ident_at(&code, i).filter(|_| !ident_before(&code, i)) else {
            i += 1;
            continue;
        };
        if word == "use" && pub_before(&code, i) {
            let mut paths = Vec::new();
            use_tree(&code, end, &Vec::new(), &mut paths);
            for path in paths {
                let Some((item, at)) = path.split_last() else { continue };
                let from: Module = match at.first().map(String::as_str) {
                    Some("crate") => at[1..].to_vec(),
                    Some("self") => module.iter().chain(&at[1..]).cloned().collect(),
                    Some("super") => continue,
                    _ => module.iter().chain(at).cloned().collect(),
                };
                let to = resolve(&from, modules);
                if to.len() > module.len() && to.starts_with(module) {
                    out.insert((module.clone(), item.clone()), to);
                }
            }
        }
        i = end;
    }
}

/// Whether `pub` or `pub(…)` comes just before `at`.
fn pub_before(code: &[char], at: usize) -> bool {
    let mut j = at;
    while j > 0 && code[j - 1].is_whitespace() {
        j -= 1;
    }
    if j > 0 && code[j - 1] == ')' {
        while j > 0 && code[j - 1] != '(' {
            j -= 1;
        }
        j = j.saturating_sub(1);
    }
    j >= 3 && code[j - 3..j].iter().collect::<String>() == "pub" && !ident_before(code, j - 3)
}

/// The module `path` names: the longest module prefix, followed through
/// the re-export of the item after it, if that is one.
fn resolve_through(path: &Module, modules: &BTreeSet<Module>, reexports: &Reexports) -> Module {
    let mut to = resolve(path, modules);
    while let Some(next) = path
        .get(to.len())
        .and_then(|item| reexports.get(&(to.clone(), item.clone())))
    {
        to = next.clone();
    }
    to
}

/// Whether `module` is inside one of the [`STRICT`] modules.
fn strict(module: &Module) -> bool {
    module.first().is_some_and(|top| STRICT.contains(&top.as_str()))
}

/// The edge that `from` naming `to` makes: between siblings under their
/// closest common ancestor, or, inside a [`STRICT`] module, between a
/// parent's file and the child below it on the way.
fn edge(from: &Module, to: &Module) -> Option<(String, String)> {
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    if common == from.len() && common == to.len() {
        return None;
    }
    if common == from.len() || common == to.len() {
        if !(strict(from) && strict(to)) {
            return None;
        }
        return Some((
            from[..(common + 1).min(from.len())].join("::"),
            to[..(common + 1).min(to.len())].join("::"),
        ));
    }
    Some((from[..=common].join("::"), to[..=common].join("::")))
}

fn add_edges(text: &str, file: &Module, modules: &BTreeSet<Module>, reexports: &Reexports, graph: &mut Graph) {
    for (here, path) in names_in(text, file) {
        let to = resolve_through(&path, modules, reexports);
        if let Some((a, b)) = edge(&here, &to) {
            graph.entry(a).or_default().insert(b);
        }
    }
}

fn files(dir: &Path, src: &Path, out: &mut Vec<(Module, String)>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable").filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            files(&path, src, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(src).expect("below src/");
            if let Some(module) = module_of(rel) {
                out.push((module, std::fs::read_to_string(&path).expect("source is UTF-8")));
            }
        }
    }
}

/// One cycle through `start`, as the path of modules, if there is one.
fn cycle_through(graph: &Graph, start: &str) -> Option<Vec<String>> {
    let mut stack = vec![vec![start.to_string()]];
    let mut seen = BTreeSet::new();
    while let Some(path) = stack.pop() {
        let last = path.last().expect("never empty").clone();
        for next in graph.get(&last).into_iter().flatten() {
            if next == start {
                let mut cycle = path.clone();
                cycle.push(next.clone());
                return Some(cycle);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push(longer);
            }
        }
    }
    None
}

fn graph_of(sources: &[(Module, String)]) -> Graph {
    let modules: BTreeSet<Module> = sources.iter().map(|(m, _)| m.clone()).collect();
    let mut reexports = Reexports::new();
    for (module, text) in sources {
        reexports_in(text, module, &modules, &mut reexports);
    }
    let mut graph = Graph::new();
    for (module, text) in sources {
        add_edges(text, module, &modules, &reexports, &mut graph);
    }
    graph
}

fn cycles(graph: &Graph) -> BTreeSet<String> {
    graph
        .keys()
        .filter_map(|m| cycle_through(graph, m))
        .map(|mut c| {
            // One spelling per cycle: started at its least module.
            c.pop();
            let least = c.iter().enumerate().min_by_key(|(_, m)| *m).map_or(0, |(i, _)| i);
            c.rotate_left(least);
            let first = c[0].clone();
            c.push(first);
            c.join(" -> ")
        })
        .collect()
}

#[test]
fn imports_between_the_modules_of_src_run_one_way() {
    let src = root().join("src");
    let mut sources = Vec::new();
    files(&src, &src, &mut sources);
    let read: BTreeSet<String> = sources.iter().map(|(m, _)| m.join("::")).collect();
    for nested in ["ledger::file", "ledger::file::disk", "ledger::saved", "server::conns"] {
        assert!(read.contains(nested), "every module is read, nested ones too: {read:?}");
    }
    let graph = graph_of(&sources);
    assert!(
        graph.get("proxy").is_some_and(|to| to.contains("app")),
        "the reader sees proxy -> app: {graph:?}"
    );
    assert!(
        graph.get("ledger::file").is_some_and(|to| to.contains("ledger::saved")),
        "the reader sees edges inside a module (ledger::file -> ledger::saved): {graph:?}"
    );
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "import cycles between modules of src/:\n  {}",
        found.iter().map(String::as_str).collect::<Vec<_>>().join("\n  ")
    );
    assert!(
        graph
            .get("server::conns")
            .is_some_and(|to| to.contains("server::overload")),
        "the reader sees server::conns -> server::overload: {graph:?}"
    );
}

fn module(path: &str) -> Module {
    path.split("::").map(str::to_string).collect()
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let modules: BTreeSet<Module> = ["app", "proxy"].map(module).into();
    let mut graph = Graph::new();
    let app = "use crate::proxy::ParsedTargets; // crate::ignored\nconst S: &str = \"crate::ignored\";";
    add_edges(app, &module("app"), &modules, &Reexports::new(), &mut graph);
    add_edges(
        "use crate::app::App;",
        &module("proxy"),
        &modules,
        &Reexports::new(),
        &mut graph,
    );
    assert_eq!(
        graph["app"],
        BTreeSet::from(["proxy".to_string()]),
        "comments and strings are not imports"
    );
    assert_eq!(
        cycle_through(&graph, "app"),
        Some(vec!["app".to_string(), "proxy".to_string(), "app".to_string()])
    );
}

#[test]
fn the_cycle_finder_finds_a_cycle_inside_a_module() {
    // The hold log of issue 30: `disk` and `log` used each other.
    let modules: BTreeSet<Module> = [
        "ledger",
        "ledger::file",
        "ledger::file::disk",
        "ledger::file::log",
        "ledger::saved",
    ]
    .map(module)
    .into();
    let sources = [
        (
            module("ledger::file::disk"),
            "use super::super::saved::{SavedTally, FLUSH_EVERY};\nuse super::log::{self, HoldLog};\n\
             use super::super::{UsageRow, UNSETTLED};\nfn f() { let s = format!(\"{x}\"); }",
        ),
        (module("ledger::file::log"), "use super::disk::Op;"),
        (
            module("ledger::file"),
            "mod disk;\nuse disk::{Op, Write};\nuse super::saved::SavedTally;\n\
             #[cfg(test)]\nmod tests {\n    use super::disk::Op;\n    use super::super::saved::X;\n}",
        ),
    ];
    let mut graph = Graph::new();
    for (m, text) in sources {
        add_edges(text, &m, &modules, &Reexports::new(), &mut graph);
    }
    assert_eq!(
        graph.get("ledger::file::disk"),
        Some(&BTreeSet::from(["ledger::file::log".to_string()])),
        "a sibling through super::, with braces; a parent's items are no edge: {graph:?}"
    );
    assert_eq!(
        graph.get("ledger::file"),
        Some(&BTreeSet::from(["ledger::saved".to_string()])),
        "a child's path up to an uncle counts at the level they share; an inline \
         mod's super:: is its file's module: {graph:?}"
    );
    assert_eq!(
        cycles(&graph),
        BTreeSet::from(["ledger::file::disk -> ledger::file::log -> ledger::file::disk".to_string()])
    );
}

#[test]
fn a_reexport_hides_no_cycle_and_the_request_path_has_no_file_cycle() {
    // The cycle a re-export hid: `state` used `by_id`, and `by_id` used
    // `super::State`, which `proxy` re-exports from `state`.
    let modules: BTreeSet<Module> = ["proxy", "proxy::state", "proxy::by_id"].map(module).into();
    let sources = [
        (module("proxy"), "mod by_id;\nmod state;\npub use state::State;"),
        (module("proxy::state"), "use super::by_id::IdFlights;"),
        (module("proxy::by_id"), "use super::State;"),
    ];
    let mut reexports = Reexports::new();
    for (m, text) in &sources {
        reexports_in(text, m, &modules, &mut reexports);
    }
    assert_eq!(
        reexports.get(&(module("proxy"), "State".into())),
        Some(&module("proxy::state"))
    );
    let mut graph = Graph::new();
    for (m, text) in &sources {
        add_edges(text, m, &modules, &reexports, &mut graph);
    }
    assert_eq!(
        cycles(&graph),
        BTreeSet::from(["proxy::by_id -> proxy::state -> proxy::by_id".to_string()])
    );
    // Under `proxy` a child naming its parent's items, while the parent
    // calls the child, is a cycle of two files.
    let modules: BTreeSet<Module> = ["proxy", "proxy::reuse", "proxy::reuse::turn"].map(module).into();
    let sources = [
        (
            module("proxy::reuse"),
            "mod turn;\npub struct Held;\nfn f() { turn::buy(); }",
        ),
        (module("proxy::reuse::turn"), "use super::Held;\npub fn buy() {}"),
    ];
    let mut graph = Graph::new();
    for (m, text) in &sources {
        add_edges(text, m, &modules, &Reexports::new(), &mut graph);
    }
    assert_eq!(
        cycles(&graph),
        BTreeSet::from(["proxy::reuse -> proxy::reuse::turn -> proxy::reuse".to_string()])
    );
}
