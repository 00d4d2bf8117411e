//! The crate doc (`src/lib.rs`) says imports between the modules of `src/`
//! run one way. A cycle (`app` importing from `proxy` while `proxy` imports
//! `app`) means neither side can be read or changed alone; this keeps the
//! claim true. An edge is a `crate::module` path outside a comment, in any
//! file of one top-level module, naming another.

use super::root;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The top-level module a file of `src/` belongs to; `None` for the crate
/// root (`lib.rs`, `main.rs`), which wires everything.
fn module_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_string_lossy().into_owned();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_string();
    (name != "lib" && name != "main").then_some(name)
}

fn edges_in(text: &str, from: &str, graph: &mut Graph) {
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        for (i, _) in code.match_indices("crate::") {
            let to: String = code[i + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !to.is_empty() && to != from {
                graph.entry(from.to_string()).or_default().insert(to);
            }
        }
    }
}

fn collect(dir: &Path, src: &Path, graph: &mut Graph) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable").filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            collect(&path, src, graph);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(src).expect("below src/");
            if let Some(from) = module_of(rel) {
                let text = std::fs::read_to_string(&path).expect("source is UTF-8");
                edges_in(&text, &from, graph);
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

#[test]
fn imports_between_the_modules_of_src_run_one_way() {
    let src = root().join("src");
    let mut graph = Graph::new();
    collect(&src, &src, &mut graph);
    assert!(
        graph.get("proxy").is_some_and(|to| to.contains("app")),
        "the reader sees proxy -> app: {graph:?}"
    );
    let cycles: Vec<String> = graph
        .keys()
        .filter_map(|m| cycle_through(&graph, m))
        .map(|c| c.join(" -> "))
        .collect();
    assert!(
        cycles.is_empty(),
        "import cycles between modules of src/:\n  {}",
        cycles.join("\n  ")
    );
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let mut graph = Graph::new();
    edges_in("use crate::proxy::ParsedTargets; // crate::ignored", "app", &mut graph);
    edges_in("use crate::app::App;", "proxy", &mut graph);
    assert_eq!(
        graph["app"],
        BTreeSet::from(["proxy".to_string()]),
        "comments are not imports"
    );
    assert_eq!(
        cycle_through(&graph, "app"),
        Some(vec!["app".to_string(), "proxy".to_string(), "app".to_string()])
    );
}
