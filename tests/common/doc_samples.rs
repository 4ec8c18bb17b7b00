//! The sample outputs of README.md and docs/install.md: a `console` block holds `$ COMMAND`
//! lines, each followed by what it prints. Tests run those commands as the page says and
//! compare (tests/cli/doc_samples.rs, and tests/project/deploy.rs for the kustomize render);
//! a command marked as needing what the tests lack (`# (live cluster)`…) has a sample no test
//! can check.

use super::tools::root;

/// The pages whose samples are checked.
pub const PAGES: [&str; 2] = ["README.md", "docs/install.md"];

/// The markers of a command the tests cannot run (as tests/project/docs.rs knows them).
pub const NOT_RUN_MARKERS: [&str; 3] = ["(live cluster)", "(network: ", "(Docker, a registry)"];

/// Each compared sample's command, exactly as its `$ ` line, and the test that runs it and
/// compares its output with the page's.
pub const COMPARED: &[(&str, &str)] = &[
    (
        "curl --cacert tolerable-ca.pem https://localhost:8443/healthz",
        "serve_without_certificates_prints_its_ca_and_stops_on_sigterm",
    ),
    (
        "examples/local-registry.sh",
        "the_readmes_offline_example_prints_its_samples",
    ),
    (
        "TOLERABLE_REGISTRY__INSECURE=127.0.0.1:5000 cargo run --release -- review examples/local.yaml",
        "the_readmes_offline_example_prints_its_samples",
    ),
    (
        "TOLERABLE_REGISTRY__INSECURE=127.0.0.1:5000 cargo run --release -- inspect 127.0.0.1:5000/examples/web:1.0",
        "the_readmes_offline_example_prints_its_samples",
    ),
    (
        "tolerable check -n default",
        "check_prints_the_install_pages_unreachable_sample",
    ),
    (
        "tolerable nodes plan",
        "nodes_plan_prints_the_install_pages_sample",
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

/// The samples of a page: each `console` block's `$ COMMAND` lines with the lines after each,
/// up to the next `$ ` line or the block's end.
pub fn samples(text: &str) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = Vec::new();
    let mut in_console = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            in_console = !in_console && trimmed == "```console";
            continue;
        }
        if !in_console {
            continue;
        }
        match (line.strip_prefix("$ "), found.last_mut()) {
            (Some(command), _) => found.push((command.trim().to_owned(), String::new())),
            (None, Some((_, output))) => {
                output.push_str(line);
                output.push('\n');
            }
            (None, None) => panic!("a console block that does not start with `$ `: {line}"),
        }
    }
    found
}

/// The sample of `command` on `page` (a path from the repository's root).
pub fn sample(page: &str, command: &str) -> String {
    let text = std::fs::read_to_string(root().join(page)).unwrap();
    samples(&text)
        .into_iter()
        .find(|(c, _)| c == command)
        .unwrap_or_else(|| panic!("{page} has no sample of `{command}`"))
        .1
}
