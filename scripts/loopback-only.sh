#!/bin/sh
# Runs a command — the tests, the benches — where nothing but loopback exists and no file of
# the user's is read, so no test can reach another machine or a developer's cluster, by
# construction rather than by care:
# - a network namespace of its own with only `lo` up (127.0.0.0/8 and ::1): a lookup of any other
#   name or address fails at once (no resolver is reachable, no route exists);
# - an empty HOME (no ~/.kube/config, ~/.docker/config.json) and no $KUBECONFIG, $DOCKER_CONFIG,
#   XDG directories or in-cluster variables, for the tests and every process they start.
# Cargo and rustup keep their own homes. Needs a machine that can create a network namespace
# (root, or unprivileged user namespaces); says so and fails where it cannot.
#   scripts/loopback-only.sh cargo test --frozen --test NAME
set -eu
if [ "${LOOPBACK_ONLY_NAMESPACE:-}" = "1" ]; then
  exec "$@"
fi
CARGO_HOME=${CARGO_HOME:-$HOME/.cargo}
RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup}
export CARGO_HOME RUSTUP_HOME
PATH=$PATH:/usr/sbin:/sbin
if [ "$(id -u)" = 0 ]; then
  unshare="unshare --net"
else
  unshare="unshare --map-root-user --net"
fi
if ! $unshare true 2>/dev/null; then
  echo "scripts/loopback-only.sh: this machine cannot create a network namespace" \
    "(\`$unshare\` failed: run as root, or enable unprivileged user namespaces)." \
    "The tests run only where nothing but loopback can be reached." >&2
  exit 1
fi
command -v ip >/dev/null 2>&1 || {
  echo "scripts/loopback-only.sh: \`ip\` (iproute2) is needed to bring loopback up" \
    "(scripts/install-test-deps.sh installs it)" >&2
  exit 1
}
home=$(mktemp -d "${TMPDIR:-/tmp}/tolerable-test-home.XXXXXX")
trap 'rm -rf "$home"' EXIT INT TERM
status=0
$unshare -- env -u KUBECONFIG -u DOCKER_CONFIG -u KUBERNETES_SERVICE_HOST \
  -u KUBERNETES_SERVICE_PORT -u XDG_CONFIG_HOME -u XDG_CACHE_HOME -u XDG_DATA_HOME \
  -u XDG_RUNTIME_DIR HOME="$home" LOOPBACK_ONLY_NAMESPACE=1 \
  sh -c 'ip link set lo up && exec "$@"' sh "$@" || status=$?
exit $status
