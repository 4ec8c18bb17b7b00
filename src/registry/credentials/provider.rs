//! Kubelet image credential provider plugins: the kubelet's own `CredentialProviderConfig` file
//! (`kubelet.config.k8s.io/v1` or `v1beta1`, YAML or JSON), read as the kubelet reads it, so an
//! operator points tolerable at the file their nodes use, unchanged.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::image_match::ImagePattern;

/// The `apiVersion`s of the config file tolerable reads.
const CONFIG_VERSIONS: [&str; 2] = ["kubelet.config.k8s.io/v1", "kubelet.config.k8s.io/v1beta1"];
/// The plugin protocol's `apiVersion`s tolerable speaks.
pub(crate) const PLUGIN_VERSIONS: [&str; 2] = [
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
];

/// One plugin, ready to run: what it is asked for, how, and how long its answers are kept by
/// default.
#[derive(Clone)]
pub(crate) struct Provider {
    pub(crate) name: String,
    pub(crate) match_images: Vec<ImagePattern>,
    pub(crate) default_cache_duration: Duration,
    /// The protocol version it is asked in (one of [`PLUGIN_VERSIONS`]), and must answer in.
    pub(crate) api_version: &'static str,
    /// `credential_provider_bin_dir`/`name`.
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<String>,
    /// Added to tolerable's own environment, as the kubelet adds them to its own.
    pub(crate) env: Vec<(String, String)>,
}

impl fmt::Debug for Provider {
    /// The environment's names only: an operator may pass a value that is secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Provider")
            .field("name", &self.name)
            .field("match_images", &self.match_images)
            .field("default_cache_duration", &self.default_cache_duration)
            .field("api_version", &self.api_version)
            .field("program", &self.program)
            .field("args", &self.args)
            .field(
                "env",
                &self.env.iter().map(|(name, _)| name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Provider {
    /// Whether the kubelet would run this plugin for `image` (`registry/repository`).
    pub(crate) fn matches(&self, image: &str) -> bool {
        self.match_images.iter().any(|p| p.matches(image))
    }
}

/// The kubelet's CredentialProviderConfig file as written.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CredentialProviderConfigFile {
    api_version: String,
    kind: String,
    providers: Vec<RawProvider>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawProvider {
    name: String,
    #[serde(default)]
    match_images: Vec<String>,
    default_cache_duration: Option<String>,
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<RawEnv>,
    /// Kubernetes 1.33+: the plugin wants the Pod's service account token, which tolerable
    /// does not have.
    #[serde(default)]
    token_attributes: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEnv {
    name: String,
    value: String,
}

/// The providers of the config file at `path`, each with its executable in `bin_dir`, and a
/// warning for each provider skipped. `Err` says what is wrong (the caller names the key).
pub(crate) fn load(path: &Path, bin_dir: &Path) -> Result<(Vec<Provider>, Vec<String>), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&text, bin_dir).map_err(|why| format!("{}: {why}", path.display()))
}

/// [`load`] of the file's text.
pub(crate) fn parse(text: &str, bin_dir: &Path) -> Result<(Vec<Provider>, Vec<String>), String> {
    // YAML reads JSON too, as the kubelet's decoder does.
    let raw: CredentialProviderConfigFile =
        serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    if !CONFIG_VERSIONS.contains(&raw.api_version.as_str()) {
        return Err(format!(
            "apiVersion {:?} is not {}",
            raw.api_version,
            CONFIG_VERSIONS.join(" or ")
        ));
    }
    if raw.kind != "CredentialProviderConfig" {
        return Err(format!(
            "kind {:?} is not CredentialProviderConfig",
            raw.kind
        ));
    }
    let mut names = HashSet::new();
    let mut providers = Vec::new();
    let mut warnings = Vec::new();
    for raw in raw.providers {
        let name = raw.name.clone();
        if !names.insert(name.clone()) {
            return Err(format!("provider {name:?} is listed twice"));
        }
        if raw.token_attributes.is_some() {
            warnings.push(format!(
                "credential provider {name} wants the Pod's service account token \
                 (tokenAttributes), which tolerable does not have: skipped"
            ));
            continue;
        }
        providers.push(provider(raw, bin_dir).map_err(|why| format!("provider {name:?}: {why}"))?);
    }
    Ok((providers, warnings))
}

/// One provider, checked as the kubelet checks it, with its executable found.
fn provider(raw: RawProvider, bin_dir: &Path) -> Result<Provider, String> {
    let name = raw.name;
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err("name must be an executable's file name".into());
    }
    if raw.match_images.is_empty() {
        return Err("matchImages must list at least one image pattern".into());
    }
    let match_images = raw
        .match_images
        .iter()
        .enumerate()
        .map(|(i, p)| ImagePattern::parse(p).map_err(|why| format!("matchImages[{i}]: {why}")))
        .collect::<Result<Vec<_>, _>>()?;
    let default_cache_duration = match &raw.default_cache_duration {
        Some(text) => {
            crate::duration::parse_go(text).map_err(|why| format!("defaultCacheDuration: {why}"))?
        }
        None => return Err("defaultCacheDuration is required".into()),
    };
    let api_version = PLUGIN_VERSIONS
        .iter()
        .find(|v| **v == raw.api_version)
        .ok_or_else(|| {
            format!(
                "apiVersion {:?} is not {}",
                raw.api_version,
                PLUGIN_VERSIONS.join(" or ")
            )
        })?;
    let program = bin_dir.join(&name);
    if !is_executable(&program) {
        return Err(format!(
            "no executable {} (credential_provider_bin_dir)",
            program.display()
        ));
    }
    Ok(Provider {
        name,
        match_images,
        default_cache_duration,
        api_version,
        program,
        args: raw.args,
        env: raw.env.into_iter().map(|e| (e.name, e.value)).collect(),
    })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bin_dir(names: &[&str]) -> tempfile::TempDir {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        for name in names {
            let path = dir.path().join(name);
            std::fs::write(&path, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        dir
    }

    /// EKS's node file (AL2023), unchanged but for the args.
    const EKS: &str = r#"{
  "apiVersion": "kubelet.config.k8s.io/v1",
  "kind": "CredentialProviderConfig",
  "providers": [
    {
      "name": "ecr-credential-provider",
      "matchImages": [
        "*.dkr.ecr.*.amazonaws.com",
        "*.dkr-ecr.*.on.aws",
        "*.dkr.ecr.*.amazonaws.com.cn"
      ],
      "defaultCacheDuration": "12h",
      "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
      "args": ["get-credentials"],
      "env": [{"name": "AWS_REGION", "value": "eu-west-1"}]
    }
  ]
}"#;

    /// GKE's, in YAML, v1beta1 of the file.
    const GKE: &str = r#"
apiVersion: kubelet.config.k8s.io/v1beta1
kind: CredentialProviderConfig
providers:
  - name: auth-provider-gcp
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    matchImages:
      - "container.cloud.google.com"
      - "gcr.io"
      - "*.gcr.io"
      - "*.pkg.dev"
    args:
      - get-credentials
      - --v=3
    defaultCacheDuration: 1m
"#;

    #[test]
    fn reads_the_clouds_node_files() {
        let dir = bin_dir(&["ecr-credential-provider", "auth-provider-gcp"]);
        let (eks, warnings) = parse(EKS, dir.path()).unwrap();
        assert!(warnings.is_empty());
        let ecr = &eks[0];
        assert_eq!(ecr.name, "ecr-credential-provider");
        assert_eq!(ecr.default_cache_duration, Duration::from_secs(12 * 3600));
        assert_eq!(ecr.api_version, "credentialprovider.kubelet.k8s.io/v1");
        assert_eq!(ecr.args, ["get-credentials"]);
        assert_eq!(ecr.env, [("AWS_REGION".into(), "eu-west-1".into())]);
        assert_eq!(ecr.program, dir.path().join("ecr-credential-provider"));
        assert!(ecr.matches("123456789012.dkr.ecr.eu-west-1.amazonaws.com/app"));
        assert!(!ecr.matches("public.ecr.aws/app"));
        assert!(!format!("{ecr:?}").contains("eu-west-1\""), "{ecr:?}");

        let (gke, _) = parse(GKE, dir.path()).unwrap();
        assert_eq!(gke[0].default_cache_duration, Duration::from_secs(60));
        assert!(gke[0].matches("europe-docker.pkg.dev/p/r/app"));
        assert!(gke[0].matches("gcr.io/p/app"));
    }

    #[test]
    fn errors_name_the_provider_and_the_field() {
        let dir = bin_dir(&["ecr-credential-provider"]);
        let error = |text: &str| parse(text, dir.path()).unwrap_err();
        let cases = [
            (EKS.replace("kubelet.config.k8s.io/v1\"", "kubelet.config.k8s.io/v2\""), "apiVersion \"kubelet.config.k8s.io/v2\" is not kubelet.config.k8s.io/v1 or kubelet.config.k8s.io/v1beta1"),
            (EKS.replace("\"12h\"", "\"12 hours\""), "provider \"ecr-credential-provider\": defaultCacheDuration: \"12 hours\" is not a duration"),
            (EKS.replace("\"defaultCacheDuration\": \"12h\",", ""), "defaultCacheDuration is required"),
            (EKS.replace("credentialprovider.kubelet.k8s.io/v1\"", "credentialprovider.kubelet.k8s.io/v1alpha1\""), "provider \"ecr-credential-provider\": apiVersion \"credentialprovider.kubelet.k8s.io/v1alpha1\" is not"),
            (EKS.replace("\"*.dkr-ecr.*.on.aws\"", "\"*.dkr-ecr.[.on.aws\""), "provider \"ecr-credential-provider\": matchImages[1]: \"*.dkr-ecr.[.on.aws\": a glob has an unclosed ["),
            (EKS.replace("\"args\"", "\"argz\""), "unknown field `argz`"),
            (EKS.replace("ecr-credential-provider", "ecr/../../bin/sh"), "name must be an executable's file name"),
            (EKS.replace("ecr-credential-provider", "not-installed"), "provider \"not-installed\": no executable"),
            (EKS.replace("\"kind\": \"CredentialProviderConfig\"", "\"kind\": \"KubeletConfiguration\""), "kind \"KubeletConfiguration\""),
        ];
        for (text, expected) in cases {
            let got = error(&text);
            assert!(got.contains(expected), "{got}\nexpected {expected}");
        }
        let twice = EKS.replace(
            "  ]\n}",
            "  , {\"name\": \"ecr-credential-provider\", \"matchImages\": [\"x.io\"], \"defaultCacheDuration\": \"1m\", \"apiVersion\": \"credentialprovider.kubelet.k8s.io/v1\"}]\n}",
        );
        assert!(error(&twice).contains("listed twice"), "{}", error(&twice));
    }

    #[test]
    fn providers_that_need_a_pods_token_are_skipped_with_a_warning() {
        let dir = bin_dir(&["auth-provider-gcp"]);
        let text = format!("{GKE}    tokenAttributes:\n      serviceAccountTokenAudience: x\n      requireServiceAccount: true\n");
        let (providers, warnings) = parse(&text, dir.path()).unwrap();
        assert!(providers.is_empty());
        assert!(warnings[0].contains("auth-provider-gcp"), "{warnings:?}");
    }
}
