//! A rendered Deployment's mounted files made local, so that its config loads the way the
//! container loads it: shared by the kustomize tests (`tests/project/deploy.rs`) and the chart's
//! (`tests/project/helm.rs`). Paths of mounted volumes only exist in the Pod: each is checked to lie in
//! a mount, then swapped for a local stand-in in a temporary directory.

use std::path::Path;

use serde_json::Value;
use tolerable::config::Config;

/// A config loaded the way the container loads it, with the temporary directory of local
/// stand-ins its paths name: the directory lives as long as the config and is removed with it
/// (no test leaves files behind).
pub struct LoadedConfig {
    config: Config,
    _files: tempfile::TempDir,
}

impl LoadedConfig {
    pub fn new(config: Config, files: tempfile::TempDir) -> Self {
        Self {
            config,
            _files: files,
        }
    }
}

impl std::ops::Deref for LoadedConfig {
    type Target = Config;

    fn deref(&self) -> &Config {
        &self.config
    }
}

impl std::fmt::Debug for LoadedConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.config.fmt(f)
    }
}

/// The object of `kind` named exactly `name` in rendered `docs`.
pub fn object<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// The volume of `pod` (a Pod spec) that `path` lies in, and where its first container mounts it.
pub fn volume_of<'a>(pod: &'a Value, path: &str) -> Option<(&'a Value, String)> {
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()?
        .iter()
        .find(|m| path.starts_with(m["mountPath"].as_str().unwrap()))?;
    let volume = pod["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == mount["name"])?;
    Some((volume, mount["mountPath"].as_str().unwrap().to_owned()))
}

/// The serving certificate and key and the credential files directory, as local (empty)
/// stand-ins in `dir`, named by their variables in `env`.
pub fn local_tls_and_credential_files(dir: &Path, env: &mut Vec<(String, String)>) {
    std::fs::create_dir_all(dir.join("creds")).unwrap();
    for (var, name) in [
        ("TOLERABLE_TLS__CERT_PATH", "tls.crt"),
        ("TOLERABLE_TLS__KEY_PATH", "tls.key"),
        ("TOLERABLE_CREDENTIALS__FILES_PATH", "creds"),
    ] {
        let local = dir.join(name);
        if !local.exists() {
            std::fs::write(&local, "").unwrap();
        }
        env.push((var.into(), local.display().to_string()));
    }
}

/// The credential provider config and plugin directory `env` names, made local in `dir`: the
/// config from the ConfigMap it is mounted from (or, from a node's file, an empty one), each
/// plugin it names a stand-in executable. The config must lie in a volume `pod` mounts.
pub fn local_credential_providers(
    docs: &[Value],
    pod: &Value,
    dir: &Path,
    env: &mut [(String, String)],
) {
    use std::os::unix::fs::PermissionsExt as _;
    let Some(i) = env
        .iter()
        .position(|(k, _)| k == "TOLERABLE_CREDENTIALS__PROVIDER_CONFIG")
    else {
        return;
    };
    let path = env[i].1.clone();
    let (volume, mount) = volume_of(pod, &path).expect("the provider config is mounted");
    let text = match volume["configMap"]["name"].as_str() {
        Some(name) => {
            let key = path.strip_prefix(&format!("{mount}/")).unwrap();
            object(docs, "ConfigMap", name)["data"][key]
                .as_str()
                .unwrap_or_else(|| panic!("ConfigMap {name} has no {key}"))
                .to_owned()
        }
        None => {
            assert_eq!(volume["hostPath"]["type"], "File", "{volume}");
            "{\"apiVersion\": \"kubelet.config.k8s.io/v1\", \"kind\": \"CredentialProviderConfig\", \"providers\": []}".to_owned()
        }
    };
    let config: Value = serde_yaml_ng::from_str(&text).unwrap();
    let local = dir.join("credential-providers.yaml");
    std::fs::write(&local, &text).unwrap();
    env[i].1 = local.display().to_string();
    let bin = dir.join("credential-provider-bin");
    std::fs::create_dir_all(&bin).unwrap();
    for provider in config["providers"].as_array().unwrap() {
        let plugin = bin.join(provider["name"].as_str().unwrap());
        std::fs::write(&plugin, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for (name, value) in env.iter_mut() {
        if name == "TOLERABLE_CREDENTIALS__PROVIDER_BIN_DIR" {
            *value = bin.display().to_string();
        }
    }
}

/// `value` with each `$(NAME)` of a variable listed before (`earlier`) replaced by its value, as
/// the kubelet expands a container's environment; a reference to anything else is kept.
pub fn expand_env_references(value: &str, earlier: &[(String, String)]) -> String {
    let mut out = value.to_owned();
    for (name, known) in earlier {
        out = out.replace(&format!("$({name})"), known);
    }
    out
}

/// A variable the kubelet sets from the downward API, as it would in the Deployment's Pod:
/// `metadata.namespace` is the Deployment's namespace. `None` for a variable of another kind.
pub fn downward_value(var: &Value, deployment: &Value) -> Option<String> {
    let path = var["valueFrom"]["fieldRef"]["fieldPath"].as_str()?;
    assert_eq!(path, "metadata.namespace", "{var}");
    let namespace = deployment["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default");
    Some(namespace.to_owned())
}
