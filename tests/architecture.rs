//! The layering, checked: the decision core (`src/mutate.rs`, `src/mutate/**`) does no I/O and
//! imports no module of the I/O shell, so it stays a pure function a test can call with plain
//! values. ARCHITECTURE.md states the rule; this test keeps it from drifting.

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
    let mut dirs = vec![src.join("mutate")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
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
