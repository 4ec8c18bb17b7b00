//! Registry credentials: tolerable's per-registry files (`<dir>/<registry>.toml` with `user` and
//! `secret`) and Docker `config.json` / `.dockerconfigjson` / `.dockercfg` documents.
//!
//! A credential's secret never leaves this module in readable form: `Debug` redacts it, and every
//! error names the file or entry, never its content.

use std::collections::BTreeMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

use super::reference::canonical_registry;

mod exec;
pub(crate) mod helper;
pub(crate) mod image_match;
pub(crate) mod plugins;
pub(crate) mod provider;

/// A user name and secret (password or token) for one registry, and where it came from.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Credential {
    user: String,
    secret: String,
    source: std::sync::Arc<str>,
}

impl Credential {
    pub fn new(
        user: impl Into<String>,
        secret: impl Into<String>,
        source: impl Into<String>,
    ) -> Self {
        Self {
            user: user.into(),
            secret: secret.into(),
            source: std::sync::Arc::from(source.into()),
        }
    }

    /// [`Credential::source`], shared rather than copied.
    pub(crate) fn shared_source(&self) -> std::sync::Arc<str> {
        self.source.clone()
    }

    pub(crate) fn user(&self) -> &str {
        &self.user
    }

    pub(crate) fn secret(&self) -> &str {
        &self.secret
    }

    /// Where the credential came from, safe to log: a file path or `secret ns/name`.
    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    /// A process-local fingerprint of the user and secret, for cache keys: two lookups that
    /// present different credentials must not share an answer.
    pub(crate) fn fingerprint(&self, state: &impl std::hash::BuildHasher) -> u64 {
        let mut h = state.build_hasher();
        self.user.hash(&mut h);
        self.secret.hash(&mut h);
        h.finish()
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("source", &self.source)
            .field("user", &"<redacted>")
            .field("secret", &"<redacted>")
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("cannot read registry credentials {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Deliberately without the parser's message: it may quote the secret.
    #[error("registry credential file {path} is not TOML with string keys `user` and `secret` (line {line})")]
    BadFile { path: PathBuf, line: usize },
    #[error("registry credential file {path}: `user` and `secret` must not be empty")]
    Empty { path: PathBuf },
    #[error("docker config {source_name} is not a JSON object of registry auths")]
    BadDockerConfig { source_name: String },
}

/// Registry name as credentials are keyed: `https://index.docker.io/v1/` and
/// `registry-1.docker.io` are Docker Hub; scheme and path are dropped.
pub(crate) fn normalize_registry_key(key: &str) -> String {
    let key = key
        .trim()
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let host = key.split('/').next().unwrap_or(key).to_ascii_lowercase();
    canonical_registry(&host).to_owned()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CredentialFile {
    user: String,
    secret: String,
}

/// Credentials configured for the process, by registry.
#[derive(Default, Clone)]
pub struct CredentialStore {
    by_registry: BTreeMap<String, Vec<Credential>>,
}

impl fmt::Debug for CredentialStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.by_registry.iter().map(|(r, c)| (r, c.len())))
            .finish()
    }
}

impl CredentialStore {
    /// Loads every `*.toml` in `dir`. A file name is the registry (`ghcr.io.toml`,
    /// `docker.io.toml`); `host_5000.toml` stands for `host:5000`, because Kubernetes Secret keys
    /// cannot contain `:`.
    pub fn load_dir(dir: &Path) -> Result<Self, CredentialError> {
        let read_err = |source| CredentialError::Read {
            path: dir.to_owned(),
            source,
        };
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(read_err)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
            .collect();
        paths.sort();
        let mut store = Self::default();
        for path in paths {
            let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            let registry = normalize_registry_key(&file_stem_to_registry(stem));
            let credential = read_credential_file(&path)?;
            store.add(&registry, credential);
        }
        Ok(store)
    }

    pub fn add(&mut self, registry: &str, credential: Credential) {
        self.by_registry
            .entry(normalize_registry_key(registry))
            .or_default()
            .push(credential);
    }

    /// No credential for any registry (a Pod without pull secrets).
    pub(crate) fn is_empty(&self) -> bool {
        self.by_registry.is_empty()
    }

    /// The credentials to try for `registry`, in order.
    pub(crate) fn for_registry(&self, registry: &str) -> &[Credential] {
        if self.by_registry.is_empty() {
            return &[];
        }
        self.by_registry
            .get(&normalize_registry_key(registry))
            .map_or(&[], Vec::as_slice)
    }

    pub(crate) fn registries(&self) -> impl Iterator<Item = &str> {
        self.by_registry.keys().map(String::as_str)
    }
}

fn file_stem_to_registry(stem: &str) -> String {
    match stem.rsplit_once('_') {
        Some((host, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            format!("{host}:{port}")
        }
        _ => stem.to_owned(),
    }
}

fn read_credential_file(path: &Path) -> Result<Credential, CredentialError> {
    let text = std::fs::read_to_string(path).map_err(|source| CredentialError::Read {
        path: path.to_owned(),
        source,
    })?;
    let file: CredentialFile = toml::from_str(&text).map_err(|e| CredentialError::BadFile {
        path: path.to_owned(),
        line: e.span().map_or(0, |s| {
            text[..s.start.min(text.len())].lines().count().max(1)
        }),
    })?;
    if file.user.is_empty() || file.secret.is_empty() {
        return Err(CredentialError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(Credential::new(
        file.user,
        file.secret,
        path.display().to_string(),
    ))
}

#[derive(Deserialize)]
struct DockerAuthEntry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

/// Top-level keys of a Docker `config.json` besides `auths`: a document with one of them is not
/// a legacy `.dockercfg` (a map of registries).
const CONFIG_JSON_KEYS: [&str; 8] = [
    "credsStore",
    "credHelpers",
    "HttpHeaders",
    "psFormat",
    "imagesFormat",
    "detachKeys",
    "proxies",
    "currentContext",
];

/// Credentials by registry, and a warning for each entry that could not be used.
pub(crate) type DockerConfigEntries = (Vec<(String, Credential)>, Vec<String>);

/// Parses a `.dockerconfigjson` (`{"auths": {...}}`) or legacy `.dockercfg` (the auths map
/// itself). Entries that cannot be used become warnings naming the registry, not errors: one bad
/// entry must not hide the good ones.
pub(crate) fn parse_docker_config(
    json: &[u8],
    source_name: &str,
) -> Result<DockerConfigEntries, CredentialError> {
    let bad = || CredentialError::BadDockerConfig {
        source_name: source_name.to_owned(),
    };
    let doc: serde_json::Value = serde_json::from_slice(json).map_err(|_| bad())?;
    let no_auths = serde_json::Value::Object(serde_json::Map::new());
    let auths = match doc.get("auths") {
        Some(auths) => auths,
        // A config.json without `auths` (only helpers, say), not a legacy `.dockercfg`.
        None if CONFIG_JSON_KEYS.iter().any(|key| doc.get(key).is_some()) => &no_auths,
        None => &doc,
    };
    let auths = auths.as_object().ok_or_else(bad)?;
    let mut entries = Vec::new();
    let mut warnings = Vec::new();
    for (registry, value) in auths {
        let registry = normalize_registry_key(registry);
        let source = format!("{source_name} ({registry})");
        let Ok(entry) = serde_json::from_value::<DockerAuthEntry>(value.clone()) else {
            warnings.push(format!(
                "{source}: entry is not an object of strings; ignored"
            ));
            continue;
        };
        if entry.username.is_none() && entry.password.is_none() && entry.auth.is_none() {
            // `{}`: Docker's placeholder for a registry whose credentials a helper holds.
            continue;
        }
        let pair = match (entry.username, entry.password, entry.auth) {
            (Some(u), Some(p), _) if !u.is_empty() && !p.is_empty() => Some((u, p)),
            (_, _, Some(auth)) => base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .ok()
                .and_then(|raw| String::from_utf8(raw).ok())
                .and_then(|s| s.split_once(':').map(|(u, p)| (u.to_owned(), p.to_owned())))
                .filter(|(u, p)| !u.is_empty() && !p.is_empty()),
            _ => None,
        };
        match pair {
            Some((user, secret)) => entries.push((registry, Credential::new(user, secret, source))),
            None => warnings.push(format!(
                "{source}: no usable username and password (auth must be base64 of user:password); ignored"
            )),
        }
    }
    Ok((entries, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_keys_normalize() {
        for (key, want) in [
            ("https://index.docker.io/v1/", "docker.io"),
            ("registry-1.docker.io", "docker.io"),
            ("docker.io", "docker.io"),
            ("GHCR.io", "ghcr.io"),
            ("http://127.0.0.1:5000/v2/", "127.0.0.1:5000"),
        ] {
            assert_eq!(normalize_registry_key(key), want, "{key}");
        }
        assert_eq!(file_stem_to_registry("localhost_5000"), "localhost:5000");
        assert_eq!(file_stem_to_registry("my_registry.io"), "my_registry.io");
    }

    #[test]
    fn credentials_are_keyed_as_images_name_their_registry() {
        for host in [
            "docker.io",
            "index.docker.io",
            "registry-1.docker.io",
            "ghcr.io",
        ] {
            let image = super::super::ImageReference::parse(&format!("{host}/o/app")).unwrap();
            assert_eq!(normalize_registry_key(host), image.registry(), "{host}");
        }
    }

    #[test]
    fn loads_files_and_never_shows_the_secret() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("docker.io.toml"),
            "user = \"hub\"\nsecret = \"hunter2\"\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("127.0.0.1_5000.toml"),
            "user = \"u\"\nsecret = \"s3cr3t\"\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("README.md"), "ignored").unwrap();
        let store = CredentialStore::load_dir(dir.path()).unwrap();
        assert_eq!(store.for_registry("docker.io")[0].user(), "hub");
        assert_eq!(store.for_registry("index.docker.io")[0].secret(), "hunter2");
        assert_eq!(store.for_registry("127.0.0.1:5000")[0].user(), "u");
        assert!(store.for_registry("ghcr.io").is_empty());
        let shown = format!("{store:?} {:?}", store.for_registry("docker.io"));
        assert!(
            !shown.contains("hunter2") && !shown.contains("hub\""),
            "{shown}"
        );
    }

    #[test]
    fn bad_file_names_the_file_not_the_secret() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ghcr.io.toml");
        std::fs::write(&path, "user = \"u\"\nsecret = 12345678\n").unwrap();
        let err = CredentialStore::load_dir(dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ghcr.io.toml") && err.contains("line 2"),
            "{err}"
        );
        assert!(!err.contains("12345678"), "{err}");

        std::fs::write(&path, "user = \"u\"\nsecret = \"\"\n").unwrap();
        let err = CredentialStore::load_dir(dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("must not be empty"), "{err}");

        let err = CredentialStore::load_dir(&dir.path().join("missing")).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
    }

    #[test]
    fn docker_config_formats() {
        let auth = base64::engine::general_purpose::STANDARD.encode("alice:pa:ss");
        let json = format!(
            r#"{{"auths":{{
                "https://index.docker.io/v1/":{{"auth":"{auth}"}},
                "ghcr.io":{{"username":"bob","password":"tok"}},
                "broken.io":{{"auth":"%%%not-base64"}},
                "weird.io": 7,
                "in-a-helper.io": {{}}
            }}}}"#
        );
        let (entries, warnings) = parse_docker_config(json.as_bytes(), "secret ns/pull").unwrap();
        let got: Vec<_> = entries
            .iter()
            .map(|(r, c)| (r.as_str(), c.user(), c.secret(), c.source()))
            .collect();
        assert_eq!(
            got,
            [
                ("ghcr.io", "bob", "tok", "secret ns/pull (ghcr.io)"),
                ("docker.io", "alice", "pa:ss", "secret ns/pull (docker.io)"),
            ]
        );
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings.iter().any(|w| w.contains("broken.io")));
        assert!(!warnings.concat().contains("not-base64"));

        // Legacy .dockercfg: the map itself.
        let legacy = format!(r#"{{"quay.io":{{"auth":"{auth}"}}}}"#);
        let (entries, _) = parse_docker_config(legacy.as_bytes(), "cfg").unwrap();
        assert_eq!(entries[0].0, "quay.io");

        // A config.json with helpers only has no auths (its keys are no registries).
        let (entries, warnings) =
            parse_docker_config(br#"{"credsStore": "pass", "credHelpers": {}}"#, "c").unwrap();
        assert!(entries.is_empty() && warnings.is_empty(), "{warnings:?}");

        assert!(parse_docker_config(b"[1]", "x").is_err());
        assert!(parse_docker_config(b"{nope", "x").is_err());
    }
}
