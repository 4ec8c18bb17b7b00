//! The documentation holds together: every relative link in README.md (and the other top-level
//! Markdown files) and `docs/**/*.md` names a file that exists and, with a `#fragment`, a
//! heading that page has (GitHub's anchors); and the README's set-up facts are the ones the
//! Makefile, Cargo.toml and the test-dependency script say. Links inside code (fenced blocks, `code spans`) are not links and are not checked.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The top-level Markdown files (README.md, ARCHITECTURE.md, …) and every page under `docs/`,
/// sorted.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file() && path.extension().is_some_and(|e| e == "md"))
        .collect();
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The text with fenced code blocks blanked (their lines kept, empty, so line numbers hold).
fn without_fences(text: &str) -> String {
    let mut fence: Option<&str> = None;
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m && trimmed.trim_end() == m => fence = None,
            (None, None) => out.push_str(line),
            _ => {}
        }
        out.push('\n');
    }
    out
}

/// The text with code spans blanked: a run of N backticks up to the next run of exactly N.
fn without_code_spans(text: &str) -> String {
    let bytes = text.as_bytes();
    let run_at = |i: usize| bytes[i..].iter().take_while(|&&b| b == b'`').count();
    let mut out = bytes.to_vec();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'`' {
            i += 1;
            continue;
        }
        let n = run_at(i);
        let mut j = i + n;
        let close = loop {
            match bytes[j..].iter().position(|&b| b == b'`') {
                None => break None,
                Some(k) if run_at(j + k) == n => break Some(j + k),
                Some(k) => j += k + run_at(j + k),
            }
        };
        match close {
            Some(end) => {
                for b in &mut out[i..end + n] {
                    if *b != b'\n' {
                        *b = b' ';
                    }
                }
                i = end + n;
            }
            None => i += n,
        }
    }
    String::from_utf8(out).expect("only ASCII backticks were blanked")
}

/// Every inline link target outside code, with its line: `[text](target)`.
fn links(text: &str) -> Vec<(usize, String)> {
    let prose = without_code_spans(&without_fences(text));
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = prose[from..].find("](") {
        let start = from + at + 2;
        let end = prose[start..]
            .find(|c: char| c == ')' || c.is_whitespace())
            .map_or(prose.len(), |e| start + e);
        let line = prose[..start].matches('\n').count() + 1;
        found.push((line, prose[start..end].to_string()));
        from = end;
    }
    found
}

/// A heading's anchor as GitHub makes it: lower case, code and punctuation marks dropped
/// (letters, digits, `-` and `_` kept), spaces turned into hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a page's headings (outside code blocks); a repeated heading gets `-1`, `-2`…
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for line in without_fences(text).lines() {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let mut anchor = base.clone();
        let mut n = 0;
        while !seen.insert(anchor.clone()) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
    }
    seen
}

/// Every relative link of the pages under `root` that names no file, or no heading of its page.
fn broken_links(root: &Path) -> Vec<String> {
    let mut broken = Vec::new();
    for file in markdown_files(root) {
        let text = std::fs::read_to_string(&file).unwrap();
        let shown = file.strip_prefix(root).unwrap().display().to_string();
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let page = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            if !page.exists() {
                broken.push(format!(
                    "{shown}:{line}: {target}: no file {}",
                    page.display()
                ));
            } else if !fragment.is_empty() && page.extension().is_some_and(|e| e == "md") {
                let headings = anchors(&std::fs::read_to_string(&page).unwrap());
                if !headings.contains(fragment) {
                    broken.push(format!("{shown}:{line}: {target}: no heading #{fragment}"));
                }
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let broken = broken_links(&root());
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    // The check saw the pages it is about (a walk that found nothing would pass too).
    let files = markdown_files(&root());
    for page in [
        "README.md",
        "ARCHITECTURE.md",
        "docs/install.md",
        "docs/runbooks/README.md",
    ] {
        assert!(files.contains(&root().join(page)), "{page} not checked");
    }
}

/// The checker itself fails on what it must catch, and only on that: a missing file, a missing
/// heading (a heading inside a code block is none), a heading's anchor in another page; links
/// inside code blocks and code spans are not links.
#[test]
fn the_link_check_catches_missing_files_and_headings() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("docs/sub")).unwrap();
    let readme = "# Top\n\n## `tolerable serve`: the server (HTTPS)\n\n\
        [ok](docs/page.md) [ok](docs/page.md#a-heading-2) [ok](#tolerable-serve-the-server-https)\n\
        [missing file](docs/nope.md) [missing heading](#nowhere)\n\
        [fenced heading](#not-a-heading) [ok dir](docs/sub/) [web](https://example.com/x#y)\n\
        ```sh\n# not a heading\n[in a block](missing-in-block.md)\n```\n\
        `[in a span](missing-in-span.md)` and ``a `[x](nested.md)` span``\n";
    std::fs::write(dir.path().join("README.md"), readme).unwrap();
    let page = "# A heading\n\n## A heading\n\n## A heading\n\n[up](../README.md#gone)\n";
    std::fs::write(dir.path().join("docs/page.md"), page).unwrap();
    let broken = broken_links(dir.path());
    let targets: Vec<&str> = broken
        .iter()
        .map(|b| b.split(": ").nth(1).unwrap())
        .collect();
    assert_eq!(
        targets,
        [
            "docs/nope.md",
            "#nowhere",
            "#not-a-heading",
            "../README.md#gone"
        ],
        "{broken:#?}"
    );
    assert!(broken[0].starts_with("README.md:6: "), "{}", broken[0]);
}

fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).unwrap()
}

/// A newcomer reads it in five minutes: the rest lives in `docs/`.
#[test]
fn the_readme_stays_short() {
    let lines = readme().lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines; move detail to docs/"
    );
}

/// The README's set-up commands are `make run` and `make test`, and the Makefile has them:
/// `run` runs `serve`, `test` installs the test dependencies first.
#[test]
fn the_readme_setup_commands_are_the_makefiles() {
    let readme = setup_commands(&readme());
    assert_eq!(readme, ["make run", "make test"], "the first sh block");
    let makefile = std::fs::read_to_string(root().join("Makefile")).unwrap();
    let target = |name: &str| {
        let line = makefile
            .lines()
            .position(|l| l.starts_with(&format!("{name}:")))
            .unwrap_or_else(|| panic!("Makefile has no target {name}"));
        makefile
            .lines()
            .skip(line)
            .take(2)
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(target("run").contains("-- serve"), "{}", target("run"));
    assert!(target("test").contains("test-deps"), "{}", target("test"));
}

/// The commands of the README's first `sh` block, comments dropped.
fn setup_commands(text: &str) -> Vec<String> {
    let start = text.find("```sh\n").expect("an sh block") + 6;
    let end = start + text[start..].find("```").unwrap();
    text[start..end]
        .lines()
        .map(|l| l.split('#').next().unwrap().trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// What the README says `make test` installs with apt is what the script installs, and the
/// Rust it asks for is Cargo.toml's `rust-version`.
#[test]
fn the_readme_prerequisites_match_the_script_and_cargo_toml() {
    let readme = readme();
    let script = std::fs::read_to_string(root().join("scripts/install-test-deps.sh")).unwrap();
    let packages: Vec<&str> = script
        .split("missing+=(")
        .skip(1)
        .flat_map(|rest| rest[..rest.find(')').unwrap()].split_whitespace())
        .collect();
    assert!(packages.contains(&"redis-server"), "{packages:?}");
    for package in packages {
        assert!(
            readme.contains(&format!("`{package}`")),
            "README does not name `{package}`"
        );
    }
    let cargo = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let version = cargo
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("Cargo.toml's rust-version");
    assert!(
        readme.contains(&format!("Rust {version} or newer")),
        "README does not ask for Rust {version} or newer"
    );
}

/// The deprecated flat keys whose sectioned key has another name, from the configuration
/// reference's table of old keys (`| `old` | `TOLERABLE_OLD` | `[section] key` | … |`, a table
/// the config tests keep equal to the code's): old name → its sectioned form.
fn renamed_flat_keys() -> Vec<(String, String)> {
    let reference = std::fs::read_to_string(root().join("docs/configuration.md")).unwrap();
    reference
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let old = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            let env = cells.get(2)?;
            let new = cells.get(3)?.strip_prefix("`[")?.strip_suffix('`')?;
            let (_, key) = new.split_once("] ")?;
            (env.starts_with("`TOLERABLE_") && key != old)
                .then(|| (old.to_string(), format!("[{new}")))
        })
        .collect()
}

/// Where prose names a key by the old flat name the docs would teach a deprecated spelling;
/// only the reference's table of old keys and the upgrade notes (lines saying "deprecated" or
/// "flat keys") may name them, and the records of the past (CHANGELOG.md, BENCHMARKS.md) name
/// keys as they were then.
fn deprecated_key_mentions(root: &Path) -> Vec<String> {
    let renamed = renamed_flat_keys();
    let mut found = Vec::new();
    let history = |file: &Path| file.ends_with("CHANGELOG.md") || file.ends_with("BENCHMARKS.md");
    for file in markdown_files(root)
        .into_iter()
        .filter(|file| !history(file))
    {
        let text = std::fs::read_to_string(&file).unwrap();
        for (number, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            let allowed = lower.contains("deprecated")
                || lower.contains("flat keys")
                || (file.ends_with("docs/configuration.md") && line.contains("| `TOLERABLE_"));
            for (old, new) in renamed.iter().filter(|_| !allowed) {
                if line.contains(&format!("`{old}`")) {
                    let place = file.strip_prefix(root).unwrap().display();
                    found.push(format!("{place}:{}: `{old}` is now `{new}`", number + 1));
                }
            }
        }
    }
    found
}

#[test]
fn the_docs_name_config_keys_by_their_sectioned_names() {
    let renamed = renamed_flat_keys();
    assert!(
        renamed
            .iter()
            .any(|(old, new)| old == "cache_url" && new == "[shared_cache] url"),
        "the reference's table of old keys was not read: {renamed:?}"
    );
    let found = deprecated_key_mentions(&root());
    assert!(
        found.is_empty(),
        "old flat key names in the docs:\n{}",
        found.join("\n")
    );
}

/// The markers a command the tests cannot run carries in the docs, visible to the reader.
const NOT_RUN_MARKERS: [&str; 3] = ["(live cluster)", "(network: ", "(Docker, a registry)"];

/// Commands of README.md and docs/install.md the tests run (or run the equivalent of, named
/// here), by how the command starts, and the test that does.
const EXERCISED: &[(&str, &str)] = &[
    ("make run", "the_readme_setup_commands_are_the_makefiles"),
    ("make test", "the_readme_setup_commands_are_the_makefiles"),
    (
        "curl --cacert tolerable-ca.pem https://localhost:8443/",
        "serve_without_certificates_prints_its_ca_and_stops_on_sigterm",
    ),
    (
        "cp -r kustomize/overlays/example kustomize/overlays/mine",
        "the_documented_overlay_commands_run_as_written",
    ),
    (
        "kubectl kustomize kustomize/overlays/mine/ > tolerable.yaml",
        "the_documented_overlay_commands_run_as_written",
    ),
    // Helm's own engine renders the chart (helm-python-sdk); the helm CLI is not installed.
    (
        "helm template tolerable ./charts/tolerable",
        "rendered_objects_validate_offline",
    ),
    (
        "tolerable nodes ",
        "every_listed_exit_status_is_returned_and_every_returned_one_listed",
    ),
    // The README's offline path and the sample outputs (`console` blocks), compared.
    (
        "examples/local-registry.sh",
        "the_readmes_offline_example_prints_its_samples",
    ),
    (
        "TOLERABLE_REGISTRY__INSECURE=127.0.0.1:5000 cargo run --release -- ",
        "the_readmes_offline_example_prints_its_samples",
    ),
    (
        "tolerable check -n default",
        "check_prints_the_install_pages_unreachable_sample",
    ),
    (
        ".test-tools/bin/python3 scripts/helm-chart.py template ",
        "the_chart_renders_without_helm_as_install_md_says",
    ),
    (
        "grep 'image: ' tolerable.yaml",
        "the_documented_overlay_commands_run_as_written",
    ),
    (
        "grep -A1 TOLERABLE_POLICY__ENFORCE tolerable.yaml",
        "the_documented_overlay_commands_run_as_written",
    ),
];

/// Each command of the `sh` blocks of `text` (continuation lines joined, comment lines left
/// out) and of its `console` blocks (the `$ ` lines: the rest is what they print, compared by
/// tests/cli/doc_samples.rs), with the line it starts on.
pub(crate) fn shell_commands(text: &str) -> Vec<(usize, String)> {
    let mut commands = Vec::new();
    // The open block's language ("" outside a block, or in one without a language).
    let mut block = "";
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let mut trimmed = line.trim();
        if trimmed.starts_with("```") {
            block = if block.is_empty() {
                trimmed.trim_start_matches('`')
            } else {
                ""
            };
            continue;
        }
        if block == "console" {
            match trimmed.strip_prefix("$ ") {
                Some(command) => trimmed = command,
                None => continue,
            }
        }
        let wanted = block == "sh" || block == "console";
        if !wanted || trimmed.is_empty() || (pending.is_none() && trimmed.starts_with('#')) {
            continue;
        }
        let (start, mut command) = pending.take().unwrap_or((i + 1, String::new()));
        command.push_str(trimmed.trim_end_matches('\\').trim_end());
        command.push(' ');
        if trimmed.ends_with('\\') {
            pending = Some((start, command));
        } else {
            commands.push((start, command.trim().to_owned()));
        }
    }
    commands
}

/// The `fn` names of every test file.
fn test_functions() -> String {
    let mut all = String::new();
    for dir in ["cli", "cluster", "project", "registry", "webhook"] {
        for file in std::fs::read_dir(root().join("tests").join(dir)).unwrap() {
            all.push_str(&std::fs::read_to_string(file.unwrap().path()).unwrap());
        }
    }
    all
}

/// Every command in README.md and docs/install.md either runs in a named test or says, with a
/// visible marker, what it needs that the tests do not have (a live cluster, a network, Docker).
#[test]
fn every_documented_command_runs_in_a_test_or_is_marked() {
    let tests = test_functions();
    for (_, name) in EXERCISED {
        assert!(tests.contains(&format!("fn {name}(")), "no test {name}");
    }
    let mut unaccounted = Vec::new();
    for file in ["README.md", "docs/install.md"] {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        let commands = shell_commands(&text);
        assert!(commands.len() >= 5, "{file}: {commands:?}");
        for (line, command) in commands {
            let marked = NOT_RUN_MARKERS.iter().any(|m| command.contains(m));
            let run = EXERCISED
                .iter()
                .any(|(start, _)| command.starts_with(start));
            if !marked && !run {
                unaccounted.push(format!("{file}:{line}: {command}"));
            }
        }
    }
    assert!(
        unaccounted.is_empty(),
        "neither run by a test nor marked:\n{}",
        unaccounted.join("\n")
    );
}

#[test]
fn the_command_extraction_joins_continuations_skips_comments_and_reads_prompts() {
    let text = "x\n```sh\n# a comment\nhelm install a \\\n  --set b=c   # (live cluster)\nls\n```\n```yaml\nkind: Pod\n```\n```console\n$ tolerable check\nunreachable: x\n```\n```\n$ not a command\n```\n";
    assert_eq!(
        shell_commands(text),
        [
            (4, "helm install a --set b=c   # (live cluster)".to_owned()),
            (6, "ls".to_owned()),
            (12, "tolerable check".to_owned())
        ]
    );
}
