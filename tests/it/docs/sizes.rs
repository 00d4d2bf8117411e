//! Sizes a reader can hold: no file of `src/` over 700 lines and no
//! function over 120, so that one idea lives in a file one can read whole
//! and a function says one thing (a longer one is a split waiting to
//! happen).

use super::{root, sources};

const MAX_FILE_LINES: usize = 700;
const MAX_FN_LINES: usize = 120;

/// A line without its comment, strings and character literals, so that
/// braces in them do not count.
fn code_of(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => break,
            '"' => {
                while let Some(s) = chars.next() {
                    match s {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            // A char literal ('{', '\n'), not a lifetime ('a).
            '\'' => {
                let rest: String = chars.clone().take(3).collect();
                if rest.starts_with('\\') {
                    for _ in 0..3 {
                        chars.next();
                    }
                } else if rest.chars().nth(1) == Some('\'') {
                    chars.next();
                    chars.next();
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// Whether a line (its code) opens a function: `fn name(` or `fn name<`
/// after nothing but qualifiers.
fn opens_fn(code: &str) -> Option<String> {
    let t = code.trim_start();
    let at = t.find("fn ")?;
    let qualifiers = &t[..at];
    let plain = qualifiers
        .split_whitespace()
        .all(|w| matches!(w, "pub" | "async" | "const" | "unsafe" | "extern" | "default") || w.starts_with("pub("));
    let name: String = t[at + 3..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (plain && !name.is_empty()).then_some(name)
}

/// Each function of `text` with its length in lines, from its `fn` line
/// to the line that closes its body (a declaration without a body, ending
/// in `;`, is none).
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<String> = text.lines().map(code_of).collect();
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(name) = opens_fn(line) else { continue };
        let mut depth = 0i64;
        let mut opened = false;
        for (i, l) in lines.iter().enumerate().skip(start) {
            if !opened && l.contains(';') && !l.contains('{') {
                break;
            }
            for c in l.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if opened && depth <= 0 {
                found.push((name.clone(), start + 1, i - start + 1));
                break;
            }
        }
    }
    found
}

#[test]
fn no_file_of_src_is_over_700_lines_and_no_function_over_120() {
    let mut files = Vec::new();
    sources(&root().join("src"), &mut files);
    let mut over = Vec::new();
    for (path, text) in &files {
        let path = path.strip_prefix(&format!("{}/", root().display())).unwrap_or(path);
        let n = text.lines().count();
        if n > MAX_FILE_LINES {
            over.push(format!("{path}: {n} lines"));
        }
        for (name, line, len) in functions(text) {
            if len > MAX_FN_LINES {
                over.push(format!("{path}:{line}: fn {name}, {len} lines"));
            }
        }
    }
    assert!(files.len() > 100, "read src/: {} files", files.len());
    assert!(
        over.is_empty(),
        "over the sizes a reader can hold:\n  {}",
        over.join("\n  ")
    );
}

#[test]
fn the_function_reader_measures_what_it_should() {
    let text = "pub(crate) async fn a(x: u8) -> u8 {\n    let s = \"}}}\";\n    let c = '{';\n    x\n}\n\nfn b<T>(t: T)\nwhere\n    T: Copy,\n{\n}\n\ntrait X {\n    fn c(&self);\n}\n";
    let fns = functions(text);
    assert_eq!(
        fns,
        vec![("a".to_string(), 1, 5), ("b".to_string(), 7, 5)],
        "strings, chars and bodiless declarations do not confuse it"
    );
}
