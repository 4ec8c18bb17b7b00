//! The sample outputs in README.md and docs/install.md are what the commands print. A sample is
//! a `console` block: `$ COMMAND`, then the lines it prints. Each one not marked as needing what
//! the tests lack (`# (live cluster)`…) is run here the way the page says — from a directory laid
//! out like the checkout (the shipped `tolerable.toml`, the example files), `cargo run --release
//! --` as the binary under test — and its standard output compared line for line. Only what
//! must vary is normalised: the example registry's port (5000 on the page, a free one here).

use crate::common;
use common::doc_samples::{sample, samples, COMPARED, NOT_RUN_MARKERS, PAGES};

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Each sample of the pages is compared by a test named in `COMPARED` (which exists), or its
/// command is marked; every entry of `COMPARED` has its sample.
#[test]
fn every_sample_is_compared_or_marked() {
    let mut tests = String::new();
    for dir in ["tests/cli", "tests/project"] {
        for file in std::fs::read_dir(root().join(dir)).unwrap() {
            tests.push_str(&std::fs::read_to_string(file.unwrap().path()).unwrap());
        }
    }
    for (_, test) in COMPARED {
        assert!(tests.contains(&format!("fn {test}(")), "no test {test}");
    }
    let mut unaccounted = Vec::new();
    let mut compared = 0;
    for page in PAGES {
        let text = std::fs::read_to_string(root().join(page)).unwrap();
        for (command, _) in samples(&text) {
            if COMPARED.iter().any(|(c, _)| *c == command) {
                compared += 1;
            } else if !NOT_RUN_MARKERS.iter().any(|m| command.contains(m)) {
                unaccounted.push(format!("{page}: {command}"));
            }
        }
    }
    assert!(
        unaccounted.is_empty(),
        "samples nobody runs: {unaccounted:?}"
    );
    assert_eq!(compared, COMPARED.len(), "a compared sample is missing");
}

#[test]
fn the_sample_extraction_splits_at_each_prompt() {
    let text =
        "x\n```console\n$ a --b\none\n  two\n$ c   # (live cluster)\n```\n```sh\n$ not\n```\n";
    assert_eq!(
        samples(text),
        [
            ("a --b".to_owned(), "one\n  two\n".to_owned()),
            ("c   # (live cluster)".to_owned(), String::new())
        ]
    );
}

/// `examples/local-registry.sh PORT`, run until its banner's last line; stopped (stdin closed)
/// when dropped.
struct ExampleRegistry {
    child: Child,
    banner: String,
}

impl ExampleRegistry {
    fn start(port: u16) -> Self {
        let mut child = Command::new(root().join("examples/local-registry.sh"))
            .arg(port.to_string())
            .current_dir(root())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut banner = String::new();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        while !banner.contains("stops it.") {
            let read = stdout.read_line(&mut banner).unwrap();
            assert!(read > 0, "the script ended before its banner: {banner}");
        }
        Self { child, banner }
    }
}

impl Drop for ExampleRegistry {
    fn drop(&mut self) {
        // Enter: the script stops its registry and removes its directory.
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// A directory laid out like the checkout for the commands of the README: the shipped
/// `tolerable.toml` and `examples/local.yaml` with the registry's port.
fn checkout_like(port: u16) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        root().join("tolerable.toml"),
        dir.path().join("tolerable.toml"),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("examples")).unwrap();
    let manifest = std::fs::read_to_string(root().join("examples/local.yaml")).unwrap();
    std::fs::write(
        dir.path().join("examples/local.yaml"),
        manifest.replace("127.0.0.1:5000", &format!("127.0.0.1:{port}")),
    )
    .unwrap();
    dir
}

/// Runs a documented `[VAR=VALUE]... cargo run --release -- ARGS` command line in `dir`, with
/// only those variables (and `PATH`, `HOME`) set.
fn run_documented(command: &str, dir: &Path) -> Output {
    let words: Vec<&str> = command.split_whitespace().collect();
    let cargo = words
        .windows(4)
        .position(|w| w == ["cargo", "run", "--release", "--"])
        .expect("a `cargo run --release --` command");
    let mut run = Command::new(env!("CARGO_BIN_EXE_tolerable"));
    run.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir)
        .current_dir(dir)
        .stdin(Stdio::null())
        .args(&words[cargo + 4..]);
    for assignment in &words[..cargo] {
        let (name, value) = assignment.split_once('=').expect("VAR=VALUE");
        run.env(name, value);
    }
    run.output().unwrap()
}

/// The README's offline path, literally: the script's banner, then `review` and `inspect`
/// against the registry it started, each printing the README's sample and exiting 0.
#[test]
fn the_readmes_offline_example_prints_its_samples() {
    let port = common::free_port();
    let at_port = |text: &str| text.replace("127.0.0.1:5000", &format!("127.0.0.1:{port}"));
    let registry = ExampleRegistry::start(port);
    assert_eq!(
        registry.banner,
        at_port(&sample("README.md", "examples/local-registry.sh"))
    );
    let dir = checkout_like(port);
    let commands: Vec<&str> = COMPARED
        .iter()
        .map(|(command, _)| *command)
        .filter(|command| command.contains(" cargo run --release -- "))
        .collect();
    assert_eq!(commands.len(), 2, "review and inspect: {commands:?}");
    for command in commands {
        let out = run_documented(&at_port(command), dir.path());
        assert_eq!(out.status.code(), Some(0), "{command}: {out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            at_port(&sample("README.md", command)),
            "{command}"
        );
    }
}

/// docs/install.md's sample of a `tolerable check` that fails: the API server's answer
/// recorded from a webhook it did not reach (tests/cli/check.rs's fake), the kubeconfig through
/// `$KUBECONFIG` as a user's shell has it; exit status 1.
#[test]
fn check_prints_the_install_pages_unreachable_sample() {
    let requests = Arc::new(Mutex::new(Vec::new()));
    let api = super::check::start(
        super::check::Cluster::PatchDropped { registered: true },
        requests,
    );
    let kubeconfig = common::kube_fake::kubeconfig(api.port, "admintoken");
    let home = tempfile::tempdir().unwrap();
    let out = common::cli::isolated(home.path(), "1s")
        .env("KUBECONFIG", kubeconfig.path())
        .args(["check", "-n", "default"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        sample("docs/install.md", "tolerable check -n default")
    );
}

/// docs/install.md's sample of `tolerable nodes plan`: the node, DaemonSet and Pod lists an API
/// server was recorded answering (tests/data/kube-api/workloads/), the shipped `tolerable.toml`
/// in the working directory, the kubeconfig through `$KUBECONFIG`; its arm64 and s390x nodes
/// already carry their taints: exit status 0, nothing to change.
#[test]
fn nodes_plan_prints_the_install_pages_sample() {
    // The image host is never asked: `nodes plan` looks no image up.
    let api = common::workloads_api::WorkloadsApi::start("127.0.0.1:9");
    let kubeconfig = api.kubeconfig("admintoken");
    let home = tempfile::tempdir().unwrap();
    std::fs::copy(
        root().join("tolerable.toml"),
        home.path().join("tolerable.toml"),
    )
    .unwrap();
    let out = common::cli::isolated(home.path(), "1s")
        .env("KUBECONFIG", kubeconfig.path())
        .args(["nodes", "plan"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        sample("docs/install.md", "tolerable nodes plan")
    );
}

/// The README's "If it does not work" for the offline example: the script refuses a port in use
/// as quoted, and the causes it quotes are what `review` prints on standard error, with exit
/// status 4 — without
/// `TOLERABLE_REGISTRY__INSECURE` (TLS spoken to the plain-HTTP registry), through a proxy
/// named by `http_proxy` (and not with `NO_PROXY=127.0.0.1`), and with the registry stopped.
#[test]
fn the_readmes_lookup_failure_causes_are_what_review_prints() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let (without_tls, refused) = ("it answered without TLS", "Connection refused");
    for quoted in [without_tls, refused] {
        assert!(readme.contains(&format!("`{quoted}`")), "{quoted}");
    }
    let port = common::free_port();
    let dir = checkout_like(port);
    let review = format!(
        "TOLERABLE_REGISTRY__INSECURE=127.0.0.1:{port} cargo run --release -- review examples/local.yaml"
    );
    let registry = ExampleRegistry::start(port);
    // A second script on the same port: refused, saying so.
    let second = Command::new(root().join("examples/local-registry.sh"))
        .arg(port.to_string())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(1), "{second:?}");
    let taken = String::from_utf8_lossy(&second.stderr);
    assert!(
        taken.contains(&format!("did not start on 127.0.0.1:{port}")),
        "{taken}"
    );
    assert!(readme.contains("`did not start on 127.0.0.1:5000`"));
    // The variable naming another host: this registry is not listed, so it is asked over TLS.
    let out = run_documented(&review.replace("127.0.0.1:", "127.0.0.2:"), dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(stderr.contains(without_tls), "{stderr}");
    // A proxy in the shell (a closed port here) is followed even to 127.0.0.1, unless
    // `NO_PROXY` names it.
    let proxied = format!(
        "http_proxy=http://127.0.0.1:{} {review}",
        common::free_port()
    );
    let out = run_documented(&proxied, dir.path());
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains(refused));
    let out = run_documented(&format!("NO_PROXY=127.0.0.1 {proxied}"), dir.path());
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    drop(registry);
    let out = run_documented(&review, dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(stderr.contains(refused), "{stderr}");
}
