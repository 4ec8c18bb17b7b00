#!/usr/bin/env bash
# Installs what the test suite needs and a fresh machine lacks:
# - Debian's docker-registry (the CNCF distribution server the registry tests start on 127.0.0.1)
# - htpasswd (apache2-utils, for the Basic-auth registry)
# - kubectl (renders kustomize/; Debian's package is kubernetes-client)
# - redis-server (the shared-cache tests start one on 127.0.0.1)
# - kubernetes-validate and cloudcoil-models-cert-manager from PyPI (offline manifest validation)
# Does nothing for what is already there.
set -euo pipefail
missing=()
command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
command -v htpasswd >/dev/null 2>&1 || missing+=(apache2-utils)
command -v kubectl >/dev/null 2>&1 || missing+=(kubernetes-client)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing ${missing[*]} (apt)" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
python=()
command -v kubernetes-validate >/dev/null 2>&1 || python+=(kubernetes-validate)
python3 -c 'import cloudcoil.models.cert_manager, yaml' >/dev/null 2>&1 || python+=(cloudcoil-models-cert-manager pyyaml)
if [ ${#python[@]} -gt 0 ]; then
  echo "installing ${python[*]} (pip)" >&2
  python3 -m pip install -q --disable-pip-version-check "${python[@]}"
fi
