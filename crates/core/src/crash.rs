//! Wrong-architecture crashes (issue 38), as pure functions of what the API shows: whether a
//! container's last termination is the entrypoint's failed exec a runtime prints (and which
//! runtime's text it is), and whether the facts gathered on the crash confirm it is the
//! architecture — the same text also comes from an entrypoint script without a shebang, on
//! every architecture. The shell reads the Pod, the log and the registry; nothing here keeps
//! time: a run's length is given.

use super::platform::{node_runs, NodeRuntime, Platform, Runs};

/// A run this short or shorter is a failed start (the runtimes leave ~0 s).
pub const QUICK_RUN_SECONDS: i64 = 10;

/// Bytes of a message or log tail read at most (the kubelet copies ≤ 2 KiB).
pub const MAX_TEXT_BYTES: usize = 4096;

/// A container's `lastState.terminated`, as plain data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Termination<'a> {
    pub reason: &'a str,
    pub exit_code: i32,
    /// `message` (the log's last lines with `FallbackToLogsOnError`).
    pub message: Option<&'a str>,
    /// `finishedAt - startedAt` in seconds, when both are known.
    pub ran_seconds: Option<i64>,
}

/// Which runtime's text matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Runtime {
    /// runc ≥ 1.1: `exec <path>: exec format error`, exit 255.
    Runc,
    /// runc before 1.1: `standard_init_linux.go:NNN: exec user process caused: exec format
    /// error`, exit 1.
    RuncBefore1_1,
    /// crun: ``exec container process `<path>`: Exec format error``, exit 1.
    Crun,
}

impl Runtime {
    fn exit_code(self) -> i32 {
        match self {
            Self::Runc => 255,
            Self::RuncBefore1_1 | Self::Crun => 1,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Runc => "runc",
            Self::RuncBefore1_1 => "runc<1.1",
            Self::Crun => "crun",
        }
    }
}

/// An entrypoint's failed exec, as a runtime printed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecFormatError {
    pub runtime: Runtime,
    /// The program that failed, when the text names it.
    pub path: Option<String>,
}

/// The runtime's text in one line, and the program it names.
fn match_line(line: &str) -> Option<ExecFormatError> {
    let line = line.trim();
    if let Some(path) = line
        .strip_prefix("exec ")
        .and_then(|rest| rest.strip_suffix(": exec format error"))
    {
        return Some(ExecFormatError {
            runtime: Runtime::Runc,
            path: Some(path.to_owned()).filter(|p| !p.is_empty()),
        });
    }
    if let Some(rest) = line.strip_prefix("standard_init_linux.go:") {
        let (number, text) = rest.split_once(':')?;
        let numbered = !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit());
        let matched = numbered && text.trim() == "exec user process caused: exec format error";
        return matched.then_some(ExecFormatError {
            runtime: Runtime::RuncBefore1_1,
            path: None,
        });
    }
    let path = line
        .strip_prefix("exec container process `")?
        .strip_suffix("`: Exec format error")?;
    Some(ExecFormatError {
        runtime: Runtime::Crun,
        path: Some(path.to_owned()),
    })
}

/// The first runtime text in `text` (its last [`MAX_TEXT_BYTES`]).
fn find(text: &str) -> Option<ExecFormatError> {
    let mut start = text.len().saturating_sub(MAX_TEXT_BYTES);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].lines().find_map(match_line)
}

/// Whether `terminated` (and, when the message has not the text, the previous log's last lines
/// `log_tail`) is a runtime's failed exec: reason `Error`, a quick run, the runtime's exit code
/// and its text. An OOM kill, a long run or another text is not.
pub fn exec_format_error(
    terminated: &Termination<'_>,
    log_tail: Option<&str>,
) -> Option<ExecFormatError> {
    if terminated.reason != "Error"
        || terminated
            .ran_seconds
            .is_some_and(|s| s > QUICK_RUN_SECONDS)
    {
        return None;
    }
    let found = terminated
        .message
        .and_then(find)
        .or_else(|| log_tail.and_then(find))?;
    (found.runtime.exit_code() == terminated.exit_code).then_some(found)
}

/// What is known when a crash is confirmed (or not).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrashFacts<'a> {
    /// The node's `kubernetes.io/os` and `kubernetes.io/arch`.
    pub node_os: &'a str,
    pub node_arch: &'a str,
    /// The platforms the image's index claims (`None`: not known).
    pub claimed: Option<&'a [Platform]>,
    /// (b) The config of the manifest the index gives for the node's platform: its OS and
    /// architecture (`None`: not read).
    pub config_of_node_entry: Option<(&'a str, &'a str)>,
    /// (c) Architectures of other nodes where the same image's containers started and are
    /// ready.
    pub runs_on: &'a [String],
}

/// What a confirmed (or unconfirmed) exec format error means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The image does not run on the node's architecture although its index says it does:
    /// learn it (`digest` does not run on `arch`).
    WrongArchitecture { arch: String, why: Confirmed },
    /// (a) The node's architecture is not among the image's platforms (a Pod placed without
    /// tolerable's decision): flag it, nothing new to learn.
    NotAmongPlatforms { arch: String },
    /// Not shown to be the architecture (an entrypoint without a shebang?): report, learn
    /// nothing.
    Unconfirmed,
}

/// How a wrong architecture was shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Confirmed {
    /// (b) The index's entry for the node's platform points at a manifest whose config says
    /// another OS or architecture.
    MislabelledIndex {
        config_os: String,
        config_arch: String,
    },
    /// (c) The image runs on nodes of these other architectures.
    RunsElsewhere(Vec<String>),
}

/// Confirms an exec format error on a node as the architecture's, from `facts`: (a) first (the
/// index does not claim the node's architecture at all), then (b), then (c).
pub fn confirm(facts: &CrashFacts<'_>, runtime: &NodeRuntime<'_>) -> Verdict {
    let arch = facts.node_arch.to_owned();
    if let Some(claimed) = facts.claimed {
        if matches!(
            node_runs(facts.node_os, facts.node_arch, claimed, runtime),
            Runs::No
        ) {
            return Verdict::NotAmongPlatforms { arch };
        }
    }
    if let Some((os, config_arch)) = facts.config_of_node_entry {
        if os != facts.node_os || config_arch != facts.node_arch {
            return Verdict::WrongArchitecture {
                arch,
                why: Confirmed::MislabelledIndex {
                    config_os: os.to_owned(),
                    config_arch: config_arch.to_owned(),
                },
            };
        }
    }
    let mut elsewhere: Vec<String> = facts
        .runs_on
        .iter()
        .filter(|a| **a != facts.node_arch)
        .cloned()
        .collect();
    elsewhere.sort();
    elsewhere.dedup();
    if elsewhere.is_empty() {
        Verdict::Unconfirmed
    } else {
        Verdict::WrongArchitecture {
            arch,
            why: Confirmed::RunsElsewhere(elsewhere),
        }
    }
}

/// The Warning Event's note on the Pod: the container, the image, the node and its
/// architecture, what the index claimed, and what the verdict rests on.
pub fn describe(
    container: &str,
    image: &str,
    (node, arch): (&str, &str),
    claimed: Option<&[Platform]>,
    verdict: &Verdict,
) -> String {
    let claims = match claimed {
        Some(platforms) => super::explain::comma_list(platforms.iter().map(ToString::to_string)),
        None => "(not known)".to_owned(),
    };
    let head = format!("container {container}: exec format error on {arch} node {node}");
    match verdict {
        Verdict::WrongArchitecture {
            why: Confirmed::MislabelledIndex { config_os, config_arch },
            ..
        } => format!(
            "{head}; the index of {image} claims {claims}, but its entry for {arch} is a {config_os}/{config_arch} image"
        ),
        Verdict::WrongArchitecture {
            why: Confirmed::RunsElsewhere(archs),
            ..
        } => format!(
            "{head}; {image} runs on {} nodes: its {arch} image does not run on {arch} (the index claims {claims})",
            archs.join(", ")
        ),
        Verdict::NotAmongPlatforms { .. } => {
            format!("{head}; the index of {image} claims only {claims}")
        }
        Verdict::Unconfirmed => format!(
            "{head}, not shown to be the architecture (an entrypoint without a shebang?); the index of {image} claims {claims}"
        ),
    }
}

impl Verdict {
    /// The metric's label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::WrongArchitecture { .. } => "wrong_architecture",
            Self::NotAmongPlatforms { .. } => "not_among_platforms",
            Self::Unconfirmed => "unconfirmed",
        }
    }

    /// The labels, in the metric's order.
    pub const LABELS: [&'static str; 3] =
        ["wrong_architecture", "not_among_platforms", "unconfirmed"];

    /// The Events' reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::WrongArchitecture { .. } | Self::NotAmongPlatforms { .. } => "WrongArchitecture",
            Self::Unconfirmed => "ExecFormatError",
        }
    }
}

/// The annotation the crash watch marks a crashed Pod with (the verdict, the container, the
/// image and the node's architecture), where `kubectl get pod -o yaml` and selectors on
/// annotations-aware tools show it.
pub const CRASH_ANNOTATION: &str = "tolerable.io/crash";

/// The [`CRASH_ANNOTATION`]'s value: `wrong-architecture` (confirmed, or on an architecture
/// the index lacks) or `exec-format-error` (not shown to be the architecture), then
/// `container=…; image=…; node-arch=…`.
pub fn mark(verdict: &Verdict, container: &str, image: &str, node_arch: &str) -> String {
    let what = match verdict {
        Verdict::WrongArchitecture { .. } | Verdict::NotAmongPlatforms { .. } => {
            "wrong-architecture"
        }
        Verdict::Unconfirmed => "exec-format-error",
    };
    format!("{what}; container={container}; image={image}; node-arch={node_arch}")
}

/// `fact` without the platforms of the architectures learned not to run its digest
/// (`learned`, from crashes), and the warning saying so; `None` when nothing is left out.
pub fn leave_out(
    image: &str,
    fact: &super::ImageFact,
    learned: &[String],
) -> Option<(super::ImageFact, String)> {
    let left_out: Vec<&String> = learned
        .iter()
        .filter(|a| {
            fact.platforms
                .iter()
                .any(|p| &*p.architecture == a.as_str())
        })
        .collect();
    if left_out.is_empty() {
        return None;
    }
    let mut kept = fact.clone();
    kept.platforms
        .retain(|p| !left_out.iter().any(|a| &*p.architecture == a.as_str()));
    let archs = super::explain::comma_list(left_out);
    let digest = fact.digest.as_deref().unwrap_or("its digest");
    let warning = format!(
        "{image} ({digest}) crashed with exec format error on {archs} although its index claims it: {archs} left out"
    );
    Some((kept, warning))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended<'a>(reason: &'a str, exit_code: i32, message: &'a str, ran: i64) -> Termination<'a> {
        Termination {
            reason,
            exit_code,
            message: Some(message).filter(|m| !m.is_empty()),
            ran_seconds: Some(ran),
        }
    }

    type Expected = Option<(Runtime, Option<&'static str>)>;

    /// Each runtime's text with its exit code; the wrong code, a long run, OOMKilled, another
    /// text, none: not an exec format error.
    #[test]
    fn each_runtimes_text_and_nothing_else() {
        let runc = "exec /usr/local/bin/web: exec format error\n";
        let old = "standard_init_linux.go:228: exec user process caused: exec format error";
        let crun = "exec container process `/app/run`: Exec format error";
        let table: &[(Termination<'_>, Expected)] = &[
            (
                ended("Error", 255, runc, 0),
                Some((Runtime::Runc, Some("/usr/local/bin/web"))),
            ),
            (
                ended("Error", 1, old, 0),
                Some((Runtime::RuncBefore1_1, None)),
            ),
            (
                ended("Error", 1, crun, 1),
                Some((Runtime::Crun, Some("/app/run"))),
            ),
            // The text with another runtime's exit code.
            (ended("Error", 1, runc, 0), None),
            (ended("Error", 255, crun, 0), None),
            // Ran for a minute: not a failed start.
            (ended("Error", 255, runc, 60), None),
            (ended("OOMKilled", 137, "", 0), None),
            (ended("OOMKilled", 255, runc, 0), None),
            (ended("Error", 1, "panic: config file missing", 0), None),
            (ended("Error", 255, "", 0), None),
            (ended("Completed", 0, "", 0), None),
            // A line that only mentions it.
            (
                ended(
                    "Error",
                    255,
                    "retrying after exec /x: exec format error twice",
                    0,
                ),
                None,
            ),
        ];
        for (terminated, expected) in table {
            let found = exec_format_error(terminated, None);
            let found = found.map(|f| (f.runtime, f.path));
            let expected = expected.map(|(r, p)| (r, p.map(str::to_owned)));
            assert_eq!(found, expected, "{terminated:?}");
        }
    }

    #[test]
    fn the_log_tail_is_read_when_the_message_lacks_the_text() {
        let terminated = ended("Error", 255, "", 0);
        let tail = "starting\nexec /entrypoint.sh: exec format error\n";
        let found = exec_format_error(&terminated, Some(tail)).unwrap();
        assert_eq!(found.path.as_deref(), Some("/entrypoint.sh"));
        let unknown_length = Termination {
            ran_seconds: None,
            ..terminated
        };
        assert!(exec_format_error(&unknown_length, Some(tail)).is_some());
    }

    #[test]
    fn only_the_last_bytes_of_a_long_text_are_read() {
        let text = format!("exec /a: exec format error\n{}", "x".repeat(MAX_TEXT_BYTES));
        assert_eq!(
            exec_format_error(&ended("Error", 255, &text, 0), None),
            None
        );
    }

    fn platforms(list: &[&str]) -> Vec<Platform> {
        list.iter()
            .map(|p| {
                let (os, arch) = p.split_once('/').unwrap();
                Platform::normalized(os, arch, None)
            })
            .collect()
    }

    const RUNTIME: NodeRuntime<'static> = NodeRuntime {
        variant: None,
        amd64_runs_386: true,
        arm64_runs_arm32: false,
    };

    #[test]
    fn confirmations_a_b_c_and_unconfirmed() {
        let both = platforms(&["linux/amd64", "linux/arm64"]);
        let amd64_only = platforms(&["linux/amd64"]);
        let on_arm = |claimed, config, runs_on| CrashFacts {
            node_os: "linux",
            node_arch: "arm64",
            claimed,
            config_of_node_entry: config,
            runs_on,
        };
        let amd = ["amd64".to_owned()];
        let arm = ["arm64".to_owned()];
        let table: Vec<(CrashFacts<'_>, Verdict)> = vec![
            // (a) the index never claimed arm64.
            (
                on_arm(Some(&amd64_only), None, &[]),
                Verdict::NotAmongPlatforms {
                    arch: "arm64".into(),
                },
            ),
            // (b) its arm64 entry's config says amd64.
            (
                on_arm(Some(&both), Some(("linux", "amd64")), &[]),
                Verdict::WrongArchitecture {
                    arch: "arm64".into(),
                    why: Confirmed::MislabelledIndex {
                        config_os: "linux".into(),
                        config_arch: "amd64".into(),
                    },
                },
            ),
            // (c) the same image runs on amd64 nodes.
            (
                on_arm(Some(&both), Some(("linux", "arm64")), &amd),
                Verdict::WrongArchitecture {
                    arch: "arm64".into(),
                    why: Confirmed::RunsElsewhere(vec!["amd64".into()]),
                },
            ),
            // A consistent index, running nowhere else: an entrypoint without a shebang?
            (
                on_arm(Some(&both), Some(("linux", "arm64")), &[]),
                Verdict::Unconfirmed,
            ),
            // Nothing known but nodes of its own architecture.
            (on_arm(None, None, &arm), Verdict::Unconfirmed),
        ];
        for (facts, expected) in table {
            assert_eq!(confirm(&facts, &RUNTIME), expected, "{facts:?}");
        }
    }

    #[test]
    fn the_mark_names_the_verdict_container_image_and_architecture() {
        let wrong = Verdict::NotAmongPlatforms {
            arch: "arm64".into(),
        };
        assert_eq!(
            mark(&wrong, "web", "r/web@sha256:ab", "arm64"),
            "wrong-architecture; container=web; image=r/web@sha256:ab; node-arch=arm64"
        );
        assert!(mark(&Verdict::Unconfirmed, "web", "r/web:1", "arm64")
            .starts_with("exec-format-error; container=web"));
    }

    #[test]
    fn learned_architectures_are_left_out_with_a_warning() {
        let fact = super::super::ImageFact {
            platforms: platforms(&["linux/amd64", "linux/arm64"]),
            artifact: None,
            credentials: super::super::Provenance::Anonymous,
            stale: None,
            digest: Some("sha256:abc".into()),
        };
        let (kept, warning) = leave_out("app:1", &fact, &["arm64".to_owned()]).unwrap();
        assert_eq!(kept.platforms, platforms(&["linux/amd64"]));
        assert!(warning.contains("app:1 (sha256:abc)"), "{warning}");
        assert!(warning.contains("arm64 left out"), "{warning}");
        assert_eq!(leave_out("app:1", &fact, &["s390x".to_owned()]), None);
    }
}
