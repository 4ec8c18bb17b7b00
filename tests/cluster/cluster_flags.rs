//! Every subcommand that reads the cluster (`serve`, `nodes`, `audit`, `review`) finds it the
//! same way (issue 24, item 10): `--kubeconfig FILE` and `--context NAME` with one help text,
//! else `$KUBECONFIG`, else `~/.kube/config`; a cluster the operator named but that cannot be
//! used is an error naming the flag. Each is run as an operator runs it, against the fake API
//! server (which records the paths asked), with an environment holding nothing else.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::kube_api::{FakeApiServer, RegistryHosts};
use common::process::{prepare, serve_command, ServerProcess};

/// The subcommands that read the cluster, with what each needs besides (review: a Pod whose
/// pull secrets it reads; `--cluster` is added where no flag names the cluster).
const SUBCOMMANDS: [&[&str]; 4] = [&["serve"], &["nodes", "plan"], &["audit"], &["review"]];

/// How the cluster is named to a subcommand.
#[derive(Clone, Copy, Debug)]
enum Named {
    /// `--kubeconfig FILE` (after the subcommand, as `nodes plan --kubeconfig FILE`).
    Flag,
    /// `$KUBECONFIG`.
    Environment,
    /// `~/.kube/config`.
    Home,
    /// `--context fake` of a kubeconfig whose current context is a cluster that is not there.
    Context,
}

/// The fake API server (recorded responses; the registry hosts in its pull secrets are not
/// used by these tests).
fn api() -> FakeApiServer {
    FakeApiServer::start(RegistryHosts {
        basic: "127.0.0.1:1".into(),
        token: "127.0.0.1:1".into(),
    })
}

/// A kubeconfig with two contexts: `fake` (the fake API server, admin token) and `gone` (a
/// closed port), `current` the current one.
fn kubeconfig(dir: &Path, port: u16, current: &str) -> PathBuf {
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, &common::certs::ca().ca_pem).unwrap();
    let gone = common::fake::closed_port();
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n\
         - name: fake\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority: {ca}\n\
         - name: gone\n  cluster:\n    server: https://{gone}\n    certificate-authority: {ca}\n\
         users:\n- name: admin\n  user:\n    token: admintoken\n\
         contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: admin\n\
         - name: gone\n  context:\n    cluster: gone\n    user: admin\n\
         current-context: {current}\n",
        ca = ca.display()
    );
    let path = dir.join(format!("kubeconfig-{current}"));
    std::fs::write(&path, text).unwrap();
    path
}

/// `tolerable ARGS` isolated from this process's environment (`common::cli::isolated`).
fn tolerable(home: &Path) -> Command {
    common::cli::isolated(home, "1s")
}

/// A Pod naming a pull secret, for `review` (its image on a closed port: looked up in vain).
fn pod_file(dir: &Path) -> PathBuf {
    let path = dir.join("pod.yaml");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: team-a\nspec:\n  \
         imagePullSecrets:\n  - name: regcred\n  containers:\n  - name: web\n    image: 127.0.0.1:1/web:v1\n",
    )
    .unwrap();
    path
}

/// Names the fake's cluster to `command` as `named` says; the arguments that go after the
/// subcommand.
fn name_cluster(command: &mut Command, home: &Path, port: u16, named: Named) -> Vec<String> {
    match named {
        Named::Flag => {
            let path = kubeconfig(home, port, "fake");
            vec!["--kubeconfig".into(), path.display().to_string()]
        }
        Named::Environment => {
            command.env("KUBECONFIG", kubeconfig(home, port, "fake"));
            Vec::new()
        }
        Named::Home => {
            std::fs::create_dir_all(home.join(".kube")).unwrap();
            let path = kubeconfig(home, port, "fake");
            std::fs::rename(path, home.join(".kube/config")).unwrap();
            Vec::new()
        }
        Named::Context => {
            let path = kubeconfig(home, port, "gone");
            let path = path.display().to_string();
            vec![
                "--kubeconfig".into(),
                path,
                "--context".into(),
                "fake".into(),
            ]
        }
    }
}

/// Runs `subcommand` with the cluster named as `named`, until the fake has been asked
/// something by it (a one-shot command: until it ends); the paths it asked.
async fn asked_by(api: &FakeApiServer, subcommand: &[&str], named: Named) -> Vec<String> {
    let home = tempfile::tempdir().unwrap();
    let before = api.requests().len();
    let (serving, addr) = prepare();
    let mut command = match subcommand {
        ["serve"] => {
            let mut command = serve_command(env!("CARGO_BIN_EXE_tolerable"), serving.path(), addr);
            command
                .env("HOME", home.path())
                .env("TOLERABLE_CREDENTIALS__READ_PULL_SECRETS", "false")
                .env("TOLERABLE_NODES__WATCH", "true");
            command
        }
        _ => tolerable(home.path()),
    };
    command.args(subcommand);
    let mut args = name_cluster(&mut command, home.path(), api.port, named);
    if subcommand == ["review"] {
        if matches!(named, Named::Environment | Named::Home) {
            args.push("--cluster".into());
        }
        args.push(pod_file(home.path()).display().to_string());
    }
    command.args(&args);
    if subcommand == ["serve"] {
        let child = command.stdout(Stdio::null()).spawn().unwrap();
        let _serving = ServerProcess {
            child,
            addr,
            dir: serving,
        };
        common::until("serve to list the nodes", || {
            api.requests()[before..]
                .iter()
                .any(|p| p == "/api/v1/nodes")
        })
        .await;
    } else {
        let out = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("no Kubernetes API configuration"),
            "{subcommand:?} {named:?}: {stderr}"
        );
    }
    api.requests()[before..].to_vec()
}

/// Each subcommand reads the cluster named by the flag, by `$KUBECONFIG`, by `~/.kube/config`,
/// and by `--context`: the fake is asked what that subcommand reads (the Nodes; audit's first
/// list; review's ServiceAccount and pull secret).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subcommand_reads_the_cluster_named_the_same_way() {
    let api = api();
    for subcommand in SUBCOMMANDS {
        for named in [Named::Flag, Named::Environment, Named::Home, Named::Context] {
            let asked = asked_by(&api, subcommand, named).await;
            let expected = match subcommand[0] {
                "serve" | "nodes" => "/api/v1/nodes",
                "review" => "/api/v1/namespaces/team-a/secrets/regcred",
                // audit: whichever list comes first.
                _ => "/",
            };
            assert!(
                asked.iter().any(|p| p.starts_with(expected)),
                "{subcommand:?} with the cluster named by {named:?} asked {asked:?}"
            );
        }
    }
}

/// `--kubeconfig` wins over `$KUBECONFIG` (here a file that is not a kubeconfig), as kubectl's:
/// the plan is the fake's Nodes' (the amd64 ones to taint, arm64 being the default pool).
#[test]
fn the_flag_wins_over_the_environment() {
    let api = api();
    let home = tempfile::tempdir().unwrap();
    let broken = home.path().join("broken");
    std::fs::write(&broken, "not: [a kubeconfig").unwrap();
    let path = kubeconfig(home.path(), api.port, "fake");
    let tolerable = |home: &Path| {
        let mut command = tolerable(home);
        command
            .env("TOLERABLE_POLICY__DEFAULT_ARCHITECTURES", "arm64")
            .env("TOLERABLE_POLICY__SUPPORTED_ARCHITECTURES", "amd64, s390x");
        command
    };
    let out = tolerable(home.path())
        .env("KUBECONFIG", &broken)
        .args(["nodes", "plan", "--kubeconfig"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.starts_with("amd-1") && l.contains("would add")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Before the subcommand's own arguments too: `nodes --kubeconfig FILE plan`.
    let out = tolerable(home.path())
        .env("KUBECONFIG", &broken)
        .args(["nodes", "--kubeconfig"])
        .arg(&path)
        .arg("plan")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A cluster named but unusable — a kubeconfig that does not exist, a context it does not
/// have — is an error naming the flag on every subcommand: exit status 2, `serve` included
/// (it never runs without the cluster the operator asked for).
#[test]
fn a_cluster_named_but_unusable_is_an_error_naming_the_flag() {
    let home = tempfile::tempdir().unwrap();
    let missing = home.path().join("no-such-kubeconfig");
    let real = kubeconfig(home.path(), 1, "fake");
    let pod = pod_file(home.path()).display().to_string();
    let (serving, addr) = prepare();
    for subcommand in SUBCOMMANDS {
        let cases: [(Vec<String>, String); 2] = [
            (
                vec!["--kubeconfig".into(), missing.display().to_string()],
                format!("--kubeconfig {}", missing.display()),
            ),
            (
                vec![
                    "--kubeconfig".into(),
                    real.display().to_string(),
                    "--context".into(),
                    "nowhere".into(),
                ],
                "nowhere".into(),
            ),
        ];
        for (args, named) in cases {
            let mut command = match subcommand {
                ["serve"] => {
                    let mut serve =
                        serve_command(env!("CARGO_BIN_EXE_tolerable"), serving.path(), addr);
                    // What it reads of the cluster does not matter: a named cluster is checked.
                    serve
                        .env("TOLERABLE_CREDENTIALS__READ_PULL_SECRETS", "false")
                        .env("TOLERABLE_NODES__WATCH", "false");
                    serve
                }
                _ => tolerable(home.path()),
            };
            command.args(subcommand).args(&args);
            if subcommand == ["review"] {
                command.arg(&pod);
            }
            let out = ended(&mut command, subcommand);
            let stderr = stderr(&out);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{subcommand:?} {args:?}: {stderr}"
            );
            assert!(stderr.contains(&named), "{subcommand:?} {args:?}: {stderr}");
        }
    }
}

/// `command`'s output once it has ended; a failure if it is still running after 30 s (a hang
/// guard: `serve` that started without the cluster it was given would never end).
fn ended(command: &mut Command, subcommand: &[&str]) -> Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > give_up {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("{subcommand:?} still running after 30 s: {}", stderr(&out));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// One help text for the flags, whichever subcommand shows it.
#[test]
fn the_flags_have_one_help_text_on_every_subcommand() {
    let mut texts = std::collections::BTreeSet::new();
    for subcommand in [
        &["serve"][..],
        &["nodes", "plan"],
        &["nodes", "taint"],
        &["nodes", "untaint"],
        &["audit"],
        &["review"],
    ] {
        let help = common::cli::help(subcommand);
        let flags = flag_help(&help, "--kubeconfig <FILE>") + &flag_help(&help, "--context <NAME>");
        assert!(flags.contains("$KUBECONFIG"), "{subcommand:?}: {help}");
        texts.insert(flags.split_whitespace().collect::<Vec<_>>().join(" "));
    }
    assert_eq!(texts.len(), 1, "{texts:#?}");
}

/// The paragraph `--help` shows for `flag`: its line and the indented lines under it.
fn flag_help(help: &str, flag: &str) -> String {
    let mut lines = help
        .lines()
        .skip_while(|l| !l.trim_start().starts_with(flag));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no {flag} in:\n{help}"));
    let mut text = first.trim().to_owned();
    for line in lines.take_while(|l| l.starts_with("          ")) {
        text.push(' ');
        text.push_str(line.trim());
    }
    text
}
