//! Fixture images of every shape real registries serve, pushed with plain blob and manifest PUTs
//! (no Docker daemon). Bodies are deterministic, so digests are the same on every run.

use bytes::Bytes;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use serde_json::{json, Value};

use super::registry::{Mode, PASSWORD, USER};

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
pub const DOCKER_LAYER: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
const HELM_CONFIG: &str = "application/vnd.cncf.helm.config.v1+json";
const HELM_LAYER: &str = "application/vnd.cncf.helm.chart.content.v1.tar+gzip";
const IN_TOTO: &str = "application/vnd.in-toto+json";

/// Every fixture (repository name under the prefix, tag `v1`) and the platforms tolerable must
/// report for it; `None` for an artifact that names no platform (it runs anywhere).
pub const EXPECTED: &[(&str, Option<&[&str]>)] = &[
    (
        "multiarch-oci",
        Some(&["linux/amd64", "linux/arm/v7", "linux/arm64"]),
    ),
    ("buildx-single", Some(&["linux/amd64"])),
    (
        "multiarch-docker",
        Some(&[
            "linux/amd64",
            "linux/arm64",
            "linux/ppc64le",
            "windows/amd64",
        ]),
    ),
    ("s390x-docker", Some(&["linux/s390x"])),
    ("amd64-docker", Some(&["linux/amd64"])),
    ("arm64-oci", Some(&["linux/arm64"])),
    ("windows-mixed", Some(&["linux/amd64", "windows/amd64"])),
    ("index-no-platform", Some(&["linux/amd64", "linux/riscv64"])),
    (
        "nested-index",
        Some(&["linux/amd64", "linux/arm/v7", "linux/arm64", "linux/s390x"]),
    ),
    ("helm-artifact", None),
];

pub fn sha256(data: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, data);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

fn descriptor(media_type: &str, body: &[u8]) -> Value {
    json!({"mediaType": media_type, "digest": sha256(body), "size": body.len()})
}

fn platform(os: &str, arch: &str, variant: Option<&str>) -> Value {
    let mut p = json!({"architecture": arch, "os": os});
    if let Some(v) = variant {
        p["variant"] = json!(v);
    }
    if os == "windows" {
        p["os.version"] = json!("10.0.20348.2340");
    }
    p
}

/// One image (config + layer + manifest) pushed by digest.
struct Pushed {
    media_type: &'static str,
    body: Vec<u8>,
}

pub struct Pusher {
    client: Client,
    host: String,
    auth: RegistryAuth,
}

impl Pusher {
    pub fn for_mode(host: &str, mode: Mode) -> Self {
        Self::new(
            host,
            mode,
            match mode {
                Mode::Basic | Mode::Token => RegistryAuth::Basic(USER.into(), PASSWORD.into()),
                _ => RegistryAuth::Anonymous,
            },
        )
    }

    pub fn new(host: &str, mode: Mode, auth: RegistryAuth) -> Self {
        let config = ClientConfig {
            protocol: if mode == Mode::Plain {
                ClientProtocol::Http
            } else {
                ClientProtocol::Https
            },
            extra_root_certificates: vec![Certificate {
                encoding: CertificateEncoding::Pem,
                data: super::certs::ca().ca_pem.clone().into_bytes(),
            }],
            user_agent: "fixture-pusher/1",
            ..ClientConfig::default()
        };
        Self {
            client: Client::try_from(config).unwrap(),
            host: host.to_owned(),
            auth,
        }
    }

    fn reference(&self, repository: &str, reference: &str) -> Reference {
        if reference.contains(':') {
            Reference::with_digest(self.host.clone(), repository.into(), reference.into())
        } else {
            Reference::with_tag(self.host.clone(), repository.into(), reference.into())
        }
    }

    async fn login(&self, repository: &str) {
        self.client
            .auth(
                &self.reference(repository, "v1"),
                &self.auth,
                RegistryOperation::Push,
            )
            .await
            .unwrap();
    }

    async fn blob(&self, repository: &str, data: &[u8]) {
        let digest = sha256(data);
        self.client
            .push_blob(
                &self.reference(repository, &digest),
                Bytes::copy_from_slice(data),
                &digest,
            )
            .await
            .unwrap_or_else(|e| panic!("push blob to {repository}: {e}"));
    }

    /// Pushes a manifest under `reference` (a tag, or its own digest).
    pub async fn manifest(
        &self,
        repository: &str,
        reference: &str,
        media_type: &str,
        body: &[u8],
    ) -> String {
        self.client
            .push_manifest_raw(
                &self.reference(repository, reference),
                Bytes::copy_from_slice(body),
                media_type.parse().unwrap(),
            )
            .await
            .unwrap_or_else(|e| panic!("push manifest {repository}:{reference}: {e}"));
        sha256(body)
    }

    /// A request the access log will show, used to know the log has caught up.
    pub async fn probe(&self, repository: &str, marker: &str) -> Result<(), String> {
        self.client
            .pull_manifest_raw(
                &self.reference(repository, marker),
                &self.auth,
                &[OCI_INDEX],
            )
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn image(
        &self,
        repository: &str,
        os: &str,
        arch: &str,
        variant: Option<&str>,
        docker: bool,
    ) -> Pushed {
        let layer = format!("layer of {os}/{arch}/{}\n", variant.unwrap_or("")).into_bytes();
        let mut config = platform(os, arch, variant);
        config["config"] = json!({"Cmd": ["/bin/sh"]});
        config["rootfs"] = json!({"type": "layers", "diff_ids": [sha256(&layer)]});
        let config = serde_json::to_vec_pretty(&config).unwrap();
        self.blob(repository, &config).await;
        self.blob(repository, &layer).await;
        let media_type = if docker {
            DOCKER_MANIFEST
        } else {
            OCI_MANIFEST
        };
        let body = serde_json::to_vec_pretty(&json!({
            "schemaVersion": 2,
            "mediaType": media_type,
            "config": descriptor(if docker { DOCKER_CONFIG } else { OCI_CONFIG }, &config),
            "layers": [descriptor(if docker { DOCKER_LAYER } else { OCI_LAYER }, &layer)],
        }))
        .unwrap();
        self.manifest(repository, &sha256(&body), media_type, &body)
            .await;
        Pushed { media_type, body }
    }

    /// A buildx-style attestation manifest for `subject`.
    async fn attestation(&self, repository: &str, subject: &str) -> Value {
        let statement = serde_json::to_vec(&json!({
            "_type": "https://in-toto.io/Statement/v0.1",
            "subject": [{"name": "fixture", "digest": {"sha256": &subject[7..]}}],
        }))
        .unwrap();
        let config = serde_json::to_vec(&json!({"architecture": "unknown", "os": "unknown",
            "rootfs": {"type": "layers", "diff_ids": [sha256(&statement)]}}))
        .unwrap();
        self.blob(repository, &config).await;
        self.blob(repository, &statement).await;
        let body = serde_json::to_vec_pretty(&json!({
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": descriptor(OCI_CONFIG, &config),
            "layers": [descriptor(IN_TOTO, &statement)],
        }))
        .unwrap();
        self.manifest(repository, &sha256(&body), OCI_MANIFEST, &body)
            .await;
        let mut d = descriptor(OCI_MANIFEST, &body);
        d["platform"] = json!({"architecture": "unknown", "os": "unknown"});
        d["annotations"] = json!({
            "vnd.docker.reference.digest": subject,
            "vnd.docker.reference.type": "attestation-manifest",
        });
        d
    }

    /// An index over images of `platforms`; with `attest`, buildx attestations too; with
    /// `with_platform = false`, entries carry no `platform` field.
    async fn index(
        &self,
        repository: &str,
        media_type: &str,
        platforms: &[(&str, &str, Option<&str>)],
        attest: bool,
        with_platform: bool,
    ) -> Vec<u8> {
        let docker = media_type == DOCKER_LIST;
        let mut entries = Vec::new();
        for (os, arch, variant) in platforms {
            let image = self.image(repository, os, arch, *variant, docker).await;
            let mut d = descriptor(image.media_type, &image.body);
            if with_platform {
                d["platform"] = platform(os, arch, *variant);
            }
            entries.push(d);
        }
        if attest {
            for subject in entries.clone() {
                let digest = subject["digest"].as_str().unwrap().to_owned();
                entries.push(self.attestation(repository, &digest).await);
            }
        }
        serde_json::to_vec_pretty(
            &json!({"schemaVersion": 2, "mediaType": media_type, "manifests": entries}),
        )
        .unwrap()
    }

    /// An index claiming linux/amd64 and linux/arm64 for the same amd64 image.
    async fn mislabelled(&self, repository: &str) -> Vec<u8> {
        let image = self.image(repository, "linux", "amd64", None, false).await;
        let entries: Vec<Value> = [("amd64", None), ("arm64", Some("v8"))]
            .into_iter()
            .map(|(arch, variant)| {
                let mut d = descriptor(image.media_type, &image.body);
                d["platform"] = platform("linux", arch, variant);
                d
            })
            .collect();
        serde_json::to_vec_pretty(
            &json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}),
        )
        .unwrap()
    }

    /// Pushes every fixture in [`EXPECTED`] as `<prefix>/<name>:v1`.
    pub async fn push_all(&self, prefix: &str) {
        for (name, _) in EXPECTED {
            self.push(&format!("{prefix}/{name}"), name, "v1").await;
        }
    }

    /// Pushes fixture `name` as `repo:tag`; returns its top-level digest.
    pub async fn push(&self, repo: &str, name: &str, tag: &str) -> String {
        self.login(repo).await;
        let three = [
            ("linux", "amd64", None),
            ("linux", "arm64", Some("v8")),
            ("linux", "arm", Some("v7")),
        ];
        let (media_type, body) = match name {
            "multiarch-oci" => (
                OCI_INDEX,
                self.index(repo, OCI_INDEX, &three, true, true).await,
            ),
            "buildx-single" => (
                OCI_INDEX,
                self.index(repo, OCI_INDEX, &[("linux", "amd64", None)], true, true)
                    .await,
            ),
            "multiarch-docker" => (
                DOCKER_LIST,
                self.index(
                    repo,
                    DOCKER_LIST,
                    &[
                        ("linux", "amd64", None),
                        ("linux", "arm64", Some("v8")),
                        ("linux", "ppc64le", None),
                        ("windows", "amd64", None),
                    ],
                    false,
                    true,
                )
                .await,
            ),
            "s390x-docker" => {
                let p = self.image(repo, "linux", "s390x", None, true).await;
                (p.media_type, p.body)
            }
            "amd64-docker" => {
                let p = self.image(repo, "linux", "amd64", None, true).await;
                (p.media_type, p.body)
            }
            "arm64-oci" => {
                let p = self.image(repo, "linux", "arm64", Some("v8"), false).await;
                (p.media_type, p.body)
            }
            // Built on amd64 and pushed as amd64 and arm64 (kube-rbac-proxy#79): the index
            // claims both, the arm64 entry's image config says amd64.
            "mislabelled" => (OCI_INDEX, self.mislabelled(repo).await),
            "windows-mixed" => (
                OCI_INDEX,
                self.index(
                    repo,
                    OCI_INDEX,
                    &[("linux", "amd64", None), ("windows", "amd64", None)],
                    false,
                    true,
                )
                .await,
            ),
            "index-no-platform" => (
                OCI_INDEX,
                self.index(
                    repo,
                    OCI_INDEX,
                    &[("linux", "amd64", None), ("linux", "riscv64", None)],
                    false,
                    false,
                )
                .await,
            ),
            "nested-index" => (OCI_INDEX, self.nested_index(repo, &three).await),
            "helm-artifact" => (OCI_MANIFEST, self.helm_artifact(repo).await),
            other => panic!("unknown fixture {other}"),
        };
        self.manifest(repo, tag, media_type, &body).await
    }

    /// Pushes an OCI index of images of `platforms` (`(os, architecture, variant)`) as
    /// `repo:tag`; returns its digest.
    pub async fn push_platforms(
        &self,
        repo: &str,
        tag: &str,
        platforms: &[(&str, &str, Option<&str>)],
    ) -> String {
        self.login(repo).await;
        let body = self.index(repo, OCI_INDEX, platforms, false, true).await;
        self.manifest(repo, tag, OCI_INDEX, &body).await
    }

    /// An index naming another index (of `inner_platforms`, pushed by digest) beside a
    /// linux/s390x image: the resolver must descend into the inner one.
    async fn nested_index(
        &self,
        repo: &str,
        inner_platforms: &[(&str, &str, Option<&str>)],
    ) -> Vec<u8> {
        let inner = self
            .index(repo, OCI_INDEX, inner_platforms, true, true)
            .await;
        self.manifest(repo, &sha256(&inner), OCI_INDEX, &inner)
            .await;
        let s390x = self.image(repo, "linux", "s390x", None, false).await;
        let mut s390x_entry = descriptor(s390x.media_type, &s390x.body);
        s390x_entry["platform"] = platform("linux", "s390x", None);
        serde_json::to_vec_pretty(&json!({
            "schemaVersion": 2, "mediaType": OCI_INDEX,
            "manifests": [descriptor(OCI_INDEX, &inner), s390x_entry],
        }))
        .unwrap()
    }

    /// A linux/arm64 image wrapped in `levels` indexes, each naming the one inside it by digest
    /// (no platform on the entry, so the resolver must descend); the outermost is `tag`.
    pub async fn push_nested(&self, repo: &str, tag: &str, levels: usize) {
        let image = self.image(repo, "linux", "arm64", None, false).await;
        let (mut media_type, mut body) = (image.media_type, image.body);
        for level in 0..levels {
            body = serde_json::to_vec_pretty(&json!({
                "schemaVersion": 2, "mediaType": OCI_INDEX,
                "manifests": [descriptor(media_type, &body)],
            }))
            .unwrap();
            media_type = OCI_INDEX;
            let reference = match level + 1 == levels {
                true => tag.to_owned(),
                false => sha256(&body),
            };
            self.manifest(repo, &reference, OCI_INDEX, &body).await;
        }
    }

    /// A Helm chart pushed as an OCI artifact: a manifest whose config names no platform.
    async fn helm_artifact(&self, repo: &str) -> Vec<u8> {
        let config = br#"{"name":"fixture","version":"0.1.0","apiVersion":"v2"}"#;
        let chart = b"chart archive bytes";
        self.blob(repo, config).await;
        self.blob(repo, chart).await;
        serde_json::to_vec_pretty(&json!({
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": descriptor(HELM_CONFIG, config),
            "layers": [descriptor(HELM_LAYER, chart)],
        }))
        .unwrap()
    }
}

/// Pushes the index `body` to `repository` (plain http) as the tags `t{i}` for every `i` in
/// `tags`, `parallel` at a time: many distinct images that cost one manifest each.
pub async fn push_index_tags(
    host: &str,
    repository: &str,
    body: &[u8],
    tags: std::ops::Range<usize>,
    parallel: usize,
) {
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(tags.start));
    let pushers: Vec<_> = (0..parallel)
        .map(|_| {
            let pusher = Pusher::for_mode(host, Mode::Plain);
            let (next, body, repository, end) =
                (next.clone(), body.to_vec(), repository.to_owned(), tags.end);
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= end {
                        break;
                    }
                    pusher
                        .manifest(&repository, &format!("t{i}"), OCI_INDEX, &body)
                        .await;
                }
            })
        })
        .collect();
    for pusher in pushers {
        pusher.await.unwrap();
    }
}
