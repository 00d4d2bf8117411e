//! The phases of a request are cited by name, never by number: every phase
//! docs/design.md §2 names (a list item opening with **`name`**) is a
//! function of `src/proxy/`; the top-level ones are called in
//! `src/proxy/mod.rs` in the order §2 lists them, and the crate doc and the
//! README list them in that order too. No comment or doc under
//! `src/proxy/` numbers a phase.

use super::{root, sources};

/// The phases §2 names: (name, whether it is a top-level phase of the
/// pipeline rather than a step inside one).
fn cited_phases() -> Vec<(String, bool)> {
    let design = std::fs::read_to_string(root().join("docs/design.md")).expect("docs/design.md");
    let start = design.find("\n## 2. ").expect("docs/design.md has §2");
    let end = start + design[start..].find("\n## 3. ").expect("docs/design.md has §3");
    let mut phases = Vec::new();
    for line in design[start..end].lines() {
        let item = line.trim_start();
        let Some(rest) = item.strip_prefix("- **`") else {
            continue;
        };
        let Some(name) = rest.split("`**").next().filter(|n| rest.contains("`**") && is_ident(n)) else {
            continue;
        };
        phases.push((name.to_string(), line.len() == item.len()));
    }
    phases
}

fn is_ident(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `text` defines a function `name` (any visibility, async or not).
fn defines(text: &str, name: &str) -> bool {
    text.lines().any(|line| {
        let code = line.split("//").next().unwrap_or("").trim_start();
        let Some(at) = code.find("fn ") else { return false };
        let prefix = &code[..at];
        let declared = prefix
            .split_whitespace()
            .all(|w| w == "async" || w == "const" || w == "pub" || w.starts_with("pub("));
        let after = &code[at + 3..];
        declared && after.starts_with(name) && after[name.len()..].starts_with(['(', '<'])
    })
}

/// Where `name` is first called in `code` (a call, not a method call nor
/// the definition): `name(`, `module::name(` or `name::<`.
fn first_call(code: &str, name: &str) -> Option<usize> {
    code.match_indices(name).map(|(i, _)| i).find(|&i| {
        let before = &code[..i];
        let after = &code[i + name.len()..];
        let boundary = before
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'));
        boundary && !before.ends_with("fn ") && (after.starts_with('(') || after.starts_with("::<"))
    })
}

/// The code of `src/proxy/mod.rs` from `fn pipeline` on, comments removed.
fn pipeline_code() -> String {
    let text = std::fs::read_to_string(root().join("src/proxy/mod.rs")).expect("src/proxy/mod.rs");
    let code: Vec<&str> = text.lines().map(|l| l.split("//").next().unwrap_or("")).collect();
    let code = code.join("\n");
    let start = code.find("fn pipeline").expect("src/proxy/mod.rs has fn pipeline");
    code[start..].to_string()
}

/// Whether `names` occur in `text` (as `` `name` ``) in this order, each
/// first occurrence after the one before.
fn in_order(text: &str, names: &[&str]) -> Result<(), String> {
    let mut last = 0;
    for name in names {
        let at = text
            .find(&format!("`{name}`"))
            .ok_or_else(|| format!("`{name}` is not listed"))?;
        if at < last {
            return Err(format!("`{name}` is listed out of order"));
        }
        last = at;
    }
    Ok(())
}

#[test]
fn every_phase_the_design_names_is_a_function_of_the_proxy_called_in_that_order() {
    let phases = cited_phases();
    assert!(phases.len() >= 15, "docs/design.md §2 names its phases: {phases:?}");
    let mut files = Vec::new();
    sources(&root().join("src/proxy"), &mut files);
    let missing: Vec<&str> = phases
        .iter()
        .map(|(name, _)| name.as_str())
        .filter(|name| !files.iter().any(|(_, text)| defines(text, name)))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/design.md §2 names phases that are no function of src/proxy/: {missing:?}"
    );
    let code = pipeline_code();
    let top: Vec<&str> = phases.iter().filter(|(_, top)| *top).map(|(n, _)| n.as_str()).collect();
    let mut last = (0, "the start of fn pipeline");
    for name in &top {
        let at = first_call(&code, name).unwrap_or_else(|| panic!("src/proxy/mod.rs never calls {name}"));
        assert!(
            at > last.0,
            "src/proxy/mod.rs calls {name} before {}, docs/design.md §2 lists it after",
            last.1
        );
        last = (at, name);
    }
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).expect("src/lib.rs");
    let lib = &lib[lib.find("# The life of a request").expect("the crate doc's phase list")..];
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let readme = &readme[readme.find("## How it works").expect("README's How it works")..];
    for (what, text) in [("src/lib.rs", lib), ("README.md", readme)] {
        if let Err(e) = in_order(text, &top) {
            panic!("{what}'s list of phases differs from docs/design.md §2: {e}");
        }
    }
}

/// Whether a line's comment numbers a phase: `phase 7`, `steps 8–13`,
/// `// 7a.` opening it, or `(cont.)`.
fn numbers_a_phase(line: &str) -> bool {
    let Some(comment) = line.find("//").map(|i| &line[i..]) else {
        return false;
    };
    let words: Vec<&str> = comment.split_whitespace().collect();
    let is_number = |w: &str| {
        let w = w.trim_end_matches(['.', ',', ':', ')']).trim_start_matches('(');
        let digits = w.trim_end_matches(|c: char| c.is_ascii_lowercase());
        !digits.is_empty()
            && digits
                .split(['–', '-'])
                .all(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
    };
    let cites = words.windows(2).any(|w| {
        let word = w[0].to_ascii_lowercase();
        matches!(word.trim_start_matches('('), "phase" | "phases" | "step" | "steps") && is_number(w[1])
    });
    let opens = words.get(1).is_some_and(|w| w.ends_with('.') && is_number(w));
    cites || opens || comment.contains("(cont.)")
}

#[test]
fn no_phase_under_src_proxy_is_numbered() {
    let mut files = Vec::new();
    sources(&root().join("src/proxy"), &mut files);
    let numbered: Vec<String> = files
        .iter()
        .flat_map(|(path, text)| {
            text.lines()
                .enumerate()
                .filter(|(_, line)| numbers_a_phase(line))
                .map(move |(n, line)| format!("{path}:{}: {}", n + 1, line.trim()))
        })
        .collect();
    assert!(
        numbered.is_empty(),
        "numbered phases under src/proxy/ (cite phases by name):\n  {}",
        numbered.join("\n  ")
    );
}

#[test]
fn the_readers_find_what_they_should() {
    assert!(defines(
        "    pub(super) async fn held_answer<B>(app: &App)",
        "held_answer"
    ));
    assert!(defines("fn admit<B>(", "admit"));
    assert!(!defines("fn admitted(", "admit"));
    assert!(!defines("// fn admit(", "admit"));
    let code = "fn a() { x.lookup(1); fn lookup(k) {} by_id::lookup(2); }";
    assert_eq!(first_call(code, "lookup"), code.find("lookup(2)"));
    assert_eq!(in_order("`a` then `b`", &["a", "b"]), Ok(()));
    assert!(in_order("`b` then `a`", &["a", "b"]).is_err());
    for numbered in [
        "    // 7a. An id lookup",
        "    // 12. Settle",
        "//! The miss path (phases 8–13): coalesce",
        "/// Phase 1: refuses",
        "    // 3. (cont.) An HTTP/2 stream",
        "//! before phase 9, while",
    ] {
        assert!(numbers_a_phase(numbered), "{numbered}");
    }
    for plain in [
        "    // A 402 by a budget, 2 calls a second.",
        "/// Milliseconds: 12.345, not 12.3.",
        "let phase = 7; // by name",
    ] {
        assert!(!numbers_a_phase(plain), "{plain}");
    }
}
