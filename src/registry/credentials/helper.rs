//! Docker credential helpers: a Docker `config.json`'s `credHelpers` (registry → helper) and
//! `credsStore` (the helper for every other registry). A helper is the program
//! `docker-credential-<name>`; `get` reads a server URL on stdin and prints
//! `{"ServerURL", "Username", "Secret"}`, or fails with "credentials not found in native
//! keychain" when it holds none.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::normalize_registry_key;

/// One helper, found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Helper {
    /// `docker-credential-<name>`: how lookups, logs and metrics name it.
    pub(crate) program_name: String,
    pub(crate) program: PathBuf,
}

/// The helpers of a Docker config, by registry.
#[derive(Clone, Debug, Default)]
pub(crate) struct DockerHelpers {
    /// `credHelpers`, keyed as credentials are (`docker.io`, `host:port`).
    by_registry: BTreeMap<String, Helper>,
    /// `credsStore`.
    store: Option<Helper>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawHelpers {
    #[serde(default)]
    cred_helpers: BTreeMap<String, String>,
    #[serde(default)]
    creds_store: Option<String>,
}

impl DockerHelpers {
    /// The helpers a Docker config names, each found as `docker-credential-<name>` in `dirs`
    /// (in order). `Err` says which helper is missing or misnamed.
    pub(crate) fn from_docker_config(json: &[u8], dirs: &[PathBuf]) -> Result<Self, String> {
        let raw: RawHelpers = serde_json::from_slice(json).map_err(|_| {
            "credHelpers must map registries to helper names, credsStore be a helper name"
                .to_owned()
        })?;
        let mut helpers = Self::default();
        for (registry, name) in raw.cred_helpers {
            let helper =
                find(&name, dirs).map_err(|why| format!("credHelpers {registry:?}: {why}"))?;
            helpers
                .by_registry
                .insert(normalize_registry_key(&registry), helper);
        }
        if let Some(name) = raw.creds_store.filter(|n| !n.is_empty()) {
            helpers.store = Some(find(&name, dirs).map_err(|why| format!("credsStore: {why}"))?);
        }
        Ok(helpers)
    }

    /// Whether `registry` has a helper of its own (then the config's `auths` entry for it is
    /// not used, as Docker does).
    pub(crate) fn has_own(&self, registry: &str) -> bool {
        self.by_registry
            .contains_key(&normalize_registry_key(registry))
    }

    /// The helper to ask for `registry`: its own, else the store.
    pub(crate) fn for_registry(&self, registry: &str) -> Option<&Helper> {
        self.by_registry
            .get(&normalize_registry_key(registry))
            .or(self.store.as_ref())
    }

    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.by_registry
            .values()
            .chain(&self.store)
            .map(|h| h.program_name.as_str())
    }
}

/// `docker-credential-<name>` in the first of `dirs` that has it.
fn find(name: &str, dirs: &[PathBuf]) -> Result<Helper, String> {
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return Err(format!("{name:?} is not a helper name"));
    }
    let program_name = format!("docker-credential-{name}");
    let program = dirs
        .iter()
        .map(|dir| dir.join(&program_name))
        .find(|path| is_executable(path))
        .ok_or_else(|| {
            format!(
                "{program_name} not found in {}",
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(":")
            )
        })?;
    Ok(Helper {
        program_name,
        program,
    })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The server URL a helper is asked for `registry`, as Docker asks it: Docker Hub by its
/// index URL, other registries by `host[:port]`.
pub(crate) fn server_url(registry: &str) -> String {
    if registry == "docker.io" {
        "https://index.docker.io/v1/".to_owned()
    } else {
        registry.to_owned()
    }
}

/// What a credential helper's `get` prints: `{"Username": …, "Secret": …}`.
#[derive(Deserialize)]
struct HelperCredentials {
    #[serde(rename = "Username", default)]
    username: String,
    #[serde(rename = "Secret", default)]
    secret: String,
}

/// What a helper's `get` printed: `Ok(Some((user, secret)))`, `Ok(None)` when it holds nothing
/// for the server. Errors never quote the answer.
pub(crate) fn parse_answer(stdout: &[u8]) -> Result<Option<(String, String)>, String> {
    let answer: HelperCredentials = serde_json::from_slice(stdout).map_err(|e| {
        format!(
            "printed no {{\"Username\", \"Secret\"}} object (line {}, column {})",
            e.line(),
            e.column()
        )
    })?;
    if answer.username == "<token>" {
        return Err("answered an identity token, which tolerable cannot exchange".into());
    }
    if answer.username.is_empty() && answer.secret.is_empty() {
        return Ok(None);
    }
    Ok(Some((answer.username, answer.secret)))
}

/// Whether a failed `get` only said it holds no credential for the server.
pub(crate) fn says_not_found(output: &[u8]) -> bool {
    String::from_utf8_lossy(output).contains("credentials not found")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_by_registry_then_the_store() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        for name in ["docker-credential-ecr-login", "docker-credential-pass"] {
            let path = dir.path().join(name);
            std::fs::write(&path, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let dirs = [PathBuf::from("/nonexistent"), dir.path().to_owned()];
        let json = br#"{"auths": {}, "credHelpers": {"123456789012.dkr.ecr.eu-west-1.amazonaws.com": "ecr-login", "https://index.docker.io/v1/": "pass"}, "credsStore": "pass"}"#;
        let helpers = DockerHelpers::from_docker_config(json, &dirs).unwrap();
        let ecr = helpers
            .for_registry("123456789012.dkr.ecr.eu-west-1.amazonaws.com")
            .unwrap();
        assert_eq!(ecr.program_name, "docker-credential-ecr-login");
        assert_eq!(ecr.program, dir.path().join("docker-credential-ecr-login"));
        assert!(helpers.has_own("docker.io"));
        assert_eq!(
            helpers.for_registry("ghcr.io").unwrap().program_name,
            "docker-credential-pass"
        );
        assert!(!helpers.has_own("ghcr.io"));

        let none = DockerHelpers::from_docker_config(br#"{"auths": {}}"#, &dirs).unwrap();
        assert!(none.for_registry("ghcr.io").is_none());

        for (json, expected) in [
            (
                &br#"{"credsStore": "desktop"}"#[..],
                "credsStore: docker-credential-desktop not found in /nonexistent:",
            ),
            (
                br#"{"credHelpers": {"gcr.io": "../x"}}"#,
                "credHelpers \"gcr.io\": \"../x\" is not a helper name",
            ),
            (
                br#"{"credHelpers": ["gcr"]}"#,
                "credHelpers must map registries",
            ),
        ] {
            let err = DockerHelpers::from_docker_config(json, &dirs).unwrap_err();
            assert!(err.contains(expected), "{err}");
        }
    }

    #[test]
    fn answers() {
        assert_eq!(server_url("docker.io"), "https://index.docker.io/v1/");
        assert_eq!(server_url("localhost:5000"), "localhost:5000");
        assert_eq!(
            parse_answer(br#"{"ServerURL":"x","Username":"AWS","Secret":"tok"}"#).unwrap(),
            Some(("AWS".into(), "tok".into()))
        );
        let token = parse_answer(br#"{"Username":"<token>","Secret":"refresh-me"}"#).unwrap_err();
        assert!(!token.contains("refresh-me"), "{token}");
        let bad = parse_answer(br#"{"Username": "u", "Secret": hunter2}"#).unwrap_err();
        assert!(!bad.contains("hunter2"), "{bad}");
        assert!(says_not_found(
            b"credentials not found in native keychain\n"
        ));
    }
}
