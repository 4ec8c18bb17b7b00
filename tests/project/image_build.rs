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
    }
    let out = script().args(["--print", "mips"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

fn packages(arch: &str, build_arch: &str) -> String {
    let out = script()
        .args(["--packages", arch])
        .env("BUILD_ARCH", build_arch)
        .output()
        .unwrap();
    assert!(out.status.success(), "{arch} on {build_arch}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// The Dockerfile's build stage installs what the script names for the target, on amd64 and
/// arm64 build machines alike: the machine's own gcc for its own architecture (which provides
/// `<triple>-gcc`), Debian's cross compiler and C library headers for the others — not
/// `musl-gcc`, which compiles for the build machine only.
#[test]
fn the_build_stage_installs_each_targets_compiler_on_amd64_and_arm64_builders() {
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    assert!(dockerfile.contains("$(scripts/build-binary.sh --packages \"$TARGETARCH\")"));
    assert!(!dockerfile.contains("musl-gcc") && !dockerfile.contains("musl-tools"));
    for (arch, cross) in [
        ("amd64", "gcc-x86-64-linux-gnu libc6-dev-amd64-cross"),
        ("arm64", "gcc-aarch64-linux-gnu libc6-dev-arm64-cross"),
        (
            "ppc64le",
            "gcc-powerpc64le-linux-gnu libc6-dev-ppc64el-cross",
        ),
        ("s390x", "gcc-s390x-linux-gnu libc6-dev-s390x-cross"),
    ] {
        let debian_arch = if arch == "ppc64le" { "ppc64el" } else { arch };
        assert_eq!(
            packages(arch, debian_arch),
            "gcc libc6-dev",
            "{arch} natively"
        );
        for builder in ["amd64", "arm64"].into_iter().filter(|b| *b != arch) {
            assert_eq!(packages(arch, builder), cross, "{arch} on {builder}");
        }
        // The compiler the script names is the one those packages provide.
        let plan = script().args(["--print", arch]).output().unwrap();
        let cc = String::from_utf8(plan.stdout).unwrap();
        let cc = cc.split_whitespace().nth(1).unwrap().to_owned();
        let triple = cc.strip_suffix("-gcc").unwrap();
        assert!(
            cross.starts_with(&format!("gcc-{} ", triple.replace('_', "-"))),
            "{arch}: {cc}"
        );
    }
    // This machine's own compiler is there under the name the script uses for it.
    let machine = String::from_utf8(
        std::process::Command::new("gcc")
            .arg("-dumpmachine")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let own_cc = format!("{}-gcc", machine.trim());
    let found = std::process::Command::new(&own_cc)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{own_cc} missing: the script names it for this machine's architecture"
    );
}
