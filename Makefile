# One task runner. `make` lists the targets.
CARGO ?= cargo

.PHONY: help run install inspect generate test test-deps fmt lint unit bench bench-shipped fuzz soak
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

run: ## build release and run the webhook (tolerable serve; self-signed without certificates)
	$(CARGO) run --release --locked -- serve

install: ## install the tolerable binary into ~/.cargo/bin (cargo install), for `tolerable inspect`, `tolerable nodes …`
	$(CARGO) install --locked --path .

inspect: ## platforms of images (IMAGES="nginx ghcr.io/org/app:1")
	$(CARGO) run --release --locked -- inspect $(or $(IMAGES),nginx)

# The files printed from the code (tests/project/generated.rs fails until they are as printed),
# then kustomize/base and the components rendered from the chart, which those values feed
# (tests/project/kustomize.rs fails until they are as rendered; the Helm engine and pyyaml are
# the test tools' Python's: `make test-deps`).
PYTHON ?= $(if $(wildcard .test-tools/bin/python3),.test-tools/bin/python3,python3)
generate: ## rewrite the files generated from the code: the config reference, the chart's config values and schema, docs/cli.md's flags; then kustomize/ from the chart
	$(CARGO) build --locked --bin tolerable
	@for f in $$($(CARGO) run --quiet --locked -- reference --list); do \
	  $(CARGO) run --quiet --locked -- reference $$f > $$f.generated && mv $$f.generated $$f || { rm -f $$f.generated; exit 1; }; \
	done
	$(PYTHON) scripts/kustomize-from-chart.py generate

test: test-deps fmt lint unit ## everything CI runs: install test deps, fmt check, clippy, all tests

test-deps: ## install what the tests need when missing: apt packages; kubectl, promtool and the Python validators in .test-tools/
	./scripts/install-test-deps.sh

fmt: ## check formatting
	$(CARGO) fmt --all -- --check

lint: ## clippy, warnings are errors; and the binary alone (without test-only crate features)
	$(CARGO) clippy --all-targets --locked -- -D warnings
	$(CARGO) check --locked --bins

# The tests and benches run through scripts/loopback-only.sh: a network namespace with only
# loopback and an empty HOME, so none can reach another machine or read a user's files. The
# crates are fetched first (outside it); inside, cargo works offline (--frozen).
LOOPBACK_ONLY := ./scripts/loopback-only.sh

unit: ## every test (starts real registries on 127.0.0.1), where only loopback exists
	$(CARGO) fetch --locked
	$(LOOPBACK_ONLY) $(CARGO) test --frozen

bench: test-deps ## benchmarks: release build, real registry (and redis-server), `tolerable serve`; prints tables (results go in BENCHMARKS.md); loopback only
	$(CARGO) fetch --locked
	$(LOOPBACK_ONLY) $(CARGO) bench --frozen --bench lookup
	$(LOOPBACK_ONLY) $(CARGO) bench --frozen --bench webhook
	$(LOOPBACK_ONLY) $(CARGO) bench --frozen --bench cluster
	$(LOOPBACK_ONLY) $(CARGO) bench --frozen --bench nodes
	$(LOOPBACK_ONLY) $(CARGO) bench --frozen --bench audit
	$(LOOPBACK_ONLY) $(CARGO) bench --frozen --bench review
	$(LOOPBACK_ONLY) $(CARGO) bench --frozen --bench hostile_registry
	$(LOOPBACK_ONLY) $(CARGO) bench --frozen --bench real_path
	$(LOOPBACK_ONLY) $(CARGO) bench --frozen --bench crashes

# The benches run the build for this machine (glibc); the amd64 image ships a static musl binary
# with another allocator, so what it costs is measured by running the benches on that binary.
SHIPPED := $(CURDIR)/target/shipped/tolerable
bench-shipped: test-deps ## the real-path and webhook benches on the binary the amd64 image ships (static musl: needs `rustup target add x86_64-unknown-linux-musl`)
	scripts/build-binary.sh amd64 target/shipped
	$(CARGO) fetch --locked
	BENCH_SERVER_BINARY=$(SHIPPED) $(LOOPBACK_ONLY) $(CARGO) bench --frozen --bench real_path
	BENCH_SERVER_BINARY=$(SHIPPED) $(LOOPBACK_ONLY) $(CARGO) bench --frozen --bench webhook

SOAK_MINUTES ?= 10
SOAK_RATE ?= 2000
soak: test-deps ## soak: SOAK_MINUTES at SOAK_RATE admissions/s with registry restarts and 3 certificate rotations (not in CI)
	SOAK_MINUTES=$(SOAK_MINUTES) SOAK_RATE=$(SOAK_RATE) $(LOOPBACK_ONLY) $(CARGO) bench --frozen --bench soak

FUZZ_TARGETS := reference manifest token_response admission_review
FUZZ_SECONDS ?= 60
fuzz: ## run every cargo-fuzz target for FUZZ_SECONDS each (nightly + cargo-fuzz; new inputs go to fuzz/work/)
	@for t in $(FUZZ_TARGETS); do \
	  case $$t in reference) m=reference;; manifest) m="manifest tests/data/malformed/config-blob";; \
	    token_response) m=token;; admission_review) m="admission tests/data";; esac; \
	  seeds="fuzz/corpus/$$t"; for d in $$m; do case $$d in tests/*) seeds="$$seeds $$d";; *) seeds="$$seeds tests/data/malformed/$$d";; esac; done; \
	  mkdir -p fuzz/work/$$t && \
	  $(CARGO) +nightly fuzz run $$t fuzz/work/$$t $$seeds -- -max_total_time=$(FUZZ_SECONDS) -max_len=65536 || exit 1; \
	done
