//! Every subcommand's `--help` lists its exit statuses (issue 24, item 10), and they are the
//! ones it returns: each run here ends with a status its help lists, with the meaning the help
//! gives it, and every status a help lists is one a run here ended with. The binary as an
//! operator runs it; the cluster is the fake API server, the registry the test one.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::gates_api::GatesApiServer;
use common::kube_api::{FakeApiServer, RegistryHosts};
use common::workloads_api::WorkloadsApi;

/// The subcommands with their own help, as run.
const SUBCOMMANDS: [&[&str]; 12] = [
    &["serve"],
    &["review"],
    &["inspect"],
    &["audit"],
    &["nodes", "plan"],
    &["nodes", "taint"],
    &["nodes", "untaint"],
    &["gates", "list"],
    &["gates", "release"],
    &["crashes", "list"],
    &["crashes", "forget"],
    &["check"],
];

/// Statuses a help lists that no run here can end with yet, and why: `check`'s 0 needs an API
/// server that returns a dry-run Pod carrying tolerable's decision, and no such exchange is
/// recorded (tests/cli/check.rs; `cmd::check`'s unit test decides on that answer).
const NOT_RECORDED: &[(&str, u8)] = &[("check", 0)];

/// `tolerable ARGS` isolated from this process's environment (`common::cli::isolated`).
fn tolerable(home: &Path) -> Command {
    common::cli::isolated(home, "2s")
}

/// The `Exit status:` section of `subcommand --help`: each code and its meaning (the lines
/// under it joined).
fn listed(subcommand: &[&str]) -> BTreeMap<u8, String> {
    let help = common::cli::help(subcommand);
    let section = help
        .split_once("Exit status:\n")
        .unwrap_or_else(|| panic!("{subcommand:?}: no exit statuses in\n{help}"))
        .1;
    let mut statuses = BTreeMap::new();
    let mut last = None;
    for line in section.lines().take_while(|l| !l.trim().is_empty()) {
        let trimmed = line.trim_start();
        let code = trimmed
            .split_once("  ")
            .and_then(|(code, _)| code.parse::<u8>().ok());
        match code {
            Some(code) => {
                let meaning = trimmed.split_once("  ").unwrap().1.trim().to_owned();
                assert!(
                    statuses.insert(code, meaning).is_none(),
                    "{code} twice: {help}"
                );
                last = Some(code);
            }
            None => {
                let code = last.unwrap_or_else(|| panic!("{subcommand:?}: {line:?}"));
                let meaning = statuses.get_mut(&code).unwrap();
                meaning.push(' ');
                meaning.push_str(trimmed);
            }
        }
    }
    assert!(!statuses.is_empty(), "{subcommand:?}: {help}");
    statuses
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// What the runs ended with, per subcommand; each checked against its help as it comes.
struct Seen {
    help: BTreeMap<String, BTreeMap<u8, String>>,
    codes: BTreeMap<String, BTreeSet<u8>>,
}

impl Seen {
    fn new() -> Self {
        let help = SUBCOMMANDS
            .iter()
            .map(|s| (s.join(" "), listed(s)))
            .collect();
        Self {
            help,
            codes: BTreeMap::new(),
        }
    }

    /// `out` of `subcommand` ended with `expected`, which its help lists with a meaning
    /// containing `meaning`.
    fn ended(&mut self, subcommand: &[&str], out: &Output, expected: u8, meaning: &str) {
        let name = subcommand.join(" ");
        assert_eq!(
            out.status.code(),
            Some(i32::from(expected)),
            "{name}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            stderr(out)
        );
        let listed = &self.help[&name];
        let said = listed
            .get(&expected)
            .unwrap_or_else(|| panic!("{name} returned {expected}, not in its help: {listed:?}"));
        assert!(said.contains(meaning), "{name} {expected}: {said}");
        self.codes.entry(name).or_default().insert(expected);
    }

    /// Every status each help lists was seen (but those [`NOT_RECORDED`] names, which the
    /// helps must still list).
    fn all_seen(&self) {
        for (name, code) in NOT_RECORDED {
            assert!(
                self.help[*name].contains_key(code),
                "{name} {code}: not listed"
            );
        }
        for (name, listed) in &self.help {
            let listed: BTreeSet<u8> = listed
                .keys()
                .copied()
                .filter(|code| !NOT_RECORDED.contains(&(name.as_str(), *code)))
                .collect();
            assert_eq!(
                self.codes.get(name).cloned().unwrap_or_default(),
                listed,
                "{name}: listed statuses no run here ended with"
            );
        }
    }
}

/// Runs `command` with its standard output closed before it writes: it ends as a command
/// whose reader stopped reading.
fn reader_gone(command: &mut Command) -> Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

fn nodes(seen: &mut Seen, home: &Path) {
    let api = FakeApiServer::start(RegistryHosts {
        basic: "127.0.0.1:1".into(),
        token: "127.0.0.1:1".into(),
    });
    let kubeconfig = common::kube_api::kubeconfig(api.port, "admintoken");
    let run = |args: &[&str], policy: bool| {
        let mut command = tolerable(home);
        command
            .args(args)
            .arg("--kubeconfig")
            .arg(kubeconfig.path());
        if policy {
            command
                .env("TOLERABLE_POLICY__DEFAULT_ARCHITECTURES", "arm64")
                .env("TOLERABLE_POLICY__SUPPORTED_ARCHITECTURES", "amd64, s390x");
        }
        command
    };
    let plan = &["nodes", "plan"][..];
    seen.ended(plan, &run(plan, false).output().unwrap(), 0, "no node");
    seen.ended(plan, &run(plan, true).output().unwrap(), 1, "would change");
    seen.ended(plan, &reader_gone(&mut run(plan, true)), 141, "stopped");
    let (taint, untaint) = (&["nodes", "taint"][..], &["nodes", "untaint"][..]);
    api.set_webhook_registered(false);
    seen.ended(taint, &run(taint, true).output().unwrap(), 2, "refused");
    api.set_webhook_registered(true);
    seen.ended(taint, &reader_gone(&mut run(taint, true)), 141, "stopped");
    seen.ended(taint, &run(taint, true).output().unwrap(), 0, "done");
    seen.ended(
        untaint,
        &reader_gone(&mut run(untaint, true)),
        141,
        "stopped",
    );
    seen.ended(untaint, &run(untaint, true).output().unwrap(), 0, "done");
    let missing = home.join("no-kubeconfig");
    let out = tolerable(home)
        .args(["nodes", "untaint", "--kubeconfig"])
        .arg(&missing)
        .output()
        .unwrap();
    seen.ended(untaint, &out, 2, "could not run");
    let out = tolerable(home)
        .args(["nodes", "plan", "--kubeconfig"])
        .arg(&missing)
        .output()
        .unwrap();
    seen.ended(plan, &out, 2, "could not run");
}

fn gates(seen: &mut Seen, home: &Path) {
    let api = GatesApiServer::start();
    let mut pod = common::gates_api::recorded_json("pod-create-gated.request.json");
    pod["metadata"]["namespace"] = serde_json::json!("default");
    api.create("default", pod).unwrap();
    let kubeconfig = common::kube_api::kubeconfig(api.port, "admintoken");
    let run = |args: &[&str], kubeconfig: &Path| {
        let mut command = tolerable(home);
        command.args(args).arg("--kubeconfig").arg(kubeconfig);
        command
    };
    let (list, release) = (&["gates", "list"][..], &["gates", "release"][..]);
    let good = kubeconfig.path();
    let missing = home.join("no-kubeconfig");
    seen.ended(list, &run(list, good).output().unwrap(), 0, "listed");
    seen.ended(list, &reader_gone(&mut run(list, good)), 141, "stopped");
    seen.ended(
        list,
        &run(list, &missing).output().unwrap(),
        2,
        "could not run",
    );
    let named = |pods: &[&'static str]| -> Vec<&'static str> { [release, pods].concat() };
    let out = run(&named(&["gone"]), good).output().unwrap();
    seen.ended(release, &out, 1, "not found");
    let out = reader_gone(&mut run(&named(&["gated-1"]), good));
    seen.ended(release, &out, 141, "stopped");
    let out = run(&named(&["--all"]), good).output().unwrap();
    seen.ended(release, &out, 0, "done");
    let out = run(&named(&["--all"]), &missing).output().unwrap();
    seen.ended(release, &out, 2, "could not run");
}

/// `crashes list | forget` with a real redis-server (one digest learned), without a shared
/// cache, and with one that refuses connections.
async fn crashes(seen: &mut Seen, home: &Path) {
    let redis = common::redis::RedisServer::start();
    let store = tolerable::crashes::shared::SharedLearned::new(redis.settings()).unwrap();
    let learned = format!("sha256:{}", "c".repeat(64));
    let day = std::time::Duration::from_secs(86_400);
    store.learn("shop", &learned, "arm64", day).await.unwrap();
    let run = |args: &[&str], url: Option<&str>| {
        let mut command = tolerable(home);
        command.arg("crashes").args(args);
        if let Some(url) = url {
            command.env("TOLERABLE_SHARED_CACHE__URL", url);
        }
        command
    };
    let (list, forget) = (&["crashes", "list"][..], &["crashes", "forget"][..]);
    let (up, down) = (Some(redis.url()), Some("redis://127.0.0.1:1/0".to_owned()));
    for (args, url, code, meaning) in [
        (&["list"][..], &up, 0, "listed"),
        (&["list"][..], &None, 3, "no shared cache"),
        (&["list"][..], &down, 2, "could not run"),
        (&["forget", "sha256:0"][..], &up, 1, "nothing was learned"),
        (&["forget", learned.as_str()][..], &up, 0, "forgotten"),
        (
            &["forget", learned.as_str()][..],
            &None,
            3,
            "no shared cache",
        ),
        (&["forget", learned.as_str()][..], &down, 2, "could not run"),
    ] {
        let out = run(args, url.as_deref()).output().unwrap();
        let which = if args[0] == "list" { list } else { forget };
        seen.ended(which, &out, code, meaning);
    }
    let out = reader_gone(&mut run(&["list"], up.as_deref()));
    seen.ended(list, &out, 141, "stopped");
    let out = reader_gone(&mut run(&["forget", "sha256:0"], up.as_deref()));
    seen.ended(forget, &out, 141, "stopped");
}

fn inspect(seen: &mut Seen, home: &Path) {
    let registry = &common::registry::plain().host;
    let good = format!("{registry}/fixtures/multiarch-oci:v1");
    let run = |images: &[&str]| {
        let mut command = tolerable(home);
        command
            .env("TOLERABLE_REGISTRY__INSECURE", registry)
            .arg("inspect")
            .args(images);
        command
    };
    let inspect = &["inspect"][..];
    seen.ended(inspect, &run(&[&good]).output().unwrap(), 0, "looked up");
    let out = run(&[&good, "127.0.0.1:1/gone:v1"]).output().unwrap();
    seen.ended(inspect, &out, 1, "could not be looked up");
    seen.ended(inspect, &run(&[]).output().unwrap(), 2, "could not run");
    seen.ended(inspect, &reader_gone(&mut run(&[&good])), 141, "stopped");
}

fn audit(seen: &mut Seen, home: &Path) {
    let api = WorkloadsApi::start("127.0.0.1:1");
    let kubeconfig = api.kubeconfig("admintoken");
    let run = |kubeconfig: &Path| {
        let mut command = tolerable(home);
        command.arg("audit").arg("--kubeconfig").arg(kubeconfig);
        command
    };
    let audit = &["audit"][..];
    seen.ended(
        audit,
        &run(kubeconfig.path()).output().unwrap(),
        0,
        "reported",
    );
    seen.ended(
        audit,
        &reader_gone(&mut run(kubeconfig.path())),
        141,
        "stopped",
    );
    let out = run(&home.join("no-kubeconfig")).output().unwrap();
    seen.ended(audit, &out, 2, "could not run");
}

/// A Pod manifest in `dir` named `name`, one container per image.
fn pod(dir: &Path, name: &str, images: &[&str]) -> String {
    let containers: String = images
        .iter()
        .enumerate()
        .map(|(i, image)| format!("  - name: c{i}\n    image: {image}\n"))
        .collect();
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n{containers}"),
    )
    .unwrap();
    path.display().to_string()
}

fn review(seen: &mut Seen, home: &Path) {
    let registry = &common::registry::plain().host;
    let image = |name: &str| format!("{registry}/fixtures/{name}:v1");
    let run = |args: &[&str]| {
        let mut command = common::cli::tolerable();
        command.arg("review").args(args).stdin(Stdio::null());
        command
    };
    let review = &["review"][..];
    let good = pod(home, "good", &[&image("multiarch-oci")]);
    seen.ended(review, &run(&[&good]).output().unwrap(), 0, "no problem");
    seen.ended(review, &reader_gone(&mut run(&[&good])), 141, "stopped");
    let apart = pod(
        home,
        "apart",
        &[&image("arm64-oci"), &image("s390x-docker")],
    );
    seen.ended(review, &run(&[&apart]).output().unwrap(), 1, "share no");
    let unknown = pod(home, "unknown", &["127.0.0.1:1/gone:v1"]);
    seen.ended(
        review,
        &run(&[&unknown]).output().unwrap(),
        4,
        "not be looked up",
    );
    let empty = home.join("empty.yaml");
    std::fs::write(&empty, "").unwrap();
    let out = run(&[empty.to_str().unwrap()]).output().unwrap();
    seen.ended(review, &out, 2, "could not run");
    let repo = home.join("repo");
    std::fs::create_dir(&repo).unwrap();
    pod(&repo, "web", &[&image("multiarch-oci")]);
    std::fs::write(repo.join("kustomization.yaml"), "resources:\n- web.yaml\n").unwrap();
    let out = run(&["--strict", repo.to_str().unwrap()]).output().unwrap();
    seen.ended(review, &out, 3, "--strict");
}

/// `serve`: 2 when it cannot start, 0 when SIGTERM stopped it once it was serving.
async fn serve(seen: &mut Seen) {
    let serve = &["serve"][..];
    let program = env!("CARGO_BIN_EXE_tolerable");
    let (dir, addr) = common::process::prepare();
    let out = common::process::serve_command(program, dir.path(), addr)
        .env("TOLERABLE_SERVER__LISTEN_ADDR", "not an address")
        .arg("serve")
        .output()
        .unwrap();
    seen.ended(serve, &out, 2, "could not start");
    let mut child = common::process::serve_command(program, dir.path(), addr)
        .env("TOLERABLE_CREDENTIALS__READ_PULL_SECRETS", "false")
        .env("TOLERABLE_NODES__WATCH", "false")
        .arg("serve")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::until("serve to listen", || {
        std::net::TcpStream::connect(addr).is_ok()
    })
    .await;
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    let out = Output {
        status,
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    seen.ended(serve, &out, 0, "SIGTERM");
}

/// `check` against the fake of tests/cli/check.rs (a Pod create the API server answered without
/// tolerable's decision): 1, and 141 when nobody reads its answer; no kubeconfig: 2.
fn check(seen: &mut Seen, home: &Path) {
    use crate::check::{start, Cluster};
    let requests = std::sync::Arc::default();
    let port = start(Cluster::PatchDropped { registered: true }, requests);
    let kubeconfig = common::kube_api::kubeconfig(port, "admintoken");
    let run = |config: &Path| {
        let mut command = tolerable(home);
        command.args(["check", "--kubeconfig"]).arg(config);
        command
    };
    let check = &["check"][..];
    let out = run(kubeconfig.path()).output().unwrap();
    seen.ended(check, &out, 1, "did not decide");
    seen.ended(
        check,
        &reader_gone(&mut run(kubeconfig.path())),
        141,
        "stopped",
    );
    let missing = run(&home.join("no-kubeconfig")).output().unwrap();
    seen.ended(check, &missing, 2, "could not run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listed_exit_status_is_returned_and_every_returned_one_listed() {
    let home = tempfile::tempdir().unwrap();
    let mut seen = Seen::new();
    nodes(&mut seen, home.path());
    review(&mut seen, home.path());
    inspect(&mut seen, home.path());
    audit(&mut seen, home.path());
    gates(&mut seen, home.path());
    crashes(&mut seen, home.path()).await;
    check(&mut seen, home.path());
    serve(&mut seen).await;
    seen.all_seen();
}

/// `review` lists the statuses a CI gate relies on, `2` and `141` with the meaning every
/// subcommand gives them.
#[test]
fn review_lists_its_statuses_in_the_same_form() {
    let review = listed(&["review"]);
    assert_eq!(
        review.keys().copied().collect::<Vec<_>>(),
        [0, 1, 2, 3, 4, 141]
    );
    let nodes = listed(&["nodes", "plan"]);
    assert_eq!(review[&141], nodes[&141]);
    assert!(review[&2].starts_with("could not run"), "{}", review[&2]);
}
