//! The container image recipe, exercised without a Docker engine: the Dockerfile's build step is
//! `scripts/build-binary.sh`, run here for this machine's own architecture.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn script() -> Command {
    Command::new(root().join("scripts/build-binary.sh"))
}

#[test]
fn the_build_script_builds_a_working_stripped_binary() {
    let out = tempfile::tempdir().unwrap();
    let result = script()
        .args(["native", out.path().to_str().unwrap()])
        .env("PROFILE", "dev")
        .output()
        .unwrap();
    assert!(
        result.status.success(),
        "{}{}",
        String::from_utf8_lossy(&result.stdout),
        String::from_utf8_lossy(&result.stderr)
    );
    let binary = out.path().join("tolerable");
    let version = Command::new(&binary).arg("--version").output().unwrap();
    assert!(version.status.success());
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("tolerable {}", env!("CARGO_PKG_VERSION"))
    );
    // Stripped: no symbol table left.
    let symbols = Command::new("nm").arg(&binary).output().unwrap();
    assert!(
        String::from_utf8_lossy(&symbols.stderr).contains("no symbols"),
        "binary not stripped"
    );
}

#[test]
fn every_image_architecture_has_a_target_and_a_runtime_stage() {
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    assert!(dockerfile.contains("scripts/build-binary.sh \"$TARGETARCH\" /out"));
    assert!(
        dockerfile.contains("--platform=$BUILDPLATFORM"),
        "cross-compile, do not emulate"
    );
    for (arch, target, libc) in [
        ("amd64", "x86_64-unknown-linux-musl", "musl"),
        ("arm64", "aarch64-unknown-linux-musl", "musl"),
        ("ppc64le", "powerpc64le-unknown-linux-musl", "musl"),
        ("s390x", "s390x-unknown-linux-gnu", "gnu"),
    ] {
        let out = script().args(["--print", arch]).output().unwrap();
        assert!(out.status.success(), "{arch}");
        let plan = String::from_utf8(out.stdout).unwrap();
        let fields: Vec<&str> = plan.split_whitespace().collect();
        assert_eq!(fields[0], target, "{arch}");
        assert_eq!(fields[2], libc, "{arch}");
        let base = if libc == "musl" {
            "distroless/static"
        } else {
            "distroless/cc"
        };
        let stage = dockerfile
            .lines()
            .find(|l| l.ends_with(&format!("AS runtime-{arch}")))
            .unwrap_or_else(|| panic!("no runtime stage for {arch}"));
        assert!(
            stage.contains(base) && stage.contains(":nonroot"),
            "{stage}"
        );
        // The cross compiler the script names is installed by the build stage.
        let cc = fields[1];
        if cc != "musl-gcc" {
            assert!(
                dockerfile.contains(&format!("gcc-{}", cc.trim_end_matches("-gcc"))),
                "{cc} not installed"
            );
        }
    }
    let out = script().args(["--print", "mips"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}
