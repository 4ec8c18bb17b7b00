//! The layering, checked: the decision core (the workspace crate `crates/core`, the shell's
//! `mutate`) does no I/O, so it stays a pure function a test can call with plain values. Its
//! purity is mostly the compiler's: no crate that does I/O is in its dependency tree (checked
//! here with `cargo tree`), so an import of the shell or of such a crate cannot compile in any
//! form (a test plants each form in a copy); std's I/O modules are read for in its sources.
//!
//! The outer layers too (ARCHITECTURE.md, "Layer rules"): the server imports only the admission
//! shell and metrics (and the leaves they need), subcommands never import each other, config
//! imports no server module and the time budget no config, no circle between top-level
//! modules, and the Kubernetes API read only in `cluster/`.
//!
//! Also the size rule: no function, in the crate, its tests, benches or fuzz targets, is longer
//! than a reader can hold on one screen (`MAX_FN_LINES`).

use std::path::{Path, PathBuf};

/// Crates that do I/O, keep time or log, and the shell itself: none may be in the decision core's
/// dependency tree (normal and build dependencies, resolved by cargo), so no path in the core —
/// grouped, glob, `::tokio`, through `super::` — can reach one: the compiler has nothing to
/// resolve it to.
const IO_CRATES: &[&str] = &[
    "tolerable",
    "tokio",
    "mio",
    "socket2",
    "hyper",
    "hyper-util",
    "h2",
    "reqwest",
    "kube",
    "kube-client",
    "kube-runtime",
    "rustls",
    "tokio-rustls",
    "ring",
    "redis",
    "tracing",
    "tracing-subscriber",
    "moka",
    "libc",
    "rustix",
    "chrono",
];

/// The parts of std that do I/O, keep time or read the environment: std is in every crate, so
/// for these the core's sources are read (use trees expanded, `::std` and globs included).
const STD_IO_PATHS: &[&str] = &[
    "std::fs",
    "std::net",
    "std::process",
    "std::time::Instant",
    "std::time::SystemTime",
    "std::env",
    "std::io::stdin",
    "std::io::stdout",
    "std::io::stderr",
    "std::os",
    "std::thread",
];

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

fn core_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/core")
}

/// The names of the packages in `manifest`'s package's dependency tree (normal and build
/// dependencies, this platform's), as `cargo tree` resolves them.
fn dependency_tree(manifest: &Path) -> Vec<String> {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "--edges",
            "normal,build",
            "--prefix",
            "none",
        ])
        .args(["--format", "{p}", "--manifest-path"])
        .arg(manifest)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cargo tree failed: {stderr}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect()
}

fn io_crates_in(tree: &[String]) -> Vec<String> {
    let mut found: Vec<String> = tree
        .iter()
        .filter(|name| IO_CRATES.contains(&name.as_str()))
        .cloned()
        .collect();
    found.dedup();
    found
}

#[test]
fn the_decision_core_crate_depends_on_nothing_that_does_io() {
    let tree = dependency_tree(&core_dir().join("Cargo.toml"));
    assert!(tree.contains(&"k8s-openapi".to_owned()), "{tree:?}");
    let found = io_crates_in(&tree);
    assert!(
        found.is_empty(),
        "the decision core must stay pure (ARCHITECTURE.md): {found:?} in its dependency tree"
    );
}

/// What of std's I/O `code` names: every path and use tree (expanded), with `::std` read as
/// `std`, a glob counted when it could bring one in, and std renamed counted as a bypass.
fn std_io_named(code: &str) -> Vec<String> {
    let code = code_only(code);
    let mut named = use_paths(&code);
    named.extend(paths_named(&code));
    if code.contains("extern crate") {
        named.push("extern crate".to_owned());
    }
    named
        .into_iter()
        .map(|p| p.trim_start_matches("::").to_owned())
        .filter(|path| {
            let glob = path.strip_suffix("::*");
            path == "std"
                || path == "extern crate"
                || STD_IO_PATHS.iter().any(|io| {
                    path == io
                        || path.starts_with(&format!("{io}::"))
                        || glob.is_some_and(|g| io.starts_with(&format!("{g}::")) || *io == g)
                })
        })
        .collect()
}

#[test]
fn the_decision_core_names_no_io_of_std() {
    let mut violations = Vec::new();
    for file in rs_files_under(&core_dir().join("src")) {
        let text = std::fs::read_to_string(&file).unwrap();
        for path in std_io_named(&text) {
            violations.push(format!("{}: {path}", file.display()));
        }
    }
    assert!(
        violations.is_empty(),
        "the decision core must stay pure (ARCHITECTURE.md):\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_std_check_finds_every_form_of_a_bypass() {
    let planted = [
        "use std::{collections::BTreeMap, fs};",
        "use ::std::net::TcpStream;",
        "let t = ::std::time::Instant::now();",
        "use std::time::*;",
        "use std::{time::{Duration, SystemTime as Clock}};",
        "use std as s;",
        "extern crate std as s;",
        "fn f() { std::env::var(\"X\"); }",
    ];
    for code in planted {
        assert!(!std_io_named(code).is_empty(), "not found: {code}");
    }
    let clean = "use std::collections::BTreeMap;\nuse std::time::Duration;\n// std::fs in a comment\nlet s = \"std::net\";";
    assert_eq!(std_io_named(clean), Vec::<String>::new());
}

/// A copy of the core crate, in a temporary directory, into which a test plants bypasses.
fn core_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let copy = |from: &Path, to: &Path| {
        for file in rs_files_under(from) {
            let target = to.join(file.strip_prefix(from).unwrap());
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            std::fs::copy(&file, target).unwrap();
        }
    };
    copy(&core_dir().join("src"), &dir.path().join("src"));
    let manifest = std::fs::read_to_string(core_dir().join("Cargo.toml")).unwrap();
    // A workspace of its own (not the repository's), resolved from the repository's lock.
    std::fs::write(dir.path().join("Cargo.toml"), manifest + "\n[workspace]\n").unwrap();
    let lock = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.lock");
    std::fs::copy(lock, dir.path().join("Cargo.lock")).unwrap();
    dir
}

#[test]
fn a_planted_io_dependency_fails_the_core_rule() {
    let copy = core_copy();
    let manifest = copy.path().join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let planted = text.replace("[dependencies]\n", "[dependencies]\ntokio = \"1\"\n");
    assert_ne!(planted, text);
    std::fs::write(&manifest, planted).unwrap();
    assert_eq!(io_crates_in(&dependency_tree(&manifest)), ["tokio"]);
}

/// The bypasses a token scan missed, planted in a copy of the core: each is a compile error now
/// that the core is a crate whose dependencies do no I/O (checked with `cargo check`, in a
/// target directory of its own: the test run holds the workspace's).
#[test]
fn planted_imports_of_the_shell_or_io_do_not_compile_in_the_core() {
    let copy = core_copy();
    let planted = [
        ("grouped", "use crate::{registry::ImagePlatforms};"),
        ("up_and_out", "use super::super::registry::Resolver;"),
        ("absolute", "pub fn f() { ::tokio::spawn(async {}); }"),
        ("glob", "use tokio::net::*;"),
        ("the_shell", "use tolerable::admission;"),
    ];
    let mut lib = std::fs::read_to_string(copy.path().join("src/lib.rs")).unwrap();
    for (name, code) in planted {
        std::fs::write(copy.path().join(format!("src/planted_{name}.rs")), code).unwrap();
        lib.push_str(&format!("\npub mod planted_{name};\n"));
    }
    std::fs::write(copy.path().join("src/lib.rs"), lib).unwrap();
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("planted-core");
    let out = std::process::Command::new(env!("CARGO"))
        .args(["check", "--offline", "--quiet", "--manifest-path"])
        .arg(copy.path().join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", target)
        .output()
        .unwrap();
    assert!(!out.status.success(), "the planted bypasses compiled");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for (name, _) in planted {
        assert!(
            stderr.contains(&format!("src/planted_{name}.rs")),
            "no error at planted_{name}:\n{stderr}"
        );
    }
}

/// Longest a function may be, signature to closing brace: about one screen (issue 12).
const MAX_FN_LINES: usize = 80;

/// Where the project's hand-written Rust lives. `target/` and the fuzz crate's generated
/// corpora and artifacts are outside these, so nothing generated is measured.
const MEASURED_DIRS: &[&str] = &[
    "src",
    "crates/core/src",
    "tests",
    "benches",
    "fuzz/fuzz_targets",
];

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

// The outer layers (ARCHITECTURE.md, "Layer rules"): what each part of the shell may import.
// Every `crate::…`, `super::…` and `self::…` path of a file (use trees expanded) is resolved to
// the module it names, counted from the crate root.

/// What the server (`src/server.rs`, `src/server/**`) may import besides its own parts: the
/// admission shell (`Admission` and what its answer carries), metrics, telemetry, the time budget
/// the API server's `?timeout=` gives (`budget`), the certificate reader (`x509`) and its own
/// settings, which config keeps with every section's (`config::ServerLimits`,
/// `config::NameCheck`). No core type by name (`AnsweredReview` says the outcome and summary it
/// logs), no registry, cluster or app: what it reports of them comes as closures built in
/// `app.rs`.
const SERVER_MAY_IMPORT: &[&str] = &[
    "admission",
    "metrics",
    "telemetry",
    "budget",
    "x509",
    "config",
];

/// `(module, module it must not import)`, top-level modules of the crate.
/// Config keeps its settings types itself (the server's `ServerLimits` and `NameCheck` among
/// them) and `budget` reads the `?timeout=` with the one duration parser (`duration`): these two
/// imports closed the circle `admission → budget → config → server → admission`.
/// The engine decides for every caller and knows none of them: not the AdmissionReview shell,
/// the server, the subcommands or the composition root; the gate controller and the workloads
/// `review` and `audit` read reach the engine (and its `PodObject`), never the wire shell.
const FORBIDDEN_IMPORTS: &[(&str, &str)] = &[
    ("config", "server"),
    ("budget", "config"),
    ("engine", "admission"),
    ("engine", "server"),
    ("engine", "cmd"),
    ("engine", "app"),
    ("engine", "gates"),
    ("gates", "admission"),
    ("workload", "admission"),
];

/// A source file of the crate: its path from `src/`, the module it is (`["cmd", "audit"]` for
/// `src/cmd/audit.rs` and, for `super::`, `src/cmd/audit/read.rs` is `["cmd", "audit", "read"]`)
/// and its text.
struct SourceFile {
    path: String,
    module: Vec<String>,
    text: String,
}

/// Every file of the library (`src/main.rs`, the binary, and `src/lib.rs`, the module list, left
/// out).
fn library_files() -> Vec<SourceFile> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    rs_files_under(&src)
        .into_iter()
        .filter_map(|file| {
            let path = file.strip_prefix(&src).unwrap().display().to_string();
            let stem = path.strip_suffix(".rs").unwrap();
            if stem == "main" || stem == "lib" {
                return None;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let module = stem.split('/').map(str::to_owned).collect();
            Some(SourceFile { path, module, text })
        })
        .collect()
}

/// The use trees of `code` (comments and literals blanked), expanded into one path each:
/// `use crate::{a::{B, C as D}, e};` gives `crate::a::B`, `crate::a::C`, `crate::e`.
fn use_paths(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let starts_word =
            at == 0 || !rest[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_');
        let after = &rest[at + 4..];
        let end = after.find(';').unwrap_or(after.len());
        if starts_word {
            paths.extend(expand_use_tree(&without_renames(&after[..end])));
        }
        rest = &after[end..];
    }
    paths
}

/// A use tree with every `as name` left out and no whitespace.
fn without_renames(tree: &str) -> String {
    let words: Vec<&str> = tree.split_whitespace().collect();
    let mut kept = String::new();
    let mut i = 0;
    while i < words.len() {
        if words[i] == "as" && i + 1 < words.len() {
            // `as name,` or `as name}`: keep what follows the name.
            let name = words[i + 1];
            let tail = name.trim_start_matches(|c: char| c.is_alphanumeric() || c == '_');
            kept.push_str(tail);
            i += 2;
        } else {
            kept.push_str(words[i]);
            i += 1;
        }
    }
    kept
}

fn expand_use_tree(tree: &str) -> Vec<String> {
    let Some(open) = tree.find('{') else {
        return vec![tree.trim_end_matches("::self").to_owned()];
    };
    let (prefix, inner) = (
        &tree[..open],
        &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())],
    );
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|part| !part.is_empty())
        .flat_map(|part| match part {
            "self" => vec![prefix.trim_end_matches("::").to_owned()],
            _ => expand_use_tree(part)
                .into_iter()
                .map(|path| format!("{prefix}{path}"))
                .collect(),
        })
        .collect()
}

/// The modules of the crate `file` names (use trees and paths in code alike), each as its
/// segments from the crate root; paths into other crates are left out.
fn crate_paths_named(file: &SourceFile) -> Vec<Vec<String>> {
    let code = code_only(&file.text);
    let mut named = use_paths(&code);
    named.extend(paths_named(&code));
    named
        .iter()
        .filter_map(|path| resolve(&file.module, path))
        .filter(|path| !path.is_empty())
        .collect()
}

/// `path` from the crate root, when it starts at `crate`, `self` or `super` of `module`.
fn resolve(module: &[String], path: &str) -> Option<Vec<String>> {
    let mut segments = path.split("::").filter(|s| !s.is_empty()).peekable();
    let mut from: Vec<String> = match *segments.peek()? {
        "crate" => {
            segments.next();
            Vec::new()
        }
        "self" => {
            segments.next();
            module.to_vec()
        }
        "super" => module.to_vec(),
        _ => return None,
    };
    while segments.peek() == Some(&"super") {
        from.pop();
        segments.next();
    }
    from.extend(segments.map(str::to_owned));
    Some(from)
}

/// The crate's top-level modules: `src/x.rs` or `src/x/`.
fn top_level_modules(files: &[SourceFile]) -> std::collections::BTreeSet<String> {
    files.iter().map(|f| f.module[0].clone()).collect()
}

/// Which top-level modules each top-level module imports, with a file and path for each.
fn import_graph(
    files: &[SourceFile],
) -> std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>> {
    let modules = top_level_modules(files);
    let mut graph = std::collections::BTreeMap::<_, std::collections::BTreeMap<_, _>>::new();
    for file in files {
        let from = &file.module[0];
        for path in crate_paths_named(file) {
            let Some(to) = path
                .first()
                .filter(|to| *to != from && modules.contains(*to))
            else {
                continue;
            };
            graph
                .entry(from.clone())
                .or_default()
                .entry(to.clone())
                .or_insert_with(|| format!("{}: {}", file.path, path.join("::")));
        }
    }
    graph
}

#[test]
fn the_server_imports_only_the_admission_shell_and_metrics() {
    let mut violations = Vec::new();
    for file in library_files().iter().filter(|f| f.module[0] == "server") {
        for path in crate_paths_named(file) {
            let allowed = path
                .first()
                .is_some_and(|m| m == "server" || SERVER_MAY_IMPORT.contains(&m.as_str()));
            if !allowed {
                violations.push(format!("{}: {}", file.path, path.join("::")));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "the server imports only {SERVER_MAY_IMPORT:?} (ARCHITECTURE.md); what it needs of the \
         rest comes from app.rs:\n{}",
        violations.join("\n")
    );
}

#[test]
fn subcommands_share_code_through_the_library_not_each_other() {
    let files = library_files();
    let subcommands: Vec<&String> = files
        .iter()
        .filter(|f| f.module.len() == 2 && f.module[0] == "cmd")
        .map(|f| &f.module[1])
        .collect();
    assert!(subcommands.len() >= 5, "subcommands found: {subcommands:?}");
    let mut violations = Vec::new();
    for file in files
        .iter()
        .filter(|f| f.module[0] == "cmd" && f.module.len() >= 2)
    {
        for path in crate_paths_named(file) {
            let other = match path.as_slice() {
                [cmd, other, ..] if cmd == "cmd" => other,
                _ => continue,
            };
            if other != &file.module[1] && subcommands.contains(&other) {
                violations.push(format!("{}: {}", file.path, path.join("::")));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "a subcommand imports another (move what they share into the library):\n{}",
        violations.join("\n")
    );
}

/// The one `kube` item the library names outside `cluster/`: the client `app.rs` and the
/// subcommands get from `cluster::Cluster` and hand back to it.
const KUBE_OUTSIDE_CLUSTER: &[&str] = &["kube::Client"];

#[test]
fn the_kubernetes_api_is_read_only_in_cluster() {
    let mut violations = Vec::new();
    for file in library_files().iter().filter(|f| f.module[0] != "cluster") {
        let code = code_only(&file.text);
        let mut named = use_paths(&code);
        named.extend(paths_named(&code));
        for path in named {
            let kube = path.starts_with("kube::");
            if kube && !KUBE_OUTSIDE_CLUSTER.contains(&path.as_str()) {
                violations.push(format!("{}: {path}", file.path));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "reads of the Kubernetes API belong in cluster/ (ARCHITECTURE.md):\n{}",
        violations.join("\n")
    );
}

#[test]
fn no_module_imports_what_a_layer_rule_forbids() {
    let graph = import_graph(&library_files());
    let violations: Vec<String> = FORBIDDEN_IMPORTS
        .iter()
        .filter_map(|(from, to)| {
            let found = graph.get(*from)?.get(*to)?;
            Some(format!("{from} must not import {to}: {found}"))
        })
        .collect();
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn no_circle_between_top_level_modules() {
    let graph = import_graph(&library_files());
    assert!(graph.len() > 10, "modules found: {:?}", graph.keys());
    if let Some(circle) = find_circle(&graph) {
        let steps: Vec<String> = circle
            .windows(2)
            .map(|w| graph[&w[0]][&w[1]].clone())
            .collect();
        panic!(
            "import circle {} (ARCHITECTURE.md):\n{}",
            circle.join(" → "),
            steps.join("\n")
        );
    }
}

/// A circle in `graph`, as the modules along it (the first repeated at the end), if any.
fn find_circle(
    graph: &std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
) -> Option<Vec<String>> {
    fn visit(
        graph: &std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
        module: &String,
        path: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|m| m == module) {
            let mut circle = path[at..].to_vec();
            circle.push(module.clone());
            return Some(circle);
        }
        if !done.insert(module.clone()) {
            return None;
        }
        path.push(module.clone());
        for next in graph.get(module).into_iter().flat_map(|m| m.keys()) {
            if let Some(circle) = visit(graph, next, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        None
    }
    let mut done = std::collections::BTreeSet::new();
    graph
        .keys()
        .find_map(|module| visit(graph, module, &mut Vec::new(), &mut done))
}

#[test]
fn the_layer_checks_find_what_they_must() {
    let code = code_only(
        "use crate::{admission::{Admission, AnsweredReview as R}, metrics};\n\
         pub(crate) use super::review::answer_workload;\n\
         use self::read::Listed;\n\
         // use crate::config::Config;\n\
         let s = \"crate::registry\";\n\
         let t = crate::registry::short_duration(d);\n",
    );
    assert_eq!(
        use_paths(&code),
        [
            "crate::admission::Admission",
            "crate::admission::AnsweredReview",
            "crate::metrics",
            "super::review::answer_workload",
            "self::read::Listed",
        ]
    );
    let file = SourceFile {
        path: "cmd/audit.rs".into(),
        module: vec!["cmd".into(), "audit".into()],
        text: code,
    };
    let named: Vec<String> = crate_paths_named(&file)
        .iter()
        .map(|p| p.join("::"))
        .collect();
    for expected in [
        "admission::Admission",
        "metrics",
        "cmd::review::answer_workload",
        "cmd::audit::read::Listed",
        "registry::short_duration",
    ] {
        assert!(
            named.iter().any(|p| p == expected),
            "{expected} in {named:?}"
        );
    }
    assert!(!named.iter().any(|p| p.starts_with("config")), "{named:?}");
    let graph = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]
        .iter()
        .fold(
            std::collections::BTreeMap::new(),
            |mut graph, (from, to)| {
                graph
                    .entry(from.to_string())
                    .or_insert_with(std::collections::BTreeMap::new)
                    .insert(to.to_string(), String::new());
                graph
            },
        );
    assert_eq!(find_circle(&graph).unwrap(), ["a", "b", "c", "a"]);
}

#[test]
fn the_pending_config_rules_would_find_todays_imports() {
    let file = |path: &str, text: &str| SourceFile {
        path: path.into(),
        module: path
            .trim_end_matches(".rs")
            .split('/')
            .map(str::to_owned)
            .collect(),
        text: text.into(),
    };
    let files = [
        file("config.rs", "use crate::server::ServerLimits;\n"),
        file(
            "config/source.rs",
            "use crate::{server::tls::NameCheck, budget};\n",
        ),
        file(
            "budget.rs",
            "let d = crate::config::parse_duration(\"timeout\", v);\n",
        ),
        file("server.rs", "use crate::admission::Admission;\n"),
        file(
            "engine.rs",
            "use crate::{admission::wire, server::AppState, cmd::review, app::Webhook};\n",
        ),
        file("engine/workload_pod.rs", "use crate::gates::GatedPods;\n"),
        file("gates.rs", "use crate::admission::wire::PodObject;\n"),
        file("workload.rs", "use crate::admission::wire::PodObject;\n"),
        file("admission.rs", ""),
        file("cmd.rs", ""),
        file("app.rs", ""),
    ];
    let graph = import_graph(&files);
    for (from, to) in FORBIDDEN_IMPORTS {
        assert!(graph[*from].contains_key(*to), "{from} → {to}: {graph:?}");
    }
    assert!(graph["config"]["server"].starts_with("config.rs: server::ServerLimits"));
}
