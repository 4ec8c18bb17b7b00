# syntax=docker/dockerfile:1
# Multi-architecture image: docker buildx build --platform linux/amd64,linux/arm64,linux/s390x,linux/ppc64le .
# The build stage runs on the builder's own platform (amd64 or arm64) and cross-compiles (no
# emulation); the steps are in scripts/build-binary.sh, which the test suite also runs.

FROM --platform=$BUILDPLATFORM docker.io/library/rust:1.95-bookworm AS build
ARG TARGETARCH
WORKDIR /src
COPY scripts/build-binary.sh scripts/build-binary.sh
# The target's C compiler and headers: the machine's own gcc for its own architecture, Debian's
# cross compiler for another (so amd64 and arm64 build machines both work).
RUN apt-get update \
 && apt-get install -y --no-install-recommends binutils $(scripts/build-binary.sh --packages "$TARGETARCH") \
 && rm -rf /var/lib/apt/lists/*
RUN rustup target add "$(scripts/build-binary.sh --print "$TARGETARCH" | cut -d' ' -f1)"
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,id=target-$TARGETARCH \
    scripts/build-binary.sh "$TARGETARCH" /out

# Static binaries run on distroless "static"; s390x links glibc and needs "cc".
FROM gcr.io/distroless/static-debian12:nonroot AS runtime-amd64
FROM gcr.io/distroless/static-debian12:nonroot AS runtime-arm64
FROM gcr.io/distroless/static-debian12:nonroot AS runtime-ppc64le
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime-s390x

FROM runtime-$TARGETARCH
COPY --from=build /out/tolerable /usr/local/bin/tolerable
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["/usr/local/bin/tolerable"]
CMD ["serve"]
