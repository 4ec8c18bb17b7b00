#!/usr/bin/env bash
# Installs what the test suite needs and a fresh machine lacks: Debian's docker-registry (the CNCF
# distribution server the registry tests start on 127.0.0.1) and htpasswd (apache2-utils, for the
# Basic-auth registry). Does nothing when they are already there.
set -euo pipefail
missing=()
command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
command -v htpasswd >/dev/null 2>&1 || missing+=(apache2-utils)
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "installing ${missing[*]} (apt)" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
