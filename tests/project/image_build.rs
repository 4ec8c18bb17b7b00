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

/// The binary `scripts/build-binary.sh` builds for `arch` (dev profile), in a directory that
/// lives as long as the first value.
fn build(arch: &str) -> (tempfile::TempDir, PathBuf) {
    let out = tempfile::tempdir().unwrap();
    let result = script()
        .args([arch, out.path().to_str().unwrap()])
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
    (out, binary)
}

#[test]
fn the_build_script_builds_a_working_stripped_binary() {
    let (_out, binary) = build("native");
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
    // A glibc build links glibc dynamically and keeps its allocator (src/main.rs): mimalloc is
    // not in it to answer.
    assert!(has_interpreter(&std::fs::read(&binary).unwrap()));
    assert_eq!(mimalloc_verbose(&binary), None);
    assert_eq!(mimalloc_pages(&binary), None);
}

/// What `tolerable --version` writes to stderr with `variable=1` in its environment: mimalloc
/// reads its `MIMALLOC_…` options there itself, so nothing answers them in a binary without it.
fn stderr_with(binary: &std::path::Path, variable: &str) -> String {
    let run = Command::new(binary)
        .arg("--version")
        .env(variable, "1")
        .output()
        .unwrap();
    assert!(run.status.success(), "{run:?}");
    String::from_utf8_lossy(&run.stderr).into_owned()
}

/// The first line mimalloc says at start-up when asked to be verbose, if it is there.
fn mimalloc_verbose(binary: &std::path::Path) -> Option<String> {
    let stderr = stderr_with(binary, "MIMALLOC_VERBOSE");
    stderr
        .lines()
        .find(|line| line.starts_with("mimalloc:"))
        .map(str::to_owned)
}

/// How many pages mimalloc handed out in the whole run (its statistics at exit: the `pages`
/// row's peak), if it printed them: more than none only when the program's own allocations went
/// through it, not merely when it was linked in.
fn mimalloc_pages(binary: &std::path::Path) -> Option<u64> {
    let stderr = stderr_with(binary, "MIMALLOC_SHOW_STATS");
    let (_, counts) = stderr
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim() == "pages")?;
    counts.split_whitespace().next()?.parse().ok()
}

/// Whether the ELF file has a program interpreter (`PT_INTERP`): a dynamically linked binary
/// names the loader there; a static one has none.
fn has_interpreter(elf: &[u8]) -> bool {
    assert_eq!(&elf[..4], b"\x7fELF");
    assert_eq!(elf[4], 2, "64-bit");
    let little = elf[5] == 1;
    let read = |at: usize, n: usize| {
        let bytes = &elf[at..at + n];
        let mut value = 0u64;
        for i in 0..n {
            let byte = if little { bytes[n - 1 - i] } else { bytes[i] };
            value = value << 8 | u64::from(byte);
        }
        value as usize
    };
    let (table, entry, count) = (read(0x20, 8), read(0x36, 2), read(0x38, 2));
    (0..count).any(|i| read(table + i * entry, 4) == 3)
}

/// The binary the image ships for this machine's architecture (a static musl one) allocates
/// through mimalloc: musl's own allocator mapped and unmapped memory on every admission
/// (BENCHMARKS.md, session 16), and nothing else would notice it gone. Built by the image's own
/// step; `make test` adds the Rust target (scripts/install-test-deps.sh).
#[test]
fn the_images_static_musl_binary_allocates_through_mimalloc() {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => panic!("no musl image build is tested on {other}"),
    };
    let (_out, binary) = build(arch);
    assert!(
        !has_interpreter(&std::fs::read(&binary).unwrap()),
        "the image's binary is static"
    );
    let said = mimalloc_verbose(&binary);
    assert!(
        said.as_deref().is_some_and(|l| l.contains("process init")),
        "{said:?}"
    );
    let pages = mimalloc_pages(&binary);
    assert!(pages.is_some_and(|n| n > 0), "{pages:?}");
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
