//! The `tolerable` binary as an operator runs it, for the command-line tests: a clean
//! environment pointing at the test registries, the report a `--json` run prints.

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use super::registry;

/// `tolerable` with a clean environment: the plain test registry allowed over http, arm64 and
/// s390x pools, a 3 s lookup budget; run in the temporary directory.
pub fn tolerable() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tolerable"));
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("TOLERABLE_REGISTRY__INSECURE", &registry::plain().host)
        .env("TOLERABLE_POLICY__SUPPORTED_ARCHITECTURES", "arm64, s390x")
        .env("TOLERABLE_REGISTRY__LOOKUP_TIMEOUT", "3s")
        .current_dir(std::env::temp_dir());
    command
}

/// `tolerable` with nothing from this process's environment and no registry: `HOME` and the
/// working directory `home` (no ~/.kube/config unless a test writes one), no `$KUBECONFIG`,
/// not in a cluster; lookups give up after `lookup_timeout`; warnings only.
pub fn isolated(home: &std::path::Path, lookup_timeout: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tolerable"));
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("TOLERABLE_REGISTRY__LOOKUP_TIMEOUT", lookup_timeout)
        .env("TOLERABLE_LOG__LEVEL", "warn")
        .current_dir(home)
        .stdin(Stdio::null());
    command
}

/// What `tolerable SUBCOMMAND --help` prints (isolated, as [`isolated`]); it must succeed.
pub fn help(subcommand: &[&str]) -> String {
    let home = tempfile::tempdir().unwrap();
    let out = isolated(home.path(), "1s")
        .args(subcommand)
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{subcommand:?} --help: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `tolerable review ARGS`, with `stdin` written to its standard input.
pub fn review(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = tolerable()
        .arg("review")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(bytes) = stdin {
        input.write_all(bytes).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

/// The workload `kind/name` in a `review --json` or `audit --json` report.
pub fn workload<'a>(report: &'a Value, kind: &str, name: &str) -> &'a Value {
    let found = report["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["kind"] == kind && w["name"] == name);
    let Some(found) = found else {
        panic!("no {kind}/{name} in {report:#}")
    };
    found
}

/// The standard output of a run that must have succeeded (shown, with its errors, if not).
pub fn succeeded(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The JSON report a `--json` run printed, whatever its exit status.
pub fn json_report(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}
