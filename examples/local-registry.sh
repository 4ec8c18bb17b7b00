#!/usr/bin/env bash
# A registry on this machine holding the images examples/local.yaml names, so that
# `tolerable review` and `tolerable inspect` can be tried with no network at all (README,
# "Two commands"). Run it in another terminal; Enter (or Ctrl-D, Ctrl-C) stops it and its
# registry, which keeps its images in memory only.
#
#   examples/local-registry.sh [PORT]     # PORT defaults to 5000; listens on 127.0.0.1 only
#
# Needs Debian's `docker-registry` (`sudo apt-get install docker-registry`, the registry the
# tests start), `curl` and `sha256sum`. The images are built here from a few bytes of JSON
# (each layer is an empty tar), so their digests are the same on every machine; they run
# nothing: tolerable reads manifests and configs, never layers.
set -euo pipefail

port=${1:-5000}
host="127.0.0.1:$port"
base="http://$host/v2"

registry=$(command -v docker-registry || true)
if [ -z "$registry" ]; then
  echo "docker-registry not found: sudo apt-get install docker-registry" >&2
  exit 1
fi

# The registry is on loopback: never through a proxy named in http_proxy and the like.
curl() { command curl --noproxy '*' "$@"; }

dir=$(mktemp -d)
pid=
stop() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$dir"
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Never the Debian package's /etc/docker/registry/config.yml: it listens on every interface.
cat >"$dir/config.yml" <<EOF
version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  inmemory: {}
http:
  addr: $host
EOF
# Something already answering there (an earlier run, another registry) would take the pushes.
if curl -s -o /dev/null "http://$host/"; then
  echo "docker-registry did not start on $host: the port is taken; try another PORT" >&2
  exit 1
fi
"$registry" serve "$dir/config.yml" >"$dir/registry.log" 2>&1 &
pid=$!
ready=
for _ in $(seq 100); do
  curl -fsS -o /dev/null "$base/" 2>/dev/null && ready=1 && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$ready" ]; then
  echo "docker-registry did not start on $host (port taken? try another PORT):" >&2
  cat "$dir/registry.log" >&2
  exit 1
fi

digest() { echo "sha256:$(sha256sum "$1" | cut -d' ' -f1)"; }
size() { wc -c <"$1" | tr -d ' '; }

# blob REPO FILE: upload FILE as a blob of REPO (a POST for the upload's address, then a PUT).
blob() {
  local location
  location=$(curl -fsS -X POST -D - -o /dev/null "$base/$1/blobs/uploads/" |
    tr -d '\r' | sed -n 's/^[Ll]ocation: //p')
  case $location in /*) location="http://$host$location" ;; esac
  case $location in *\?*) location="$location&" ;; *) location="$location?" ;; esac
  curl -fsS -X PUT -o /dev/null -H 'Content-Type: application/octet-stream' \
    --data-binary "@$2" "${location}digest=$(digest "$2")"
}

# manifest REPO REFERENCE MEDIA_TYPE FILE
manifest() {
  curl -fsS -X PUT -o /dev/null -H "Content-Type: $3" --data-binary "@$4" \
    "$base/$1/manifests/$2"
}

oci=application/vnd.oci.image
head -c 1024 /dev/zero >"$dir/layer" # an empty tar: two zero blocks
layer="{\"mediaType\":\"$oci.layer.v1.tar\",\"digest\":\"$(digest "$dir/layer")\",\"size\":1024}"

# image REPO ARCH [VARIANT]: push a one-platform OCI image by digest; prints its descriptor.
image() {
  local repo=$1 arch=$2 variant=${3:-} platform config
  platform="\"architecture\":\"$arch\",\"os\":\"linux\""
  [ -n "$variant" ] && platform="$platform,\"variant\":\"$variant\""
  config="$dir/config-$arch"
  printf '{%s,"rootfs":{"type":"layers","diff_ids":["%s"]},"config":{}}' \
    "$platform" "$(digest "$dir/layer")" >"$config"
  blob "$repo" "$dir/layer"
  blob "$repo" "$config"
  printf '{"schemaVersion":2,"mediaType":"%s","config":{"mediaType":"%s","digest":"%s","size":%s},"layers":[%s]}' \
    "$oci.manifest.v1+json" "$oci.config.v1+json" "$(digest "$config")" "$(size "$config")" \
    "$layer" >"$dir/manifest"
  manifest "$repo" "$(digest "$dir/manifest")" "$oci.manifest.v1+json" "$dir/manifest"
  printf '{"mediaType":"%s","digest":"%s","size":%s,"platform":{%s}}' \
    "$oci.manifest.v1+json" "$(digest "$dir/manifest")" "$(size "$dir/manifest")" "$platform"
}

# multiarch REPO:TAG ARCH[/VARIANT]...: one image per platform and an OCI index over them.
multiarch() {
  local repo=${1%:*} tag=${1#*:} entries="" entry
  shift
  for platform in "$@"; do
    entry=$(image "$repo" "${platform%%/*}" "$(echo "$platform/" | cut -d/ -f2)")
    entries="${entries:+$entries,}$entry"
  done
  printf '{"schemaVersion":2,"mediaType":"%s","manifests":[%s]}' \
    "$oci.index.v1+json" "$entries" >"$dir/index"
  manifest "$repo" "$tag" "$oci.index.v1+json" "$dir/index"
}

# single REPO:TAG ARCH: a one-platform image, no index (what a plain `docker build` pushes).
single() {
  image "${1%:*}" "$2" >/dev/null
  manifest "${1%:*}" "${1#*:}" "$oci.manifest.v1+json" "$dir/manifest"
}

multiarch examples/web:1.0 amd64 arm64/v8
multiarch examples/sidecar:1.0 amd64 arm64/v8 s390x
single examples/legacy:1.0 amd64

echo "registry on $host (in memory, loopback only):"
echo "  $host/examples/web:1.0      linux/amd64, linux/arm64/v8"
echo "  $host/examples/sidecar:1.0  linux/amd64, linux/arm64/v8, linux/s390x"
echo "  $host/examples/legacy:1.0   linux/amd64"
echo "Enter (or Ctrl-D, Ctrl-C) stops it."
read -r _ || true
