//! Credential plugins for the tests, speaking the real protocols: the kubelet credential provider
//! in `tests/data/credential-plugins/credential-provider` (Python), installed under each
//! provider's name in a bin directory beside the kubelet's CredentialProviderConfig naming them,
//! and the Docker credential helper `docker-credential-helper`, installed as
//! `docker-credential-<name>` in the same directory (tolerable looks for helpers there first)
//! beside a Docker config naming it. Each plugin's runs are appended to a file of its own, so the
//! tests count them.

use std::path::{Path, PathBuf};

use serde_json::json;

/// The tests' credential provider plugin.
pub fn provider_plugin() -> PathBuf {
    super::tools::root().join("tests/data/credential-plugins/credential-provider")
}

/// One provider of the config file.
pub struct Provider {
    pub name: String,
    pub match_images: Vec<String>,
    pub default_cache_duration: String,
    pub args: Vec<String>,
    /// The plugin's settings (`PLUGIN_*`, see the plugin's text).
    pub env: Vec<(String, String)>,
}

impl Provider {
    /// A provider named `name` for `match_images`, its answers kept an hour by default.
    pub fn new(name: &str, match_images: &[&str]) -> Self {
        Self {
            name: name.to_owned(),
            match_images: match_images.iter().map(|m| (*m).to_owned()).collect(),
            default_cache_duration: "1h".to_owned(),
            args: Vec::new(),
            env: Vec::new(),
        }
    }

    /// Answers with `user` and `password`.
    pub fn answering(self, user: &str, password: &str) -> Self {
        self.env("PLUGIN_USER", user)
            .env("PLUGIN_PASSWORD", password)
    }

    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn default_cache_duration(mut self, duration: &str) -> Self {
        self.default_cache_duration = duration.to_owned();
        self
    }

    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_owned());
        self
    }
}

/// The tests' Docker credential helper.
pub fn helper_plugin() -> PathBuf {
    super::tools::root().join("tests/data/credential-plugins/docker-credential-helper")
}

/// A CredentialProviderConfig, a Docker config and their bin directory, in a directory of their
/// own.
pub struct Providers {
    pub dir: tempfile::TempDir,
    docker_config: bool,
}

impl Providers {
    pub fn new(providers: Vec<Provider>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("bin")).unwrap();
        let mut entries = Vec::new();
        for provider in providers {
            std::os::unix::fs::symlink(
                provider_plugin(),
                dir.path().join("bin").join(&provider.name),
            )
            .unwrap();
            let runs = dir.path().join(format!("{}.runs", provider.name));
            std::fs::write(&runs, "").unwrap();
            let mut env: Vec<_> = provider
                .env
                .iter()
                .map(|(name, value)| json!({"name": name, "value": value}))
                .collect();
            env.push(json!({"name": "PLUGIN_RUNS", "value": runs.display().to_string()}));
            entries.push(json!({
                "name": provider.name,
                "matchImages": provider.match_images,
                "defaultCacheDuration": provider.default_cache_duration,
                "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
                "args": provider.args,
                "env": env,
            }));
        }
        let config = json!({
            "apiVersion": "kubelet.config.k8s.io/v1",
            "kind": "CredentialProviderConfig",
            "providers": entries,
        });
        std::fs::write(
            dir.path().join("config.json"),
            serde_json::to_string_pretty(&config).unwrap(),
        )
        .unwrap();
        Self {
            dir,
            docker_config: false,
        }
    }

    /// Installs the tests' helper as `docker-credential-<name>` with `settings` (see the
    /// helper's text), its runs counted under `docker-credential-<name>`.
    pub fn helper(self, name: &str, mut settings: serde_json::Value) -> Self {
        let program = self.bin_dir().join(format!("docker-credential-{name}"));
        std::os::unix::fs::symlink(helper_plugin(), &program).unwrap();
        let runs = self
            .dir
            .path()
            .join(format!("docker-credential-{name}.runs"));
        std::fs::write(&runs, "").unwrap();
        settings["runs"] = runs.display().to_string().into();
        std::fs::write(
            program.with_file_name(format!("docker-credential-{name}.json")),
            settings.to_string(),
        )
        .unwrap();
        self
    }

    /// `docker_config_path`: a Docker config.json with this content.
    pub fn docker_config(mut self, config: serde_json::Value) -> Self {
        std::fs::write(
            self.dir.path().join("docker-config.json"),
            config.to_string(),
        )
        .unwrap();
        self.docker_config = true;
        self
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.json")
    }

    pub fn bin_dir(&self) -> PathBuf {
        self.dir.path().join("bin")
    }

    /// The `TOLERABLE_*` variables that configure them.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            (
                "TOLERABLE_CREDENTIALS__PROVIDER_CONFIG".to_owned(),
                self.config_path().display().to_string(),
            ),
            (
                "TOLERABLE_CREDENTIALS__PROVIDER_BIN_DIR".to_owned(),
                self.bin_dir().display().to_string(),
            ),
        ];
        if self.docker_config {
            env.push((
                "TOLERABLE_CREDENTIALS__DOCKER_CONFIG_PATH".to_owned(),
                self.dir
                    .path()
                    .join("docker-config.json")
                    .display()
                    .to_string(),
            ));
        }
        env
    }

    /// The images (a provider) or server URLs (a helper, `docker-credential-<name>`) plugin
    /// `name` was run for, in order.
    pub fn runs(&self, name: &str) -> Vec<String> {
        let path = self.dir.path().join(format!("{name}.runs"));
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The test config with these providers and `extra` variables: the defaults, with the test
    /// resolver settings (short timeouts, every test registry trusted).
    pub fn config(&self, extra: &[(&str, &str)]) -> tolerable::config::Config {
        let mut env = self.env();
        env.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let mut config = tolerable::config::Config::load(None, env).unwrap();
        config.resolver = super::settings();
        // Several Python plugins may run one after another in one lookup, each given half of
        // what is left: on a loaded 2-core machine 3 s is not enough for four of them. The
        // hang tests bound themselves by the admission's own timeout.
        config.resolver.lookup_timeout = std::time::Duration::from_secs(10);
        config
    }

    /// The resolver `serve`, `review` and `inspect` build from [`Providers::config`].
    pub fn resolver(&self, extra: &[(&str, &str)]) -> tolerable::registry::Resolver {
        tolerable::engine::resolver(&self.config(extra), None).unwrap()
    }
}

/// A directory of credential files (`registry_credential_path`) with one for `host`.
pub fn credential_file(host: &str, user: &str, secret: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let name = format!("{}.toml", host.replace(':', "_"));
    std::fs::write(
        dir.path().join(name),
        format!("user = {user:?}\nsecret = {secret:?}\n"),
    )
    .unwrap();
    dir
}

/// Whether process `pid` is gone (or a zombie nobody waits for).
pub fn process_gone(pid: u32) -> bool {
    let stat = std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat"))
        .unwrap_or_default();
    stat.is_empty() || stat.split(' ').nth(2) == Some("Z")
}

/// After an admission whose plugin hung: the process (pid in `pid_file`) is gone within 2 s and
/// its run is counted as a timeout under `provider`.
pub async fn hung_plugin_killed_and_counted(
    server: &super::webhook::TestServer,
    pid_file: &std::path::Path,
    provider: &str,
) {
    let pid: u32 = std::fs::read_to_string(pid_file).unwrap().parse().unwrap();
    let mut gone = false;
    for _ in 0..100 {
        gone = process_gone(pid);
        if gone {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(gone, "the plugin {pid} still runs");
    let metrics = super::webhook::metrics_text(server).await;
    let series = format!(
        "tolerable_credential_plugin_runs_total{{provider=\"{provider}\",result=\"timeout\"}} 1"
    );
    assert!(metrics.contains(&series), "{metrics}");
}

/// How long a hung plugin was given before it was killed, as the admission's warning says it
/// ("did not answer within 7999ms; killed"): what a test holds against the lookup budget.
pub fn killed_after(warnings: &str) -> std::time::Duration {
    let rest = warnings
        .split("did not answer within ")
        .nth(1)
        .unwrap_or_else(|| panic!("no kill in {warnings}"));
    let figure = rest.split(';').next().unwrap();
    match figure.strip_suffix("ms") {
        Some(ms) => std::time::Duration::from_millis(ms.parse().unwrap()),
        None => std::time::Duration::from_secs(figure.trim_end_matches('s').parse().unwrap()),
    }
}

/// A fixture image on the htpasswd registry.
pub fn basic_image(name: &str) -> String {
    format!("{}/fixtures/{name}:v1", super::registry::basic().host)
}

/// What an Unauthorized lookup says it tried.
pub fn tried(error: &tolerable::registry::LookupError) -> String {
    match error {
        tolerable::registry::LookupError::Unauthorized { tried, .. } => tried.clone(),
        other => panic!("not refused: {other}"),
    }
}
