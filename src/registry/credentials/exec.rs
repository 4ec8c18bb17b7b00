//! Running a credential plugin (a kubelet credential provider, a Docker credential helper): its
//! input on stdin, its answer read from stdout, all by a deadline, after which the plugin — and
//! whatever it started — is killed. Its stderr only ever leaves this module trimmed and scrubbed
//! of anything that looks like a secret.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};

/// The most a plugin may print on stdout (a response is a few KiB).
pub(crate) const MAX_STDOUT: usize = 1 << 20;
/// The most of its stderr read (the rest is drained unread).
const MAX_STDERR: usize = 64 << 10;
/// The most of its stderr shown, after scrubbing.
pub(crate) const SHOWN_STDERR: usize = 120;

/// What a plugin did.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) status: ExitStatus,
    pub(crate) stdout: Vec<u8>,
    /// More than [`MAX_STDOUT`] was printed (and dropped).
    pub(crate) stdout_overflow: bool,
    /// Scrubbed and trimmed: safe to log and to show.
    pub(crate) stderr: String,
}

/// Why a plugin gave no answer. Safe to show.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ExecError {
    #[error("could not be started: {0}")]
    Start(String),
    #[error("did not answer within {}; killed", crate::registry::short_duration(*.0))]
    Timeout(Duration),
}

impl ExecError {
    pub(crate) fn metric_label(&self) -> &'static str {
        match self {
            Self::Start(_) => "not_started",
            Self::Timeout(_) => "timeout",
        }
    }
}

/// Kills the plugin's process group unless disarmed: on a timeout, and when the lookup waiting
/// for it is dropped.
struct GroupKill(Option<rustix::process::Pid>);

impl Drop for GroupKill {
    fn drop(&mut self) {
        if let Some(group) = self.0.take() {
            // Not reaped yet (it is disarmed once waited for), so the group is still the plugin's.
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
    }
}

/// Runs `program args…` with `env` added to tolerable's own environment, writes `input` to its
/// stdin, and waits until `deadline` at most for it to finish. `secrets` are scrubbed from its
/// stderr besides what looks like one.
pub(crate) async fn run(
    program: &Path,
    args: &[String],
    env: &[(String, String)],
    input: &[u8],
    deadline: tokio::time::Instant,
    secrets: &[String],
) -> Result<Finished, ExecError> {
    let started = tokio::time::Instant::now();
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| ExecError::Start(format!("{}: {e}", program.display())))?;
    let mut group = GroupKill(
        child
            .id()
            .and_then(|id| rustix::process::Pid::from_raw(id as i32)),
    );
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let work = async {
        let write = async {
            if let Some(mut stdin) = stdin {
                // A plugin that does not read its input gets EPIPE; its answer still counts.
                let _ = stdin.write_all(input).await;
            }
        };
        let (_, (stdout, stdout_overflow), (stderr, _)) = tokio::join!(
            write,
            read_capped(stdout, MAX_STDOUT),
            read_capped(stderr, MAX_STDERR)
        );
        let status = child.wait().await;
        (status, stdout, stdout_overflow, stderr)
    };
    let Ok((status, stdout, stdout_overflow, stderr)) =
        tokio::time::timeout_at(deadline, work).await
    else {
        return Err(ExecError::Timeout(
            deadline.saturating_duration_since(started),
        ));
    };
    let status = status.map_err(|e| ExecError::Start(format!("{}: {e}", program.display())))?;
    group.0 = None;
    Ok(Finished {
        status,
        stdout,
        stdout_overflow,
        stderr: scrub(&stderr, secrets),
    })
}

/// Up to `cap` bytes of `pipe`, the rest read and dropped (so the plugin never blocks on a full
/// pipe); and whether anything was dropped.
async fn read_capped(pipe: Option<impl AsyncRead + Unpin>, cap: usize) -> (Vec<u8>, bool) {
    let Some(mut pipe) = pipe else {
        return (Vec::new(), false);
    };
    let mut kept = Vec::new();
    let mut overflow = false;
    let mut buffer = vec![0u8; 8192];
    loop {
        match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => return (kept, overflow),
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buffer[..n.min(room)]);
                overflow |= n > room;
            }
        }
    }
}

/// Names whose value is a secret in `name=value` or `"name":"value"`.
const SECRET_NAMES: [&str; 7] = [
    "password",
    "passwd",
    "secret",
    "token",
    "authorization",
    "auth",
    "key",
];
/// Words after which the next word is a secret (`Bearer x`, `token: x`).
const SECRET_BEFORE: [&str; 7] = [
    "password",
    "passwd",
    "secret",
    "token",
    "authorization",
    "bearer",
    "basic",
];

/// A plugin's stderr as it may be shown: one line of printable ASCII, every value after a word
/// such as `password`, `token`, `Bearer` or `Basic`, every long token-like word and every one of
/// `secrets` replaced by `<redacted>`, and only its last [`SHOWN_STDERR`] characters (errors
/// come last).
pub(crate) fn scrub(stderr: &[u8], secrets: &[String]) -> String {
    let mut text: String = String::from_utf8_lossy(stderr)
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { ' ' })
        .collect();
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        text = text.replace(secret.as_str(), "<redacted>");
    }
    let mut words: Vec<String> = Vec::new();
    let mut redact_next = false;
    for word in text.split_whitespace() {
        words.push(if redact_next || looks_like_a_token(word) {
            "<redacted>".to_owned()
        } else {
            word.split_inclusive(',')
                .map(redact_assignment)
                .collect::<String>()
        });
        let bare = word
            .trim_matches(|c: char| !c.is_ascii_alphanumeric())
            .to_ascii_lowercase();
        redact_next = SECRET_BEFORE.contains(&bare.as_str()) && !word.ends_with(['.', ',']);
    }
    let line = words.join(" ");
    match line.char_indices().rev().nth(SHOWN_STDERR - 1) {
        Some((start, _)) if start > 0 => format!("…{}", &line[start..]),
        _ => line,
    }
}

/// `password=x`, `"token":"x"`, `(password=x)`: the value redacted, its closing marks kept.
fn redact_assignment(word: &str) -> String {
    let Some(split) = word.find(['=', ':']) else {
        return word.to_owned();
    };
    let name = word[..split]
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_ascii_lowercase();
    let closing = |c: char| "\"',;)]}".contains(c);
    let value = word[split + 1..].trim_matches(closing);
    if SECRET_NAMES.iter().any(|w| name.ends_with(w)) && !value.is_empty() {
        let kept = &word[word.trim_end_matches(closing).len()..];
        format!("{}<redacted>{kept}", &word[..=split])
    } else {
        word.to_owned()
    }
}

/// A long run of token characters with letters and digits (a JWT, an access key, base64).
fn looks_like_a_token(word: &str) -> bool {
    let core = word.trim_matches(|c: char| "\"'`,;()[]{}<>".contains(c));
    core.len() >= 20
        && core
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+/=_-.~".contains(c))
        && core.chars().any(|c| c.is_ascii_digit())
        && core.chars().any(|c| c.is_ascii_alphabetic())
        && !core.contains("..")
        && !core.contains('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_is_scrubbed_and_trimmed() {
        let secrets = vec!["hunter2".to_owned()];
        for (stderr, hidden) in [
            ("error: password=testpass rejected", "testpass"),
            ("token: abc123 refused", "abc123"),
            (r#"{"username":"u","password":"pw-1"}"#, "pw-1"),
            ("Authorization: Basic dXNlcjpwYXNz\n", "dXNlcjpwYXNz"),
            ("Bearer sometoken refused", "sometoken"),
            (
                "AKIAIOSFODNN7EXAMPLE is not allowed",
                "AKIAIOSFODNN7EXAMPLE",
            ),
            (
                "got eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln back",
                "eyJhbGci",
            ),
            ("the known one: hunter2", "hunter2"),
            ("secret hunter3 leaked", "hunter3"),
        ] {
            let shown = scrub(stderr.as_bytes(), &secrets);
            assert!(!shown.contains(hidden), "{stderr} → {shown}");
            assert!(shown.contains("<redacted>"), "{stderr} → {shown}");
        }
        // What an operator needs stays.
        let shown = scrub(
            b"E0101 12:00:00 main.go:42] error fetching credentials: AccessDeniedException: not authorized to perform ecr:GetAuthorizationToken\n",
            &[],
        );
        assert!(shown.contains("AccessDeniedException"), "{shown}");
        assert!(shown.contains("ecr:GetAuthorizationToken"), "{shown}");
        // One line, the end of it.
        let long = format!("{}\nthe end\x1b[31m", "start ".repeat(100));
        let shown = scrub(long.as_bytes(), &[]);
        assert!(
            shown.starts_with('…') && shown.ends_with("the end [31m"),
            "{shown}"
        );
        assert_eq!(shown.chars().count(), SHOWN_STDERR + 1);
        assert!(!shown.contains('\n') && !shown.contains('\x1b'));
    }

    #[tokio::test]
    async fn a_plugin_is_killed_at_the_deadline_with_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        // The shell starts a grandchild that would hold the pipes open.
        let script = format!("sleep 30 & echo $! > {}; wait", pid_file.display());
        let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
        let result = run(
            Path::new("/bin/sh"),
            &["-c".into(), script],
            &[],
            b"",
            deadline,
            &[],
        )
        .await;
        assert!(matches!(result, Err(ExecError::Timeout(_))), "{result:?}");
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The grandchild is gone (or a zombie of an exited shell) once the group was killed.
        let mut gone = false;
        for _ in 0..100 {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if state.is_empty() || state.split(' ').nth(2) == Some("Z") {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(gone, "sleep {pid} survived");
    }

    #[tokio::test]
    async fn input_output_status_and_environment() {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let finished = run(
            Path::new("/bin/sh"),
            &[
                "-c".into(),
                "cat; printf \" $GREETING\"; echo 'password=x' >&2; exit 3".into(),
            ],
            &[("GREETING".into(), "hello".into())],
            b"from stdin",
            deadline,
            &[],
        )
        .await
        .unwrap();
        assert_eq!(finished.status.code(), Some(3));
        assert_eq!(finished.stdout, b"from stdin hello");
        assert_eq!(finished.stderr, "password=<redacted>");
        let missing = run(
            Path::new("/nonexistent/plugin"),
            &[],
            &[],
            b"",
            deadline,
            &[],
        )
        .await;
        assert!(matches!(missing, Err(ExecError::Start(_))), "{missing:?}");
    }
}
