#!/usr/bin/env bash
# Builds the tolerable binary for one Linux architecture: what the Dockerfile runs, and what the
# test suite runs (for the machine's own architecture) so the recipe is exercised without Docker.
#
#   scripts/build-binary.sh ARCH OUTDIR          ARCH: amd64 | arm64 | ppc64le | s390x | native
#   scripts/build-binary.sh --print ARCH          the Rust target, C compiler and libc used
#   scripts/build-binary.sh --packages ARCH       the Debian packages the build machine needs for
#                                                 ARCH (BUILD_ARCH: the build machine's Debian
#                                                 architecture, default dpkg's)
#
# Cross-compiles rather than emulates, on an amd64 or an arm64 (or any Debian) build machine: a
# Rust target plus the target's GNU C compiler, `<triple>-gcc` (ring has C and assembly) — the
# machine's own gcc for its own architecture, Debian's gcc-<triple> cross compiler for the
# others, each with its C library headers. amd64, arm64 and ppc64le build static musl binaries
# (for a distroless "static" base; Rust's musl targets bring their own C library, the GNU
# compiler only compiles ring's C and drives the link); s390x has no prebuilt musl standard
# library, so it links glibc dynamically (for a distroless "cc" base). `native` builds for the
# machine itself, without a cross target. PROFILE=release (default) or dev.
set -euo pipefail

plan() {
  case $1 in
    amd64)   echo "x86_64-unknown-linux-musl x86_64-linux-gnu-gcc musl" ;;
    arm64)   echo "aarch64-unknown-linux-musl aarch64-linux-gnu-gcc musl" ;;
    ppc64le) echo "powerpc64le-unknown-linux-musl powerpc64le-linux-gnu-gcc musl" ;;
    s390x)   echo "s390x-unknown-linux-gnu s390x-linux-gnu-gcc gnu" ;;
    native)  echo "native cc native" ;;
    *) echo "unknown architecture: $1 (amd64, arm64, ppc64le, s390x or native)" >&2; return 2 ;;
  esac
}

# Debian's packages for building ARCH on a BUILD_ARCH machine.
packages() {
  local target cc libc deb host
  read -r target cc libc < <(plan "$1")
  [ "$target" != native ] || { echo "gcc libc6-dev"; return; }
  deb=$1
  [ "$deb" = ppc64le ] && deb=ppc64el # Debian's name
  host=${BUILD_ARCH:-$(dpkg --print-architecture)}
  if [ "$deb" = "$host" ]; then
    echo "gcc libc6-dev" # gcc provides <triple>-gcc for the machine's own triple
  else
    local triple=${cc%-gcc}
    echo "gcc-${triple//_/-} libc6-dev-${deb}-cross"
  fi
}

if [ "${1:-}" = "--packages" ]; then
  packages "${2:?architecture}"
  exit
fi
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
  # A CARGO_BUILD_TARGET in the environment moves the output (as --target does).
  built="target/${CARGO_BUILD_TARGET:+$CARGO_BUILD_TARGET/}$([ "$profile" = dev ] && echo debug || echo "$profile")/tolerable"
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
fi
# A shared CARGO_TARGET_DIR (developers' machines) moves the output.
if [ -n "${CARGO_TARGET_DIR:-}" ]; then built="${CARGO_TARGET_DIR}/${built#target/}"; fi

cargo "${args[@]}"
cp "$built" "$out/tolerable"
"$strip" "$out/tolerable"
echo "built $out/tolerable ($arch, $target, $libc): $(du -h "$out/tolerable" | cut -f1)"
