//! The tests run where nothing but loopback exists and no file of the user's is read:
//! `make test` (and `make bench`) run them through scripts/loopback-only.sh, a network namespace
//! with only `lo` up and an empty HOME. These tests fail when that is not so, naming the way to
//! run them, so a test that looked up a public name would fail at once rather than reach it.

use std::path::Path;

const HOW: &str = "run the tests through scripts/loopback-only.sh \
    (`make unit`, or `scripts/loopback-only.sh cargo test --frozen ...`)";

/// The network interfaces this process sees (its network namespace's, from /proc/net/dev).
fn interfaces() -> Vec<String> {
    let dev = std::fs::read_to_string("/proc/net/dev").unwrap();
    dev.lines()
        .skip(2)
        .filter_map(|line| line.split(':').next())
        .map(|name| name.trim().to_owned())
        .collect()
}

#[test]
fn the_tests_see_only_the_loopback_interface() {
    assert_eq!(interfaces(), ["lo"], "{HOW}");
}

#[test]
fn no_name_but_the_machine_s_own_resolves() {
    // Asked only where loopback is all there is: elsewhere the question itself would leave
    // the machine.
    assert_eq!(interfaces(), ["lo"], "{HOW}");
    use std::net::ToSocketAddrs;
    for name in [
        "registry-1.docker.io:443",
        "ghcr.io:443",
        "kubernetes.default.svc:443",
    ] {
        let resolved = name.to_socket_addrs().map(|a| a.collect::<Vec<_>>());
        assert!(resolved.is_err(), "{name} resolved to {resolved:?}");
    }
    let local: Vec<_> = "127.0.0.1:1".to_socket_addrs().unwrap().collect();
    assert_eq!(local.len(), 1);
}

#[test]
fn the_tests_read_no_kubeconfig_or_docker_config_of_the_user() {
    let home = std::env::var_os("HOME").expect("HOME");
    let home = Path::new(&home);
    for file in [".kube/config", ".docker/config.json"] {
        assert!(
            !home.join(file).exists(),
            "{} exists: {HOW}",
            home.join(file).display()
        );
    }
    for var in ["KUBECONFIG", "DOCKER_CONFIG", "KUBERNETES_SERVICE_HOST"] {
        assert!(std::env::var_os(var).is_none(), "${var} is set: {HOW}");
    }
}
