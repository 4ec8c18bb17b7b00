//! The external tools the deployment and monitoring tests run: `scripts/install-test-deps.sh`
//! (`make test-deps`) puts kubectl, promtool, kubernetes-validate and a Python with the
//! validators' packages in `.test-tools/bin`, which is used before `PATH` — a kubectl on `PATH`
//! may be Debian's 1.20, whose kustomize cannot read `kustomize/`.

use std::path::PathBuf;
use std::process::Command;

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where `name` is: `.test-tools/bin/name`, else the first `name` on `PATH`.
pub fn path(name: &str) -> PathBuf {
    let own = root().join(".test-tools/bin").join(name);
    if own.is_file() {
        return own;
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` not found in .test-tools/bin or on PATH: run scripts/install-test-deps.sh \
                 (make test-deps) first"
            )
        })
}

/// A command running `name` (see [`path`]).
pub fn command(name: &str) -> Command {
    Command::new(path(name))
}

/// The test tools' Python (with pyyaml, jsonschema and cert-manager's models) running one of
/// the repository's `scripts/`.
pub fn python_script(script: &str) -> Command {
    let mut command = command("python3");
    command.arg(root().join("scripts").join(script));
    command
}

/// `kubectl kustomize DIR` (DIR relative to the repository root, or absolute): the rendered
/// YAML.
pub fn render(dir: impl AsRef<std::path::Path>) -> String {
    let dir = root().join(dir);
    let out = command("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The YAML documents of `yaml`, empty ones dropped.
pub fn documents(yaml: &str) -> Vec<serde_json::Value> {
    use serde::Deserialize as _;
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|doc| serde_json::Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// `text` in a temporary file.
pub fn write_temp(text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut file, text.as_bytes()).unwrap();
    file
}

/// The oldest and the newest Kubernetes docs/install.md says tolerable supports: the manifests
/// and the chart must validate against both versions' schemas.
pub const KUBERNETES_VERSIONS: [&str; 2] = ["1.30.0", "1.37.0"];

/// Validates the objects in `file` strictly (unknown fields are errors) against Kubernetes'
/// schemas at every [`KUBERNETES_VERSIONS`], and panics naming `what` unless each of `kinds`
/// (lower case, as `kubernetes-validate` reports them) was validated.
pub fn validate_against_kubernetes(file: &std::path::Path, kinds: &[&str], what: &str) {
    for version in KUBERNETES_VERSIONS {
        let out = command("kubernetes-validate")
            .args(["--strict", "--no-warn", "--kubernetes-version", version])
            .arg(file)
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{what}: kubernetes-validate (Kubernetes {version}) failed:\n{report}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for kind in kinds {
            assert!(
                report.contains(&format!("passed for resource {kind}/")),
                "{what}: {kind} not validated against Kubernetes {version}:\n{report}"
            );
        }
    }
}
