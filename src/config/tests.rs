//! The config's tests: loading, sections, deprecated flat keys, errors naming keys and where
//! they were written, the shipped file and the reference.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::mutate::{
    OnLookupFailure, OnNoCommonArchitecture, Steering, TolerationOperator, WeightedArchitecture,
    PREFERRED_WEIGHT,
};
use crate::registry::access::AccessRules;

fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    vars.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn write(dir: &tempfile::TempDir, text: &str) -> PathBuf {
    let path = dir.path().join("tolerable.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn defaults() {
    let c = Config::load(None, env(&[])).unwrap();
    assert_eq!(
        c.policy,
        Policy::default(),
        "Policy::default() is the documented one"
    );
    assert_eq!(c.resolver.lookup_timeout, Duration::from_secs(4));
    assert_eq!(
        c.server_limits,
        ServerLimits::default(),
        "ServerLimits::default() is the documented one"
    );
    assert_eq!(c.tls_reload_name_check, NameCheck::Refuse);
    assert_eq!(c.resolver.cache.tag_ttl, Duration::from_secs(300));
    assert_eq!(c.log_format, LogFormat::Text);
    assert!(c.resolver.mirrors.is_empty());
    assert_eq!(c.listen_addr.to_string(), "0.0.0.0:8443");
    assert!(c.tls_files.is_none());
    assert_eq!(
        c.policy.supported_architectures,
        BTreeSet::from(["arm64".to_owned()])
    );
    assert_eq!(c.policy.steering, Steering::NodeAffinity);
    assert_eq!(c.policy.toleration.key, "kubernetes.io/arch");
    assert_eq!(c.policy.toleration.effect, "NoSchedule");
    assert_eq!(c.policy.on_lookup_failure, OnLookupFailure::Allow);
    assert_eq!(
        c.policy.on_no_common_architecture,
        OnNoCommonArchitecture::Deny
    );
}

#[test]
fn original_tolerable_keys_and_nested_environment() {
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("tls.crt");
    let key = dir.path().join("tls.key");
    std::fs::write(&cert, "x").unwrap();
    std::fs::write(&key, "x").unwrap();
    let path = write(
        &dir,
        &format!(
            r#"
            ssl_cert_path = {cert:?}
            ssl_key_path = {key:?}
            registry_credential_path = {creds:?}
            supported_architectures = ["arm64", "s390x"]
            log_level = "debug"
            [tolerations]
            key = "example.com/arch"
            operator = "Exists"
            effect = "NoExecute"
            toleration_seconds = 30
            "#,
            creds = dir.path()
        ),
    );
    let c = Config::load(Some(&path), env(&[])).unwrap();
    assert_eq!(c.tls_files, Some((cert.clone(), key.clone())));
    assert_eq!(c.policy.supported_architectures.len(), 2);
    assert_eq!(c.policy.toleration.operator, TolerationOperator::Exists);
    assert_eq!(c.policy.toleration.toleration_seconds, Some(30));

    let c = Config::load(
        Some(&path),
        env(&[
            (
                "TOLERABLE_POLICY__SUPPORTED_ARCHITECTURES",
                "arm64, s390x,ppc64le , 386",
            ),
            ("TOLERABLE_TOLERATIONS__EFFECT", "NoExecute"),
            ("TOLERABLE_TOLERATIONS__TOLERATION_SECONDS", "60"),
            ("TOLERABLE_POLICY__STEERING", "node_selector"),
            (
                "TOLERABLE_POLICY__SKIP_NAMESPACES",
                "kube-system, monitoring",
            ),
            ("TOLERABLE_POLICY__PREFERRED_ARCHITECTURE", "arm64"),
            ("TOLERABLE_POLICY__ON_LOOKUP_FAILURE", "deny"),
            ("TOLERABLE_SERVER__LISTEN_ADDR", "127.0.0.1:9443"),
            ("TOLERABLE_CREDENTIALS__READ_PULL_SECRETS", "false"),
            ("TOLERABLE_NODES__WATCH", "0"),
            ("TOLERABLE_POLICY__DEFAULT_ARCHITECTURES", "amd64, arm64"),
            ("TOLERABLE_NODES__MANAGE_TAINTS", "true"),
        ]),
    )
    .unwrap();
    assert_eq!(
        c.policy.supported_architectures,
        BTreeSet::from(["386", "arm64", "ppc64le", "s390x"].map(String::from))
    );
    assert_eq!(c.policy.toleration.toleration_seconds, Some(60));
    assert_eq!(c.policy.steering, Steering::NodeSelector);
    assert!(c.policy.skip_namespaces.contains("monitoring"));
    assert_eq!(
        c.policy.preferred_architectures,
        [WeightedArchitecture {
            architecture: "arm64".into(),
            weight: PREFERRED_WEIGHT
        }]
    );
    assert_eq!(c.policy.on_lookup_failure, OnLookupFailure::Deny);
    assert_eq!(c.listen_addr.port(), 9443);
    assert!(!c.read_pull_secrets);
    assert!(!c.watch_nodes);
    assert_eq!(c.taint_policy.default_architectures.len(), 2);
    assert!(c.manage_node_taints);
}

#[test]
fn file_then_environment() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        r#"
        lookup_timeout = "3s"
        insecure_registries = ["127.0.0.1:5000"]
        log_format = "json"
        [registry_mirrors]
        "docker.io" = "mirror.gcr.io"
        "#,
    );
    let c = Config::load(Some(&path), env(&[])).unwrap();
    assert_eq!(c.resolver.lookup_timeout, Duration::from_secs(3));
    assert_eq!(c.resolver.transport.insecure_registries, ["127.0.0.1:5000"]);
    assert_eq!(c.resolver.mirrors["docker.io"], "mirror.gcr.io");
    assert_eq!(c.log_format, LogFormat::Json);

    let c = Config::load(
        Some(&path),
        env(&[
            ("TOLERABLE_REGISTRY__LOOKUP_TIMEOUT", "1500ms"),
            (
                "TOLERABLE_REGISTRY__INSECURE",
                " localhost:5000 , 10.0.0.1:80,",
            ),
            ("TOLERABLE_CACHE__MAX_ENTRIES", "77"),
            ("TOLERABLE_CONFIG", "/elsewhere.toml"),
            // Injected by Kubernetes for a Service named tolerable.
            ("TOLERABLE_SERVICE_HOST", "10.0.0.9"),
            ("TOLERABLE_PORT_443_TCP", "tcp://10.0.0.9:443"),
            ("TOLERABLE_PORT", "tcp://10.0.0.9:443"),
            ("OTHER_LOOKUP_TIMEOUT", "9s"),
        ]),
    )
    .unwrap();
    assert_eq!(c.resolver.lookup_timeout, Duration::from_millis(1500));
    assert_eq!(
        c.resolver.transport.insecure_registries,
        ["localhost:5000", "10.0.0.1:80"]
    );
    assert_eq!(c.resolver.cache.max_entries, 77);
}

/// Variables with a bad value, and the key the error must name.
const BAD_VALUES: &[(&[(&str, &str)], &str)] = &[
    (
        &[("TOLERABLE_REGISTRY__LOOKUP_TIMEOUT", "soon")],
        "registry.lookup_timeout",
    ),
    (
        &[("TOLERABLE_REGISTRY__LOOKUP_TIMEOUT", "0s")],
        "registry.lookup_timeout",
    ),
    (
        &[("TOLERABLE_REGISTRY__LOOKUP_TIMEOUT", "1m")],
        "registry.lookup_timeout",
    ),
    (&[("TOLERABLE_CACHE__TAG_TTL", "5y")], "cache.tag_ttl"),
    (
        &[("TOLERABLE_CACHE__MAX_ENTRIES", "lots")],
        "cache.max_entries",
    ),
    (
        &[("TOLERABLE_CACHE__MAX_ENTRIES", "0")],
        "cache.max_entries",
    ),
    (
        &[("TOLERABLE_SERVER__WORKER_THREADS", "100000")],
        "server.worker_threads",
    ),
    (
        &[("TOLERABLE_SERVER__WORKER_THREADS", "two")],
        "server.worker_threads",
    ),
    (
        &[("TOLERABLE_SERVER__MAX_CONNECTIONS", "0")],
        "server.max_connections",
    ),
    (
        &[("TOLERABLE_SERVER__MAX_CONNECTIONS_PER_PEER", "0")],
        "server.max_connections_per_peer",
    ),
    (
        &[("TOLERABLE_SERVER__MAX_CONNECTIONS_PER_PEER", "1001")],
        "server.max_connections_per_peer",
    ),
    (
        &[("TOLERABLE_SERVER__MAX_REQUESTS_IN_FLIGHT", "0")],
        "server.max_requests_in_flight",
    ),
    (
        &[("TOLERABLE_SERVER__REQUEST_READ_TIMEOUT", "10s")],
        "server.request_read_timeout",
    ),
    (
        &[("TOLERABLE_SERVER__REQUEST_READ_TIMEOUT", "0s")],
        "server.request_read_timeout",
    ),
    (
        &[("TOLERABLE_SERVER__CONNECTION_IDLE_TIMEOUT", "0s")],
        "server.connection_idle_timeout",
    ),
    (
        &[("TOLERABLE_TLS__RELOAD_NAME_CHECK", "ignore")],
        "tls.reload_name_check",
    ),
    (&[("TOLERABLE_LOG__FORMAT", "xml")], "log.format"),
    (&[("TOLERABLE_LOG__LEVEL", "info,[")], "log.level"),
    (
        &[("TOLERABLE_REGISTRY__INSECURE", "bad host:1")],
        "registry.insecure",
    ),
    (
        &[("TOLERABLE_REGISTRY__CA_PATH", "/nonexistent/ca.pem")],
        "registry.ca_path",
    ),
    (
        &[("TOLERABLE_CREDENTIALS__FILES_PATH", "/nonexistent/creds")],
        "credentials.files_path",
    ),
    (&[("TOLERABLE_LOOKUP_TIMEOT", "1s")], "lookup_timeot"),
    (
        &[("TOLERABLE_POLICY__SUPPORTED_ARCHITECTURES", "arm64,ARM 64")],
        "policy.supported_architectures",
    ),
    (
        &[("TOLERABLE_TOLERATIONS__OPERATOR", "Maybe")],
        "tolerations.operator",
    ),
    (
        &[("TOLERABLE_TOLERATIONS__EFFECT", "NoRun")],
        "tolerations.effect",
    ),
    (
        &[("TOLERABLE_TOLERATIONS__TOLERATION_SECONDS", "30")],
        "tolerations.toleration_seconds",
    ),
    (
        &[("TOLERABLE_TOLERATIONS__KEY", "bad key")],
        "tolerations.key",
    ),
    (&[("TOLERABLE_TOLERATIONS__COLOR", "red")], "color"),
    (
        &[("TOLERABLE_POLICY__STEERING", "sideways")],
        "policy.steering",
    ),
    (
        &[("TOLERABLE_POLICY__PREFERRED_ARCHITECTURE", "Arm64")],
        "policy.preferred_architecture",
    ),
    (
        &[("TOLERABLE_POLICY__ON_NO_COMMON_ARCHITECTURE", "shrug")],
        "policy.on_no_common_architecture",
    ),
    (
        &[("TOLERABLE_POLICY__ON_LOOKUP_FAILURE", "panic")],
        "policy.on_lookup_failure",
    ),
    (
        &[("TOLERABLE_SERVER__LISTEN_ADDR", "8443")],
        "server.listen_addr",
    ),
    (
        &[("TOLERABLE_SERVER__METRICS_ADDR", "9090")],
        "server.metrics_addr",
    ),
    (
        &[("TOLERABLE_SERVER__METRICS_ADDR", "0.0.0.0:8443")],
        "server.metrics_addr",
    ),
    (
        &[("TOLERABLE_CREDENTIALS__READ_PULL_SECRETS", "maybe")],
        "credentials.read_pull_secrets",
    ),
    (
        &[("TOLERABLE_TLS__CERT_PATH", "/nonexistent.crt")],
        "tls.key_path",
    ),
    (
        &[("TOLERABLE_TLS__KEY_PATH", "/nonexistent.key")],
        "tls.cert_path",
    ),
    (
        &[
            ("TOLERABLE_TLS__CERT_PATH", "/nonexistent.crt"),
            ("TOLERABLE_TLS__KEY_PATH", "/nonexistent.key"),
        ],
        "tls.cert_path",
    ),
];

#[test]
fn bad_values_name_the_key() {
    let cases = BAD_VALUES;
    for (vars, key) in cases {
        let err = Config::load(None, env(vars)).unwrap_err().to_string();
        assert!(err.contains(key), "{vars:?}: {err}");
    }
}

#[test]
fn bad_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "lookup_timeout = \n");
    let err = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
    assert!(err.contains("tolerable.toml"), "{err}");

    let path = write(&dir, "[registry_mirrors]\n\"docker.io\" = \"not a host\"\n");
    let err = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
    assert!(err.contains("registry.mirrors.docker.io"), "{err}");

    let path = write(&dir, "unknown_key = 1\n");
    let err = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
    assert!(err.contains("unknown_key"), "{err}");

    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "not a certificate").unwrap();
    let path = write(&dir, &format!("registry_ca_path = {:?}\n", ca));
    let err = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
    assert!(
        err.contains("registry.ca_path") && err.contains("no PEM"),
        "{err}"
    );

    let missing = dir.path().join("missing.toml");
    let err = Config::load(Some(&missing), env(&[]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing.toml"), "{err}");
}

#[test]
fn registry_access_lists() {
    let c = Config::load(None, env(&[])).unwrap();
    assert_eq!(c.resolver.transport.access, AccessRules::default());
    let url = |u: &str| reqwest::Url::parse(u).unwrap();
    assert!(c
        .resolver
        .transport
        .access
        .check_url(&url("http://169.254.169.254/"))
        .is_err());

    let c = Config::load(
        None,
        env(&[
            (
                "TOLERABLE_REGISTRY__ALLOWLIST",
                "*.dkr.ecr.*.amazonaws.com, Registry.Example.com:5000, 10.0.0.0/8",
            ),
            ("TOLERABLE_REGISTRY__DENYLIST", "10.6.0.0/16"),
            ("TOLERABLE_REGISTRY__INSECURE", "Registry.Example.com:5000"),
        ]),
    )
    .unwrap();
    let access = &c.resolver.transport.access;
    assert!(access
        .check_url(&url("http://registry.example.com:5000/v2/"))
        .is_ok());
    // A name no rule names: its addresses must be in an allowed network.
    assert!(access.check_url(&url("https://ghcr.io/v2/")).is_ok());
    assert!(access
        .address_allowed("ghcr.io", "140.82.121.3".parse().unwrap())
        .is_err());
    assert!(access
        .address_allowed("ghcr.io", "10.1.2.3".parse().unwrap())
        .is_ok());
    assert!(access.check_url(&url("https://10.6.1.1/v2/")).is_err());
    // The denylist was replaced, and the link-local addresses are still denied.
    assert!(access.check_url(&url("http://169.254.169.254/")).is_err());
    assert_eq!(
        c.resolver.transport.insecure_registries,
        ["registry.example.com:5000"]
    );

    for (key, value) in [
        ("TOLERABLE_REGISTRY__DENYLIST", "10.0.0.1/8"),
        ("TOLERABLE_REGISTRY__DENYLIST", "169.254.0.0/40"),
        ("TOLERABLE_REGISTRY__ALLOWLIST", "reg*.example.com"),
        // An address may take a port; a network may not.
        ("TOLERABLE_REGISTRY__ALLOWLIST", "10.0.0.0/8:5000"),
    ] {
        let err = Config::load(None, env(&[(key, value)]))
            .unwrap_err()
            .to_string();
        let name = key
            .trim_start_matches("TOLERABLE_")
            .to_ascii_lowercase()
            .replace("__", ".");
        assert!(
            err.contains(&format!("`{name}`")) && err.contains(value),
            "{value}: {err}"
        );
    }
}

/// A file with per-architecture templates (one list, one table) and weighted preferences.
fn architecture_tolerations_file(dir: &tempfile::TempDir) -> PathBuf {
    write(
        dir,
        r#"
    supported_architectures = ["arm64", "s390x"]
    preferred_architecture = [{ architecture = "arm64", weight = 80 },
                              { architecture = "amd64", weight = 20 }]
    [[architecture_tolerations.arm64]]
    key = "arm64"
    value = "true"
    [[architecture_tolerations.arm64]]
    key = "kubernetes.io/arch"
    effect = "NoExecute"
    toleration_seconds = 60
    [architecture_tolerations.s390x]
    key = "example.com/pool"
    operator = "Exists"
    "#,
    )
}

#[test]
fn architecture_tolerations_in_toml() {
    let dir = tempfile::tempdir().unwrap();
    let path = architecture_tolerations_file(&dir);
    let c = Config::load(Some(&path), env(&[])).unwrap();
    let arm = &c.policy.architecture_tolerations["arm64"];
    assert_eq!(arm.len(), 2);
    assert_eq!(
        (
            arm[0].key.as_str(),
            arm[0].value.as_deref(),
            arm[0].effect.as_str()
        ),
        ("arm64", Some("true"), "NoSchedule")
    );
    assert_eq!(arm[1].toleration_seconds, Some(60));
    let s390x = &c.policy.architecture_tolerations["s390x"];
    assert_eq!(s390x[0].operator, TolerationOperator::Exists);
    assert_eq!(
        c.policy.templates_for("ppc64le"),
        std::slice::from_ref(&c.policy.toleration)
    );
    assert_eq!(
        c.policy.taint_keys(),
        BTreeSet::from(["arm64", "example.com/pool", "kubernetes.io/arch"].map(String::from))
    );
    assert_eq!(
        c.policy
            .preferred_architectures
            .iter()
            .map(|w| (w.architecture.as_str(), w.weight))
            .collect::<Vec<_>>(),
        [("arm64", 80), ("amd64", 20)]
    );
    // Node tainting follows the first template.
    assert_eq!(
        c.taint_policy.architecture_taints["arm64"].to_string(),
        "arm64=true:NoSchedule"
    );
}

#[test]
fn architecture_tolerations_in_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let path = architecture_tolerations_file(&dir);
    let c = Config::load(
        Some(&path),
        env(&[
            (
                "TOLERABLE_ARCHITECTURE_TOLERATIONS__ARM64",
                "arm64=true:NoSchedule, kubernetes.io/arch, team=*:NoExecute",
            ),
            (
                "TOLERABLE_POLICY__PREFERRED_ARCHITECTURE",
                "arm64=90, amd64",
            ),
        ]),
    )
    .unwrap();
    // A nested variable for one field of a table.
    let nested = Config::load(
        Some(&path),
        env(&[
            (
                "TOLERABLE_ARCHITECTURE_TOLERATIONS__S390X__EFFECT",
                "NoExecute",
            ),
            (
                "TOLERABLE_ARCHITECTURE_TOLERATIONS__S390X__TOLERATION_SECONDS",
                "45",
            ),
        ]),
    )
    .unwrap();
    let s390x = &nested.policy.architecture_tolerations["s390x"][0];
    assert_eq!(
        (s390x.effect.as_str(), s390x.toleration_seconds),
        ("NoExecute", Some(45))
    );
    let arm = &c.policy.architecture_tolerations["arm64"];
    let shown: Vec<String> = arm
        .iter()
        .map(|t| format!("{:?}", t.for_architecture("arm64")))
        .collect();
    assert_eq!(arm.len(), 3, "{shown:?}");
    assert_eq!(arm[1].value, None);
    assert_eq!(
        arm[1].for_architecture("arm64").value.as_deref(),
        Some("arm64")
    );
    assert_eq!(arm[2].operator, TolerationOperator::Exists);
    assert_eq!(arm[2].effect, "NoExecute");
    assert_eq!(c.policy.preferred_architectures[0].weight, 90);
    assert_eq!(c.policy.preferred_architectures[1].weight, PREFERRED_WEIGHT);
}

#[test]
fn architecture_names_are_kubernetes_names_with_a_suggestion() {
    for (vars, key, suggestion) in [
        (
            [("TOLERABLE_POLICY__SUPPORTED_ARCHITECTURES", "aarch64")],
            "policy.supported_architectures",
            "\"arm64\"",
        ),
        (
            [("TOLERABLE_POLICY__DEFAULT_ARCHITECTURES", "x86_64")],
            "policy.default_architectures",
            "\"amd64\"",
        ),
        (
            [("TOLERABLE_POLICY__SUPPORTED_ARCHITECTURES", "armv7l")],
            "policy.supported_architectures",
            "\"arm\"",
        ),
        (
            [("TOLERABLE_POLICY__PREFERRED_ARCHITECTURE", "i686")],
            "policy.preferred_architecture",
            "\"386\"",
        ),
        (
            [("TOLERABLE_POLICY__SUPPORTED_ARCHITECTURES", "sparc")],
            "policy.supported_architectures",
            "one of 386, amd64",
        ),
    ] {
        let err = Config::load(None, env(&vars)).unwrap_err().to_string();
        assert!(
            err.contains(key) && err.contains(suggestion),
            "{vars:?}: {err}"
        );
    }
    for arch in [
        "amd64", "arm64", "arm", "s390x", "ppc64le", "386", "riscv64",
    ] {
        Config::load(
            None,
            env(&[("TOLERABLE_POLICY__SUPPORTED_ARCHITECTURES", arch)]),
        )
        .unwrap_or_else(|e| panic!("{arch}: {e}"));
    }
}

#[test]
fn bad_templates_and_preferences_name_the_key() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("TOLERABLE_ARCHITECTURE_TOLERATIONS__S390X", "k=v")],
            "architecture_tolerations.s390x",
        ),
        (
            &[("TOLERABLE_ARCHITECTURE_TOLERATIONS__ARM64", "bad key=v")],
            "architecture_tolerations.arm64.key",
        ),
        (
            &[("TOLERABLE_ARCHITECTURE_TOLERATIONS__ARM64", "k=v:NoRun")],
            "architecture_tolerations.arm64.effect",
        ),
        (
            &[("TOLERABLE_ARCHITECTURE_TOLERATIONS__ARM64", "=v")],
            "architecture_tolerations.arm64",
        ),
        (
            &[("TOLERABLE_ARCHITECTURE_TOLERATIONS__ARM64", " , ")],
            "architecture_tolerations.arm64",
        ),
        (
            &[("TOLERABLE_POLICY__PREFERRED_ARCHITECTURE", "arm64=0")],
            "policy.preferred_architecture",
        ),
        (
            &[("TOLERABLE_POLICY__PREFERRED_ARCHITECTURE", "arm64=101")],
            "policy.preferred_architecture",
        ),
        (
            &[("TOLERABLE_POLICY__PREFERRED_ARCHITECTURE", "arm64=lots")],
            "policy.preferred_architecture",
        ),
        (
            &[("TOLERABLE_POLICY__PREFERRED_ARCHITECTURE", "arm64, arm64=3")],
            "policy.preferred_architecture",
        ),
    ];
    for (vars, key) in cases {
        let err = Config::load(None, env(vars)).unwrap_err().to_string();
        assert!(err.contains(key), "{vars:?}: {err}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "[architecture_tolerations.arm64]\nkey = \"k\"\noperator = \"Exists\"\nvalue = \"v\"\n",
    );
    let err = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
    assert!(
        err.contains("architecture_tolerations.arm64.value"),
        "{err}"
    );
}

#[test]
fn durations() {
    for (text, want) in [
        ("250ms", Duration::from_millis(250)),
        ("4s", Duration::from_secs(4)),
        ("4", Duration::from_secs(4)),
        ("5m", Duration::from_secs(300)),
        ("24h", Duration::from_secs(86400)),
    ] {
        assert_eq!(parse_duration("k", text).unwrap(), want, "{text}");
    }
    for bad in ["", "s", "1.5s", "-1s", "1d", "99999999999999999999h"] {
        assert!(parse_duration("k", bad).is_err(), "{bad}");
    }
}

#[test]
fn server_limits_from_the_environment() {
    let c = Config::load(
        None,
        env(&[
            ("TOLERABLE_SERVER__MAX_CONNECTIONS", "50"),
            ("TOLERABLE_SERVER__MAX_CONNECTIONS_PER_PEER", "20"),
            ("TOLERABLE_SERVER__MAX_REQUESTS_IN_FLIGHT", "7"),
            ("TOLERABLE_SERVER__REQUEST_READ_TIMEOUT", "1500ms"),
            ("TOLERABLE_SERVER__CONNECTION_IDLE_TIMEOUT", "2s"),
            ("TOLERABLE_TLS__RELOAD_NAME_CHECK", "warn"),
        ]),
    )
    .unwrap();
    assert_eq!(
        c.server_limits,
        ServerLimits {
            max_connections: 50,
            max_connections_per_peer: 20,
            max_requests_in_flight: 7,
            request_read_timeout: Duration::from_millis(1500),
            connection_idle_timeout: Duration::from_secs(2),
        }
    );
    assert_eq!(c.tls_reload_name_check, NameCheck::Warn);
}

#[test]
fn unknown_keys_are_named_where_written_with_the_nearest_key() {
    let err = Config::load(None, env(&[("TOLERABLE_LOOKUP_TIMOUT", "1s")]))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "environment variable TOLERABLE_LOOKUP_TIMOUT: unknown field `lookup_timout`; \
         did you mean TOLERABLE_REGISTRY__LOOKUP_TIMEOUT?"
    );
    let err = Config::load(None, env(&[("TOLERABLE_TOLERATIONS__EFECT", "NoExecute")]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("TOLERABLE_TOLERATIONS__EFECT")
            && err.contains("did you mean TOLERABLE_TOLERATIONS__EFFECT?"),
        "{err}"
    );
    let err = Config::load(
        None,
        env(&[("TOLERABLE_ARCHITECTURE_TOLERATIONS__ARM64__VALU", "x")]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("did you mean TOLERABLE_ARCHITECTURE_TOLERATIONS__ARM64__VALUE?"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "[tolerations]\nefect = \"NoExecute\"\n");
    let err = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "config file {}: unknown field `tolerations.efect`; did you mean `tolerations.effect`?",
            path.display()
        )
    );
    let path = write(
        &dir,
        "registry_mirror = { \"docker.io\" = \"mirror.gcr.io\" }\n",
    );
    let err = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
    assert!(
        err.contains("tolerable.toml") && err.contains("did you mean `registry.mirrors`?"),
        "{err}"
    );
    // A real key in the wrong section is sent to its section, not to a nearer key of this one
    // (`[policy] gate_timeout` is closer to `lookup_timeout` than `[registry]`'s is).
    let path = write(&dir, "[policy]\nlookup_timeout = \"3s\"\n");
    let err = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "config file {}: unknown field `policy.lookup_timeout`: this key belongs in \
             [registry] (`registry.lookup_timeout`)",
            path.display()
        )
    );
    let err = Config::load(None, env(&[("TOLERABLE_POLICY__LOOKUP_TIMEOUT", "3s")]))
        .unwrap_err()
        .to_string();
    assert!(
        err.ends_with("this key belongs in [registry] (TOLERABLE_REGISTRY__LOOKUP_TIMEOUT)"),
        "{err}"
    );
    // Map entries are named freely, and empty variables are as if unset.
    let path = write(
        &dir,
        "[registry_mirrors]\n\"my.registry\" = \"mirror.example\"\n",
    );
    Config::load(Some(&path), env(&[("TOLERABLE_NO_SUCH_KEY", " ")])).unwrap();
}

#[test]
fn credential_providers_from_the_environment_with_errors_naming_the_key() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let plugin = bin.join("ecr-credential-provider");
    std::fs::write(&plugin, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.path().join("providers.yaml");
    std::fs::write(
        &file,
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n\
         - name: ecr-credential-provider\n  matchImages: [\"*.dkr.ecr.*.amazonaws.com\"]\n\
         \x20 defaultCacheDuration: 12h\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n",
    )
    .unwrap();
    let (file, bin) = (file.to_str().unwrap(), bin.to_str().unwrap());
    let config = Config::load(
        None,
        env(&[
            ("TOLERABLE_CREDENTIALS__PROVIDER_CONFIG", file),
            ("TOLERABLE_CREDENTIALS__PROVIDER_BIN_DIR", bin),
        ]),
    )
    .unwrap();
    assert_eq!(
        config.credential_providers[0].name,
        "ecr-credential-provider"
    );
    assert!(Config::load(None, env(&[]))
        .unwrap()
        .credential_providers
        .is_empty());

    let err = |vars: &[(&str, &str)]| Config::load(None, env(vars)).unwrap_err().to_string();
    let alone = err(&[("TOLERABLE_CREDENTIALS__PROVIDER_CONFIG", file)]);
    assert!(
        alone.contains("config key `credentials.provider_bin_dir`: must be set with credentials.provider_config"),
        "{alone}"
    );
    let empty_bin = dir.path().to_str().unwrap();
    let missing = err(&[
        ("TOLERABLE_CREDENTIALS__PROVIDER_CONFIG", file),
        ("TOLERABLE_CREDENTIALS__PROVIDER_BIN_DIR", empty_bin),
    ]);
    assert!(
        missing.starts_with("environment variable TOLERABLE_CREDENTIALS__PROVIDER_CONFIG: config key `credentials.provider_config`: ")
            && missing.contains("provider \"ecr-credential-provider\": no executable"),
        "{missing}"
    );
}

#[test]
fn bad_values_name_the_variable_or_the_file() {
    for (var, value, key) in [
        (
            "TOLERABLE_REGISTRY__LOOKUP_TIMEOUT",
            "soon",
            "registry.lookup_timeout",
        ),
        ("TOLERABLE_CACHE__MAX_ENTRIES", "lots", "cache.max_entries"),
        ("TOLERABLE_POLICY__STEERING", "sideways", "policy.steering"),
        (
            "TOLERABLE_TOLERATIONS__EFFECT",
            "NoRun",
            "tolerations.effect",
        ),
        (
            "TOLERABLE_REGISTRY__MIRRORS",
            "docker.io=not a host",
            "registry.mirrors",
        ),
        (
            "TOLERABLE_ARCHITECTURE_TOLERATIONS__ARM64",
            "k=v:NoRun",
            "architecture_tolerations.arm64.effect",
        ),
    ] {
        let err = Config::load(None, env(&[(var, value)]))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!("environment variable {var}: "))
                && err.contains(&format!("`{key}")),
            "{var}={value}: {err}"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "steering = \"sideways\"\n[tolerations]\nkey = \"k\"\n",
    );
    let err = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "config file {}: config key `policy.steering`: \"sideways\" is not off, node_selector or node_affinity",
            path.display()
        )
    );
    // The variable overrides the file, and is the one named.
    let err = Config::load(Some(&path), env(&[("TOLERABLE_POLICY__STEERING", "up")]))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(
            "environment variable TOLERABLE_POLICY__STEERING: config key `policy.steering`: \"up\""
        ),
        "{err}"
    );
    let path = write(&dir, "cache_max_entries = -1\n");
    let err = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!("config file {}: ", path.display()))
            && err.ends_with("for key `cache.max_entries`"),
        "{err}"
    );
    // A key left at its default that another one makes wrong: no source to name.
    let err = Config::load(None, env(&[("TOLERABLE_TLS__CERT_PATH", "/tls.crt")]))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "config key `tls.key_path`: must be set with tls.cert_path"
    );
}

#[test]
fn words_name_the_key_and_the_words_it_takes() {
    for (var, value, want) in [
        (
            "TOLERABLE_LOG__FORMAT",
            "xml",
            "config key `log.format`: \"xml\" is not text or json",
        ),
        (
            "TOLERABLE_TOLERATIONS__EFFECT",
            "NoRun",
            "config key `tolerations.effect`: \"NoRun\" is not NoSchedule, PreferNoSchedule, NoExecute or empty",
        ),
        (
            "TOLERABLE_TLS__RELOAD_NAME_CHECK",
            "ignore",
            "config key `tls.reload_name_check`: \"ignore\" is not refuse or warn",
        ),
        (
            "TOLERABLE_POLICY__ON_NO_COMMON_ARCHITECTURE",
            "shrug",
            "config key `policy.on_no_common_architecture`: \"shrug\" is not deny or warn",
        ),
        (
            "TOLERABLE_POLICY__ON_LOOKUP_FAILURE",
            "panic",
            "config key `policy.on_lookup_failure`: \"panic\" is not allow, deny or gate",
        ),
    ] {
        let err = Config::load(None, env(&[(var, value)]))
            .unwrap_err()
            .to_string();
        assert!(err.ends_with(want), "{err}");
    }
    // Trimmed, in the file as in the environment; empty: every effect.
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "log_format = \" json \"\n[tolerations]\neffect = \"\"\noperator = \"Exists\"\n",
    );
    let c = Config::load(Some(&path), env(&[])).unwrap();
    assert_eq!(c.log_format, LogFormat::Json);
    assert_eq!(c.policy.toleration.effect, "");
    assert_eq!(c.policy.toleration.operator, TolerationOperator::Exists);
}

#[test]
fn registry_mirrors_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "[registry_mirrors]\n\"docker.io\" = \"mirror.gcr.io\"\n\"ghcr.io\" = \"ghcr.example\"\n",
    );
    let c = Config::load(
        Some(&path),
        env(&[(
            "TOLERABLE_REGISTRY__MIRRORS",
            " docker.io = mirror.example:5000, Quay.IO=quay-mirror.example ,",
        )]),
    )
    .unwrap();
    // The variable replaces the file's table, as a list variable replaces a list.
    assert_eq!(
        c.resolver.mirrors,
        BTreeMap::from(
            [
                ("docker.io", "mirror.example:5000"),
                ("quay.io", "quay-mirror.example")
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        )
    );
    for bad in ["docker.io", "=mirror.example", "docker.io=mirror, quay.io"] {
        let err = Config::load(None, env(&[("TOLERABLE_REGISTRY__MIRRORS", bad)]))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("environment variable TOLERABLE_REGISTRY__MIRRORS: ")
                && err.contains("is not name=value")
                && err.ends_with("for key `registry.mirrors`"),
            "{bad}: {err}"
        );
    }
}

/// A value for each deprecated flat key, valid for it, as a variable and as TOML.
fn flat_value(old: &str) -> (&'static str, &'static str) {
    match old {
        "listen_addr" => ("127.0.0.1:9443", "\"127.0.0.1:9443\""),
        "metrics_addr" => ("127.0.0.1:9090", "\"127.0.0.1:9090\""),
        "ssl_cert_path" | "ssl_key_path" | "registry_credential_path" | "docker_config_path" => {
            ("/", "\"/\"")
        }
        "credential_provider_bin_dir" => ("/", "\"/\""),
        "tls_reload_name_check" => ("warn", "\"warn\""),
        "log_level" => ("debug", "\"debug\""),
        "log_format" => ("json", "\"json\""),
        "supported_architectures" | "preferred_architecture" => ("arm64", "\"arm64\""),
        "default_architectures" => ("amd64", "[\"amd64\"]"),
        "skip_namespaces" => ("kube-system", "[\"kube-system\"]"),
        "match_node_labels" => ("team", "[\"team\"]"),
        "steering" => ("off", "\"off\""),
        "on_no_common_architecture" => ("warn", "\"warn\""),
        "on_lookup_failure" => ("deny", "\"deny\""),
        "enforce" | "watch_nodes" | "manage_node_taints" | "read_pull_secrets" => {
            ("false", "false")
        }
        "insecure_registries" | "registry_allowlist" => ("localhost:5000", "[\"localhost:5000\"]"),
        "registry_denylist" => ("10.9.0.0/16", "[\"10.9.0.0/16\"]"),
        "registry_mirrors" => (
            "docker.io=mirror.example",
            "{ \"docker.io\" = \"mirror.example\" }",
        ),
        "cache_url" => ("redis://127.0.0.1:6379/0", "\"redis://127.0.0.1:6379/0\""),
        "lookup_timeout" | "registry_connect_timeout" | "request_read_timeout" => ("3s", "\"3s\""),
        "connection_idle_timeout"
        | "cache_tag_ttl"
        | "cache_digest_ttl"
        | "cache_failure_ttl"
        | "cache_stale_if_error"
        | "circuit_breaker_cooldown" => ("7m", "\"7m\""),
        _ => ("7", "7"),
    }
}

/// Keys that are checked against other keys or files when set alone; the mapping is what is
/// tested, not those checks, so these are read but not validated on their own.
const CHECKED_WITH_OTHERS: &[&str] = &[
    "ssl_cert_path",
    "ssl_key_path",
    "credential_provider_config",
    "cache_password_file",
    "cache_password",
    "cache_ca_path",
    "registry_ca_path",
];

#[test]
fn every_deprecated_key_maps_to_its_key_in_a_section() {
    let known = known_keys();
    let mut flat_seen = BTreeSet::new();
    for (old, section, key) in deprecated::FLAT_KEYS {
        let new = format!("{section}.{key}");
        assert!(known.contains(&new), "{old} → {new}, which is no key");
        assert!(flat_seen.insert(*old), "{old} listed twice");
        assert!(!known.iter().any(|k| k == old), "{old} is a key itself");
        if CHECKED_WITH_OTHERS.contains(old) {
            continue;
        }
        let (value, toml_value) = flat_value(old);
        // As a variable: the same settings as the sectioned variable, with one warning.
        let old_var = format!("TOLERABLE_{}", old.to_ascii_uppercase());
        let new_var = format!(
            "TOLERABLE_{}__{}",
            section.to_ascii_uppercase(),
            key.to_ascii_uppercase()
        );
        let flat = Config::load(None, env(&[(&old_var, value)]))
            .unwrap_or_else(|e| panic!("{old_var}={value}: {e}"));
        let sectioned = Config::load(None, env(&[(&new_var, value)])).unwrap();
        assert_eq!(flat.deprecations.len(), 1, "{old_var}");
        assert!(sectioned.deprecations.is_empty(), "{new_var}");
        assert_eq!(
            format!(
                "{:?}",
                Config {
                    deprecations: Vec::new(),
                    ..flat
                }
            ),
            format!("{sectioned:?}"),
            "{old_var} and {new_var} differ"
        );
        // In the file: the same, with one warning.
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, &format!("{old} = {toml_value}\n"));
        let flat = Config::load(Some(&path), env(&[])).unwrap();
        let path = write(&dir, &format!("[{section}]\n{key} = {toml_value}\n"));
        let sectioned = Config::load(Some(&path), env(&[])).unwrap();
        assert_eq!(flat.deprecations.len(), 1, "{old}");
        assert_eq!(
            format!(
                "{:?}",
                Config {
                    deprecations: Vec::new(),
                    ..flat
                }
            ),
            format!("{sectioned:?}"),
            "{old} and [{section}] {key} differ"
        );
    }
}

#[test]
fn deprecation_warnings_name_the_new_key_where_the_old_one_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "cache_stale_if_error = \"30m\"\n[cache]\ntag_ttl = \"1m\"\n",
    );
    let c = Config::load(
        Some(&path),
        env(&[("TOLERABLE_CACHE_URL", "redis://127.0.0.1:6379/0")]),
    )
    .unwrap();
    assert_eq!(c.resolver.cache.stale_ttl, Duration::from_secs(1800));
    assert_eq!(c.resolver.cache.tag_ttl, Duration::from_secs(60));
    assert!(c.resolver.shared_cache.is_some());
    assert_eq!(
        c.deprecations,
        [
            format!(
                "config file {}: `cache_stale_if_error` is deprecated: use `[cache] stale_if_error`",
                path.display()
            ),
            "environment variable TOLERABLE_CACHE_URL: `cache_url` is deprecated: use \
             TOLERABLE_SHARED_CACHE__URL (`[shared_cache] url`)"
                .to_owned(),
        ]
    );
    // A bad value under a deprecated name: the new key, and the name written.
    let err = Config::load(None, env(&[("TOLERABLE_CACHE_TAG_TTL", "soon")]))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(
            "environment variable TOLERABLE_CACHE_TAG_TTL: config key `cache.tag_ttl`: "
        ),
        "{err}"
    );
}

#[test]
fn a_key_written_both_ways_in_one_place_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "cache_tag_ttl = \"1m\"\n[cache]\ntag_ttl = \"2m\"\n");
    let err = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "config file {}: `cache_tag_ttl` and `[cache] tag_ttl` set the same key: remove the deprecated `cache_tag_ttl`",
            path.display()
        )
    );
    let err = Config::load(
        None,
        env(&[
            ("TOLERABLE_CACHE_TAG_TTL", "1m"),
            ("TOLERABLE_CACHE__TAG_TTL", "2m"),
        ]),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "environment: TOLERABLE_CACHE_TAG_TTL and TOLERABLE_CACHE__TAG_TTL (`[cache] tag_ttl`) \
         set the same key: remove the deprecated TOLERABLE_CACHE_TAG_TTL"
    );
    // A variable of either form overrides the file's key of either form.
    let path = write(&dir, "[cache]\ntag_ttl = \"2m\"\n");
    let c = Config::load(Some(&path), env(&[("TOLERABLE_CACHE_TAG_TTL", "3m")])).unwrap();
    assert_eq!(c.resolver.cache.tag_ttl, Duration::from_secs(180));
    let path = write(&dir, "cache_tag_ttl = \"2m\"\n");
    let c = Config::load(Some(&path), env(&[("TOLERABLE_CACHE__TAG_TTL", "4m")])).unwrap();
    assert_eq!(c.resolver.cache.tag_ttl, Duration::from_secs(240));
}

#[test]
fn match_node_labels_are_label_keys_in_the_order_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "[policy]\nmatch_node_labels = [\"team\", \"topology.kubernetes.io/region\"]\n",
    );
    let c = Config::load(Some(&path), env(&[])).unwrap();
    assert_eq!(
        c.policy.match_node_labels,
        vec![
            "team".to_owned(),
            "topology.kubernetes.io/region".to_owned()
        ]
    );
    let c = Config::load(
        None,
        env(&[(
            "TOLERABLE_POLICY__MATCH_NODE_LABELS",
            "example.com/pool, team",
        )]),
    )
    .unwrap();
    assert_eq!(c.policy.match_node_labels, vec!["example.com/pool", "team"]);
    assert!(Config::load(None, env(&[]))
        .unwrap()
        .policy
        .match_node_labels
        .is_empty());
    for bad in [
        "team name",
        "-team",
        "team-",
        "Example.com/team",
        "/team",
        "example.com/",
        "a/b/c",
        "team,team",
        &"x".repeat(64),
    ] {
        let err = Config::load(None, env(&[("TOLERABLE_POLICY__MATCH_NODE_LABELS", bad)]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("policy.match_node_labels")
                && (err.contains("is not a label key") || err.contains("named twice")),
            "{bad}: {err}"
        );
    }
}

#[test]
fn gate_policy_its_timeout_and_the_own_namespace() {
    let c = Config::load(None, env(&[])).unwrap();
    assert_eq!(c.gate_timeout, Duration::from_secs(120), "2m by default");
    assert_eq!(c.policy.own_namespace, None);
    let c = Config::load(
        None,
        env(&[
            ("TOLERABLE_POLICY__ON_LOOKUP_FAILURE", "gate"),
            ("TOLERABLE_POLICY__GATE_TIMEOUT", "90s"),
            ("POD_NAMESPACE", "tolerable-system"),
        ]),
    )
    .unwrap();
    assert_eq!(c.policy.on_lookup_failure, OnLookupFailure::Gate);
    assert_eq!(c.gate_timeout, Duration::from_secs(90));
    assert_eq!(c.policy.own_namespace.as_deref(), Some("tolerable-system"));
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "[policy]\non_lookup_failure = \"gate\"\ngate_timeout = \"5m\"\n",
    );
    let c = Config::load(Some(&path), env(&[])).unwrap();
    assert_eq!(c.gate_timeout, Duration::from_secs(300));
    for (value, reason) in [
        ("0s", "must be more than 0"),
        ("25h", "at most 24h"),
        ("soon", "policy.gate_timeout"),
    ] {
        let err = Config::load(None, env(&[("TOLERABLE_POLICY__GATE_TIMEOUT", value)]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("policy.gate_timeout"), "{err}");
        assert!(err.contains(reason), "{value}: {err}");
        assert!(err.contains("TOLERABLE_POLICY__GATE_TIMEOUT"), "{err}");
    }
}

#[test]
fn workloads_pod_specs_add_rows_and_a_bad_row_stops_start_up_naming_it() {
    let c = Config::load(
        None,
        env(&[(
            "TOLERABLE_WORKLOADS__POD_SPECS",
            "Runner.ci.example.com=spec.pool.pod, Trainer.ml.example.com=spec.roles[].template",
        )]),
    )
    .unwrap();
    assert_eq!(c.kinds.rows("Runner", Some("ci.example.com/v1")).len(), 1);
    assert_eq!(c.kinds.rows("Deployment", Some("apps/v1")).len(), 1);
    let err = Config::load(
        None,
        env(&[("TOLERABLE_WORKLOADS__POD_SPECS", "Runner=spec.pool[")]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("TOLERABLE_WORKLOADS__POD_SPECS")
            && err.contains("workloads.pod_specs")
            && err.contains("without `]`"),
        "{err}"
    );
}

/// The reference (`tolerable reference`) describes every key tolerable reads, in its section,
/// once, and no other: a key added to a section's struct fails here until its `KeyDoc` is
/// written, and the generated files then follow.
#[test]
fn every_key_is_described_once_in_its_section() {
    let described: Vec<String> = super::reference::SECTION_DOCS
        .iter()
        .flat_map(|s| s.keys.iter().map(move |k| format!("{}.{}", s.name, k.key)))
        .collect();
    let unique: BTreeSet<&String> = described.iter().collect();
    assert_eq!(unique.len(), described.len(), "a key described twice");
    let known = known_keys();
    assert_eq!(
        unique,
        known.iter().collect::<BTreeSet<_>>(),
        "the described keys are not the sections' keys"
    );
    let sections: Vec<&str> = super::reference::SECTION_DOCS
        .iter()
        .map(|s| s.name)
        .collect();
    let read: Vec<&str> = super::SECTIONS.iter().map(|(name, _)| *name).collect();
    assert_eq!(sections, read, "the sections, in tolerable.toml's order");
}

/// The deployed file is the shipped one with the keys marked `deployed` set (the paths where
/// the Pod mounts its files, /metrics on its own port) and nothing else; the shipped one loads
/// as the defaults.
#[test]
fn the_deployed_file_is_the_shipped_one_with_the_mounted_paths() {
    use super::reference::{config_toml, Profile};
    let dir = tempfile::tempdir().unwrap();
    let shipped_file = write(&dir, &config_toml(Profile::Shipped));
    let loaded = Config::load(Some(&shipped_file), env(&[])).unwrap();
    let defaults = Config::load(None, env(&[])).unwrap();
    assert_eq!(format!("{loaded:?}"), format!("{defaults:?}"));
    let shipped: toml::Table = config_toml(Profile::Shipped).parse().unwrap();
    let mut deployed: toml::Table = config_toml(Profile::Deployed).parse().unwrap();
    for (section, key, value) in [
        ("tls", "cert_path", "/etc/tolerable/tls/tls.crt"),
        ("tls", "key_path", "/etc/tolerable/tls/tls.key"),
        ("credentials", "files_path", "/etc/tolerable/creds"),
        ("server", "metrics_addr", "0.0.0.0:9090"),
    ] {
        let table = deployed[section].as_table_mut().unwrap();
        assert_eq!(
            table
                .remove(key)
                .and_then(|v| v.as_str().map(str::to_owned))
                .as_deref(),
            Some(value),
            "[{section}] {key}"
        );
    }
    assert_eq!(deployed, shipped);
}
