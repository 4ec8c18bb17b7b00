#!/usr/bin/env bash
# Builds the tolerable binary for one Linux architecture: what the Dockerfile runs, and what the
# test suite runs (for the machine's own architecture) so the recipe is exercised without Docker.
#
#   scripts/build-binary.sh ARCH OUTDIR          ARCH: amd64 | arm64 | ppc64le | s390x | native
#   scripts/build-binary.sh --print ARCH          the Rust target, C compiler and libc used
#
# Cross-compiles rather than emulates: a Rust target plus the matching C cross compiler (ring
# has C and assembly). amd64, arm64 and ppc64le build static musl binaries (for a distroless
# "static" base); s390x has no prebuilt musl standard library, so it links glibc dynamically (for
# a distroless "cc" base). `native` builds for the machine itself, without a cross target.
# PROFILE=release (default) or dev.
set -euo pipefail

plan() {
  case $1 in
    amd64)   echo "x86_64-unknown-linux-musl musl-gcc musl" ;;
    arm64)   echo "aarch64-unknown-linux-musl aarch64-linux-gnu-gcc musl" ;;
    ppc64le) echo "powerpc64le-unknown-linux-musl powerpc64le-linux-gnu-gcc musl" ;;
    s390x)   echo "s390x-unknown-linux-gnu s390x-linux-gnu-gcc gnu" ;;
    native)  echo "native cc native" ;;
    *) echo "unknown architecture: $1 (amd64, arm64, ppc64le, s390x or native)" >&2; return 2 ;;
  esac
}

if [ "${1:-}" = "--print" ]; then
  plan "${2:?architecture}"
  exit
fi
arch=${1:?usage: build-binary.sh ARCH OUTDIR}
out=${2:?usage: build-binary.sh ARCH OUTDIR}
profile=${PROFILE:-release}
read -r target cc libc < <(plan "$arch")
cd "$(dirname "$0")/.."
mkdir -p "$out"

args=(build --locked --profile "$profile" --bin tolerable)
if [ "$target" = native ]; then
  built="target/$([ "$profile" = dev ] && echo debug || echo "$profile")/tolerable"
  strip=strip
else
  # Cargo reads CC_<target> for build scripts and CARGO_TARGET_<TARGET>_LINKER for linking.
  upper=$(echo "$target" | tr 'a-z-' 'A-Z_')
  export "CC_${target//-/_}=$cc"
  export "CARGO_TARGET_${upper}_LINKER=$cc"
  # musl targets link statically by default; say so for clarity (and for the glibc one, not).
  if [ "$libc" = musl ]; then
    export "CARGO_TARGET_${upper}_RUSTFLAGS=-C target-feature=+crt-static"
  fi
  args+=(--target "$target")
  built="target/$target/$([ "$profile" = dev ] && echo debug || echo "$profile")/tolerable"
  strip="${cc%gcc}strip"
  [ "$cc" = musl-gcc ] && strip=strip
fi
# A shared CARGO_TARGET_DIR (developers' machines) moves the output.
if [ -n "${CARGO_TARGET_DIR:-}" ]; then built="${CARGO_TARGET_DIR}/${built#target/}"; fi

cargo "${args[@]}"
cp "$built" "$out/tolerable"
"$strip" "$out/tolerable"
echo "built $out/tolerable ($arch, $target, $libc): $(du -h "$out/tolerable" | cut -f1)"
