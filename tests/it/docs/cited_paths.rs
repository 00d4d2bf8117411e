//! A cited path that does not exist sends a newcomer nowhere: every
//! repository path a document (`*.md` anywhere) or a comment (Rust, Python,
//! shell, TOML, YAML, JS, Dockerfile) cites must exist.
//!
//! A citation is a token that starts with a top-level directory of the
//! repository (`src/proxy/mod.rs`, `tests/it/...`, `config/defaults.toml`),
//! any token naming a Markdown file (`design.md`, `docs/design.md#anchor`),
//! or a Markdown link's target. It may carry a `:line`, `:line-line` or `#anchor`
//! suffix, end in `...` (a directory), or be a glob (`tests/it/*.rs`,
//! `src/**/mod.rs`, `bench/{run,lib}.py`). It is resolved from the
//! repository root and from the citing file's directory; a bare Markdown
//! file name may be anywhere in the repository. URLs and paths inside other
//! repositories (`ShovelsAI/shovels-cli/cmd/...`: not at a token's start)
//! are not citations.

use super::root;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Never searched: build output, version control, installed dependencies.
const SKIP_DIRS: &[&str] = &["target", ".git", "node_modules", "__pycache__", ".venv"];

/// Characters a cited path is made of (braces are handled apart).
fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_./*?~:#-".contains(c)
}

/// The repository as the test sees it: files relative to the root.
struct Repo {
    root: PathBuf,
    files: Vec<PathBuf>,
    /// Top-level directories: a token starting `name/` cites a path.
    tops: BTreeSet<String>,
    /// Every file name, for bare Markdown file names.
    names: BTreeSet<String>,
}

impl Repo {
    fn read(root: PathBuf) -> Repo {
        let mut files = Vec::new();
        walk(&root, Path::new(""), &mut files);
        let tops = std::fs::read_dir(&root)
            .expect("repository root is readable")
            .filter_map(Result::ok)
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| !SKIP_DIRS.contains(&name.as_str()))
            .collect();
        let names = files
            .iter()
            .filter_map(|f| f.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .collect();
        Repo {
            root,
            files,
            tops,
            names,
        }
    }

    /// Whether `cited` (suffixes already removed) names something that
    /// exists, from the root or from `dir` (the citing file's directory).
    fn exists(&self, cited: &str, dir: &Path) -> bool {
        let cited = cited.strip_suffix("...").unwrap_or(cited);
        expand_braces(cited).iter().all(|one| {
            [self.root.clone(), self.root.join(dir)]
                .iter()
                .any(|base| matches_something(base, one))
        })
    }
}

fn walk(root: &Path, rel: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(root.join(rel)) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let path = rel.join(&name);
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() {
            if !SKIP_DIRS.contains(&name.to_string_lossy().as_ref()) {
                walk(root, &path, files);
            }
        } else {
            files.push(path);
        }
    }
}

/// `a/{b,c}.rs` → `a/b.rs`, `a/c.rs` (nested braces too).
fn expand_braces(path: &str) -> Vec<String> {
    let Some(open) = path.find('{') else {
        return vec![path.to_string()];
    };
    let Some(close) = path[open..].find('}').map(|i| open + i) else {
        return vec![path.to_string()];
    };
    path[open + 1..close]
        .split(',')
        .flat_map(|alt| expand_braces(&format!("{}{alt}{}", &path[..open], &path[close + 1..])))
        .collect()
}

/// Whether a path, glob segments allowed (`*`, `?`, `**`), matches at
/// least one file or directory below `base`.
fn matches_something(base: &Path, pattern: &str) -> bool {
    let segments: Vec<&str> = pattern.split('/').filter(|s| !s.is_empty() && *s != ".").collect();
    matches_from(base, &segments)
}

fn matches_from(dir: &Path, segments: &[&str]) -> bool {
    let Some((first, rest)) = segments.split_first() else {
        return dir.exists();
    };
    if *first == ".." {
        return dir.parent().is_some_and(|up| matches_from(up, rest));
    }
    if !first.contains(['*', '?']) {
        return matches_from(&dir.join(first), rest);
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    let entries: Vec<PathBuf> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    if *first == "**" {
        // Zero directories, or one more and still `**`.
        return matches_from(dir, rest) || entries.iter().filter(|e| e.is_dir()).any(|e| matches_from(e, segments));
    }
    entries.iter().any(|e| {
        e.file_name()
            .is_some_and(|n| wildcard(first.as_bytes(), n.to_string_lossy().as_bytes()))
            && matches_from(e, rest)
    })
}

/// `*` and `?` within one path segment.
fn wildcard(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.split_first(), name.split_first()) {
        (None, None) => true,
        (Some((b'*', p)), _) => wildcard(p, name) || (!name.is_empty() && wildcard(pattern, &name[1..])),
        (Some((b'?', p)), Some((_, n))) => wildcard(p, n),
        (Some((a, p)), Some((b, n))) if a == b => wildcard(p, n),
        _ => false,
    }
}

/// The path-like tokens of one line: maximal runs of path characters (and
/// `{a,b}` groups), each with its byte offset.
fn tokens(line: &str) -> Vec<(usize, &str)> {
    let mut found = Vec::new();
    let mut start = None;
    let mut braces = 0;
    for (i, c) in line.char_indices() {
        let inside = is_path_char(c) || c == '{' || (braces > 0 && (c == ',' || c == '}'));
        match c {
            '{' => braces += 1,
            '}' if braces > 0 => braces -= 1,
            _ => {}
        }
        match (inside, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                found.push((s, &line[s..i]));
                start = None;
                braces = 0;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        found.push((s, &line[s..]));
    }
    found
}

/// A token without what follows the path: trailing punctuation, `#anchor`,
/// `:line`, `:line-line`, `:line:col`.
fn strip_suffixes(token: &str) -> &str {
    let mut path = token.split('#').next().unwrap_or(token);
    loop {
        let before = path;
        if !path.ends_with("...") {
            path = path.trim_end_matches([',', ';', '!', '?', ':']);
            if path.ends_with('.') && !path.ends_with("..") {
                path = &path[..path.len() - 1];
            }
        }
        if let Some((head, tail)) = path.rsplit_once(':') {
            if !tail.is_empty() && tail.chars().all(|c| c.is_ascii_digit() || c == '-') {
                path = head;
            }
        }
        if path == before {
            return path;
        }
    }
}

/// What part of each line of a file is prose: all of a Markdown file, the
/// comments of code, and Python docstrings. `None`: not read at all.
fn prose_lines(path: &Path, text: &str) -> Option<Vec<(usize, String)>> {
    let name = path.file_name()?.to_string_lossy();
    let ext = path.extension().map(|e| e.to_string_lossy().into_owned());
    let marker = match ext.as_deref() {
        Some("md") => "",
        Some("rs" | "mjs" | "js") => "//",
        Some("py" | "sh" | "toml" | "yml" | "yaml") => "#",
        _ if name == "Dockerfile" || text.starts_with("#!") => "#",
        _ => return None,
    };
    let mut lines = Vec::new();
    let mut in_docstring = false;
    for (n, line) in text.lines().enumerate() {
        let quotes = line.matches("\"\"\"").count();
        let prose = if marker.is_empty() || in_docstring || (ext.as_deref() == Some("py") && quotes > 0) {
            Some(line)
        } else {
            line.find(marker).map(|i| &line[i..])
        };
        if ext.as_deref() == Some("py") && quotes % 2 == 1 {
            in_docstring = !in_docstring;
        }
        if let Some(prose) = prose {
            lines.push((n + 1, prose.to_string()));
        }
    }
    Some(lines)
}

/// Every citation in one line that names nothing.
fn broken_in_line(repo: &Repo, file: &Path, line: &str) -> Vec<String> {
    let dir = file.parent().unwrap_or(Path::new(""));
    let markdown = file.extension().is_some_and(|e| e == "md");
    let mut broken = Vec::new();
    for (at, token) in tokens(line) {
        if token.contains("://") || token.starts_with('/') {
            continue;
        }
        let path = strip_suffixes(token);
        let top = path.split('/').next().unwrap_or("");
        let cites_top = path.contains('/') && repo.tops.contains(top);
        let link = markdown && line[..at].ends_with("](");
        let names_md = path.ends_with(".md");
        if !(cites_top || link || names_md) || path.is_empty() {
            continue;
        }
        let bare_md = names_md && !path.contains('/') && repo.names.contains(path);
        if !bare_md && !repo.exists(path, dir) {
            broken.push(path.to_string());
        }
    }
    broken
}

#[test]
fn every_path_a_doc_or_comment_cites_exists() {
    let repo = Repo::read(root());
    assert!(
        repo.tops.contains("src") && repo.files.len() > 50,
        "the walk found the repository"
    );
    let mut broken = Vec::new();
    let mut read = 0;
    for file in &repo.files {
        let Ok(text) = std::fs::read_to_string(repo.root.join(file)) else {
            continue; // not text
        };
        let Some(lines) = prose_lines(file, &text) else {
            continue;
        };
        read += 1;
        for (n, line) in lines {
            for path in broken_in_line(&repo, file, &line) {
                broken.push(format!("{}:{n}: {path}", file.display()));
            }
        }
    }
    assert!(read > 50, "only {read} files read");
    assert!(
        broken.is_empty(),
        "cited paths that do not exist (fix the citation, or the path):\n  {}",
        broken.join("\n  ")
    );
}

#[test]
fn the_citation_reader_finds_what_it_should() {
    let repo = Repo::read(root());
    let here = Path::new("docs/x.md");
    let broken = |line: &str| broken_in_line(&repo, here, line);
    // Real paths in every accepted form.
    for ok in [
        "see `src/lib.rs:12` and src/proxy/mod.rs:3-9, or tests/it/main.rs.",
        "[design](design.md#2-the-life-of-a-request), `docs/operations.md#configuration-keys`",
        "globs: `tests/it/*.rs`, `src/**/mod.rs`, `bench/{run,lib}.py`, `tests/it/...`",
        "README.md, `config/defaults.toml`, https://example.com/src/gone.rs, owner/repo/src/gone.rs",
    ] {
        assert_eq!(broken(ok), Vec::<String>::new(), "{ok}");
    }
    assert_eq!(broken("in `src/route.rs:40`."), ["src/route.rs"]);
    assert_eq!(broken("see upstream-research.md §3"), ["upstream-research.md"]);
    assert_eq!(broken("[x](../src/gone.rs)"), ["../src/gone.rs"]);
    assert_eq!(broken("`tests/it/*.nothing`"), ["tests/it/*.nothing"]);
    assert_eq!(broken("`bench/{run,gone}.py`"), ["bench/{run,gone}.py"]);
    let code = prose_lines(Path::new("src/x.rs"), "let a = \"src/gone.rs\"; // src/lib.rs\n").expect("rs");
    assert_eq!(
        code,
        [(1, "// src/lib.rs".to_string())],
        "only the comment of a code line"
    );
}
