//! The layering, checked: the decision core (`src/mutate.rs`, `src/mutate/**`) does no I/O and
//! imports no module of the I/O shell, so it stays a pure function a test can call with plain
//! values. ARCHITECTURE.md states the rule; this test keeps it from drifting.
//!
//! Also the size rule: no function, in the crate, its tests, benches or fuzz targets, is longer
//! than a reader can hold on one screen (`MAX_FN_LINES`).

use std::path::{Path, PathBuf};

/// Modules of the crate the core must not import (the shell around it).
const SHELL_MODULES: &[&str] = &[
    "admission",
    "app",
    "budget",
    "cli",
    "cluster",
    "cmd",
    "config",
    "fuzzing",
    "metrics",
    "registry",
    "server",
    "taints",
    "telemetry",
    "x509",
];

/// Crates and std modules that do I/O, keep time or log.
const IO_PATHS: &[&str] = &[
    "tokio",
    "reqwest",
    "hyper",
    "hyper_util",
    "kube",
    "rustls",
    "tracing",
    "moka",
    "redis",
    "std::fs",
    "std::net",
    "std::process",
    "std::time::Instant",
    "std::time::SystemTime",
    "std::env",
];

fn core_files() -> Vec<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![src.join("mutate.rs")];
    files.extend(rs_files_under(&src.join("mutate")));
    files
}

/// Every `.rs` file below `dir`, at any depth (none if `dir` does not exist).
fn rs_files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Every path the file names, as `a::b::c` runs of identifiers (comments left out).
fn paths_named(text: &str) -> Vec<String> {
    let code: String = text
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut paths = Vec::new();
    let mut current = String::new();
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            current.push(c);
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            current.push_str("::");
            i += 1;
        } else if !current.is_empty() {
            paths.push(std::mem::take(&mut current));
        }
        i += 1;
    }
    paths
}

#[test]
fn the_decision_core_imports_nothing_that_does_io() {
    let mut violations = Vec::new();
    for file in core_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for path in paths_named(&text) {
            let shell = SHELL_MODULES.iter().any(|m| {
                path.starts_with(&format!("crate::{m}"))
                    || path.starts_with(&format!("tolerable::{m}"))
            });
            // A bare word (`kube` in "kube-system") is no path; `std::fs` alone is one.
            let io = IO_PATHS
                .iter()
                .any(|p| (path == *p && p.contains("::")) || path.starts_with(&format!("{p}::")));
            if shell || io {
                violations.push(format!("{}: {path}", file.display()));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "the decision core must stay pure (ARCHITECTURE.md):\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_check_finds_what_it_must() {
    let text = "use crate::registry::ImagePlatforms;\n// crate::server in a comment\nlet t = std::time::Instant::now();\nuse tokio::sync;";
    let found: Vec<String> = paths_named(text)
        .into_iter()
        .filter(|p| p.contains("::"))
        .collect();
    assert_eq!(
        found,
        [
            "crate::registry::ImagePlatforms",
            "std::time::Instant::now",
            "tokio::sync"
        ]
    );
}

/// Longest a function may be, signature to closing brace: about one screen (issue 12).
const MAX_FN_LINES: usize = 80;

/// Where the project's hand-written Rust lives. `target/` and the fuzz crate's generated
/// corpora and artifacts are outside these, so nothing generated is measured.
const MEASURED_DIRS: &[&str] = &["src", "tests", "benches", "fuzz/fuzz_targets"];

/// The text with comments and the insides of string and char literals blanked to spaces,
/// newlines kept: a brace or a `fn` in a JSON fixture or a doc comment is then no code,
/// and line numbers still match the file.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    // Blanks chars[from..to], keeping newlines (literals and comments may span lines).
    let blank = |out: &mut String, from: usize, to: usize| {
        out.extend(
            chars[from..to]
                .iter()
                .map(|&c| if c == '\n' { c } else { ' ' }),
        );
    };
    let mut i = 0;
    while i < chars.len() {
        let rest = &chars[i..];
        let end = if rest.starts_with(&['/', '/']) {
            i + rest.iter().position(|&c| c == '\n').unwrap_or(rest.len())
        } else if rest.starts_with(&['/', '*']) {
            // Block comments nest in Rust.
            let (mut depth, mut j) = (0, i);
            loop {
                if chars[j..].starts_with(&['/', '*']) {
                    depth += 1;
                    j += 2;
                } else if chars[j..].starts_with(&['*', '/']) {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break j;
                    }
                } else {
                    j += 1;
                }
            }
        } else if let Some(end) = raw_string_end(&chars, i) {
            end
        } else if rest[0] == '"' {
            let mut j = i + 1;
            while chars[j] != '"' {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            j + 1
        } else if rest.starts_with(&['\'', '\\']) {
            i + 2 + rest[2..].iter().position(|&c| c == '\'').unwrap() + 1
        } else if rest.len() > 2 && rest[0] == '\'' && rest[2] == '\'' {
            i + 3
        } else {
            // Code, or a lifetime's quote (`'a` has no closing quote two chars on).
            out.push(rest[0]);
            i += 1;
            continue;
        };
        blank(&mut out, i, end);
        i = end;
    }
    out
}

/// Where a raw string (`r"…"`, `r#"…"#`, `br#"…"#`) starting at `i` ends, if one does;
/// a raw identifier (`r#type`) is none.
fn raw_string_end(chars: &[char], i: usize) -> Option<usize> {
    let starts_token = i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
    let r = match chars[i] {
        'r' if starts_token => i,
        'b' if starts_token && chars.get(i + 1) == Some(&'r') => i + 1,
        _ => return None,
    };
    let hashes = chars[r + 1..].iter().take_while(|&&c| c == '#').count();
    if chars.get(r + 1 + hashes) != Some(&'"') {
        return None;
    }
    let closing: Vec<char> = std::iter::once('"')
        .chain(std::iter::repeat_n('#', hashes))
        .collect();
    let body = r + 2 + hashes;
    let len = chars[body..]
        .windows(closing.len())
        .position(|w| w == closing.as_slice())?;
    Some(body + len + closing.len())
}

/// The function a line declares, if it starts one: qualifiers (`pub`, `pub(crate)`,
/// `async`, `const`, `unsafe`) then `fn name`.
fn fn_declared(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    loop {
        if let Some(after) = rest.strip_prefix("pub(") {
            rest = after.split_once(')')?.1.trim_start();
        } else if let Some(after) = ["pub ", "async ", "const ", "unsafe "]
            .iter()
            .find_map(|q| rest.strip_prefix(q))
        {
            rest = after.trim_start();
        } else {
            break;
        }
    }
    let name = rest.strip_prefix("fn ")?;
    let len = name
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(name.len());
    (len > 0).then(|| &name[..len])
}

/// Each function with a body in the code (comments and literals already blanked):
/// `(line, name, lines)`, counting from the signature line to the brace that closes the
/// body, both included. Closures and nested items count towards the function they are in;
/// a nested `fn` is also measured on its own.
fn fn_lengths(code: &str) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(name) = fn_declared(line) else {
            continue;
        };
        if let Some(end) = body_end(&lines, start) {
            found.push((start + 1, name.to_string(), end - start + 1));
        }
    }
    found
}

/// The index of the line whose `}` closes the body of the function declared on line
/// `start`. None for a bodiless declaration (a trait's required method): a `;` before the
/// body ends it, unless inside brackets, as in a parameter of type `[u8; 4]`.
fn body_end(lines: &[&str], start: usize) -> Option<usize> {
    let (mut braces, mut brackets) = (0i32, 0i32);
    for (index, line) in lines.iter().enumerate().skip(start) {
        for c in line.chars() {
            match c {
                '(' | '[' => brackets += 1,
                ')' | ']' => brackets -= 1,
                ';' if braces == 0 && brackets == 0 => return None,
                '{' => braces += 1,
                '}' => {
                    braces -= 1;
                    if braces == 0 {
                        return Some(index);
                    }
                }
                _ => {}
            }
        }
    }
    None
}

#[test]
fn no_function_is_longer_than_80_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut too_long = Vec::new();
    let mut measured = 0;
    for dir in MEASURED_DIRS {
        for file in rs_files_under(&root.join(dir)) {
            let code = code_only(&std::fs::read_to_string(&file).unwrap());
            for (line, name, lines) in fn_lengths(&code) {
                measured += 1;
                if lines > MAX_FN_LINES {
                    let file = file.strip_prefix(root).unwrap().display();
                    too_long.push(format!("{file}:{line} {name} ({lines} lines)"));
                }
            }
        }
    }
    // A scanner that found nothing would pass vacuously.
    assert!(measured > 500, "only {measured} functions found");
    assert!(
        too_long.is_empty(),
        "functions over {MAX_FN_LINES} lines (split them into named steps):\n{}",
        too_long.join("\n")
    );
}

#[test]
fn the_length_check_sees_only_code() {
    let text = r##"
pub(crate) async fn outer() -> u32 {
    let s = "} fn fake() {";
    let r = r#"{"json": "}"}"#;
    let c = '{';
    // } a comment's brace
    /* a /* nested */ block } */
    let f = |x: &'static str| { x.len() };
    fn inner() {}
    1
}
trait Shape {
    fn area(&self) -> f64;
}
const fn one() -> u32 { 1 }
fn sum(
    bytes: [u8; 4],
) -> u32 {
    0
}
"##;
    assert_eq!(
        fn_lengths(&code_only(text)),
        [
            (2, "outer".to_string(), 10),
            (9, "inner".to_string(), 1),
            (15, "one".to_string(), 1),
            (16, "sum".to_string(), 5),
        ]
    );
}
