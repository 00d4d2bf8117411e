//! The glossary (docs/design.md §7) is the code's vocabulary: every code
//! name it cites in backticks is defined in `src/` (a type, a function, a
//! variant or a field of the type it is cited with), and every retired
//! name is defined nowhere, so a word keeps one sense as the code moves.

use super::{root, sources};

/// §7's text: its cited names, and the names it retires.
fn glossary() -> (Vec<String>, Vec<String>) {
    let design = std::fs::read_to_string(root().join("docs/design.md")).expect("docs/design.md");
    let start = design
        .find("\n## 7. Glossary")
        .expect("docs/design.md has §7, the glossary");
    let text = &design[start..];
    let (cited, retired) = text.split_once("Retired names").expect("§7 lists retired names");
    (code_names(cited), code_names(retired))
}

/// The backticked spans of `text` that are code names: `Name`, `name` or
/// `Type::name` (paths and phrases are not).
fn code_names(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| {
            let parts: Vec<&str> = span.split("::").collect();
            parts.len() <= 2 && parts.iter().all(|p| is_ident(p))
        })
        .map(str::to_string)
        .collect()
}

fn is_ident(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `code` declares an item `name` of one of `kinds`.
fn declares(code: &str, kinds: &[&str], name: &str) -> bool {
    code.lines().any(|line| {
        let words: Vec<&str> = line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).collect();
        words.windows(2).any(|w| kinds.contains(&w[0]) && w[1] == name)
    })
}

/// Whether `code` has a member `name` (a function, a variant, a field)
/// in the body of type `ty`'s declaration or of one of its `impl`s.
fn has_member(code: &str, ty: &str, name: &str) -> bool {
    let opens = [
        format!("struct {ty}"),
        format!("enum {ty}"),
        format!("trait {ty}"),
        format!("impl {ty}"),
    ];
    let lines: Vec<&str> = code.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let opened = opens.iter().any(|o| {
            line.contains(o.as_str())
                && !line[line.find(o.as_str()).unwrap_or(0) + o.len()..]
                    .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
        });
        if !opened {
            continue;
        }
        let mut depth = 0i32;
        for body in &lines[i..] {
            let t = body.trim_start();
            let named = t.contains(&format!("fn {name}("))
                || t.contains(&format!("fn {name}<"))
                || t.starts_with(&format!("{name},"))
                || t.starts_with(&format!("{name}("))
                || t.starts_with(&format!("{name} {{"))
                || t.starts_with(&format!("{name}:"))
                || t.contains(&format!(" {name}:"));
            if depth == 1 && named {
                return true;
            }
            depth += body.matches('{').count() as i32 - body.matches('}').count() as i32;
            if depth <= 0 && body.contains('}') {
                break;
            }
        }
    }
    false
}

/// Whether the name is defined anywhere in `src/`.
fn defined(code: &[String], name: &str) -> bool {
    match name.split_once("::") {
        Some((ty, member)) => code.iter().any(|c| has_member(c, ty, member)),
        None => {
            let kinds = ["struct", "enum", "trait", "type", "fn", "mod", "const"];
            code.iter().any(|c| declares(c, &kinds, name))
        }
    }
}

fn src() -> Vec<String> {
    let mut files = Vec::new();
    sources(&root().join("src"), &mut files);
    // Comments dropped: a word in a comment defines nothing.
    files
        .into_iter()
        .map(|(_, text)| {
            let code: Vec<&str> = text.lines().map(|l| l.split("//").next().unwrap_or("")).collect();
            code.join("\n")
        })
        .collect()
}

#[test]
fn every_name_the_glossary_cites_is_the_codes_and_no_retired_name_is() {
    let (cited, retired) = glossary();
    assert!(cited.len() >= 20, "the glossary cites its code names: {cited:?}");
    assert!(!retired.is_empty(), "the glossary lists retired names");
    let code = src();
    let missing: Vec<&String> = cited.iter().filter(|n| !defined(&code, n)).collect();
    assert!(
        missing.is_empty(),
        "cited by the glossary, defined nowhere in src/: {missing:?}"
    );
    let back: Vec<&String> = retired.iter().filter(|n| defined(&code, n)).collect();
    assert!(
        back.is_empty(),
        "retired by the glossary, defined again in src/: {back:?}"
    );
}

#[test]
fn the_glossary_readers_find_what_they_should() {
    let code = "pub struct Team {\n    pub(crate) members: Vec<u8>,\n}\nimpl Team {\n    pub(crate) fn member(&self) {}\n}\npub enum Acquired {\n    Owned(u8),\n    Taken,\n}\n".to_string();
    let code = vec![code];
    for name in [
        "Team",
        "Team::member",
        "Team::members",
        "Acquired::Taken",
        "Acquired::Owned",
    ] {
        assert!(defined(&code, name), "{name}");
    }
    for name in ["Team::app", "Acquired::Held", "Turn", "members_of"] {
        assert!(!defined(&code, name), "{name}");
    }
    assert_eq!(
        code_names("`App` (`src/app.rs`), `Team::member`, `a phrase`, `is_over_limit`"),
        ["App", "Team::member", "is_over_limit"]
    );
}
