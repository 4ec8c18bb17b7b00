//! The files generated from the code (`tolerable reference --list`: the config reference
//! tolerable.toml and kustomize's copy, docs/configuration.md's tables, the chart's `config`
//! values and schema, docs/cli.md's synopses and flags) are committed exactly as the binary
//! prints them: one drift check instead of parity tests between the copies.

use std::path::Path;
use std::process::Command;

/// The command that brings every generated file up to date.
const FIX: &str = "make generate";

fn reference(args: &[&str]) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = Command::new(env!("CARGO_BIN_EXE_tolerable"))
        .arg("reference")
        .arg("--root")
        .arg(root)
        .args(args)
        // The reference reads no config: neither a file nor the environment may change it.
        .env("TOLERABLE_CONFIG", "/nonexistent/tolerable.toml")
        .env("TOLERABLE_POLICY__STEERING", "off")
        .current_dir(root)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "tolerable reference {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Every generated file is byte for byte what `tolerable reference` prints for it.
#[test]
fn every_generated_file_is_as_the_code_prints_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = reference(&["--list"]);
    let files: Vec<&str> = files.lines().collect();
    assert!(files.contains(&"tolerable.toml"), "{files:?}");
    assert!(
        files.contains(&"charts/tolerable/values.schema.json"),
        "{files:?}"
    );
    let mut stale = Vec::new();
    for file in &files {
        let committed = std::fs::read_to_string(root.join(file)).unwrap();
        if reference(&[file]) != committed {
            stale.push(*file);
        }
    }
    assert!(
        stale.is_empty(),
        "generated files differ from what the code prints: {stale:?}; run `{FIX}` and commit them"
    );
}

/// The check sees a change: a file with its generated block edited by hand is printed back
/// as the code has it (the hand-written text around the block kept), and a file whose
/// markers are gone is refused, naming the marker.
#[test]
fn a_hand_edit_inside_a_generated_block_is_undone_and_prose_around_it_kept() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let copy = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(copy.path().join("docs")).unwrap();
    let committed = std::fs::read_to_string(root.join("docs/configuration.md")).unwrap();
    let edited = committed
        .replace("| `tag_ttl` |", "| `tag_ttl_typo` |")
        .replace(
            "# Configuration reference",
            "# Configuration reference (edited)",
        );
    assert_ne!(edited, committed);
    let path = copy.path().join("docs/configuration.md");
    std::fs::write(&path, &edited).unwrap();
    let printed = Command::new(env!("CARGO_BIN_EXE_tolerable"))
        .args(["reference", "--root"])
        .arg(copy.path())
        .arg("docs/configuration.md")
        .output()
        .unwrap();
    assert!(printed.status.success());
    let printed = String::from_utf8(printed.stdout).unwrap();
    assert!(printed.contains("| `tag_ttl` |"), "the block is the code's");
    assert!(!printed.contains("tag_ttl_typo"));
    assert!(
        printed.starts_with("# Configuration reference (edited)\n"),
        "the prose is kept"
    );
    let without_markers: String = committed
        .lines()
        .filter(|l| !l.starts_with("<!-- generated: keys"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&path, without_markers).unwrap();
    let refused = Command::new(env!("CARGO_BIN_EXE_tolerable"))
        .args(["reference", "--root"])
        .arg(copy.path())
        .arg("docs/configuration.md")
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let error = String::from_utf8_lossy(&refused.stderr);
    assert!(
        error.contains("docs/configuration.md has no line \"<!-- generated: keys"),
        "{error}"
    );
}
