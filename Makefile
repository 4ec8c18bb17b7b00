# One task runner. `make` lists the targets.
CARGO ?= cargo

.PHONY: help run inspect test test-deps fmt lint unit bench
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

run: ## build release and run the webhook (tolerable serve; self-signed without certificates)
	$(CARGO) run --release --locked -- serve

inspect: ## platforms of images (IMAGES="nginx ghcr.io/org/app:1")
	$(CARGO) run --release --locked -- inspect $(or $(IMAGES),nginx)

test: test-deps fmt lint unit ## everything CI runs: install test deps, fmt check, clippy, all tests

test-deps: ## install the registry server and htpasswd when missing (apt)
	./scripts/install-test-deps.sh

fmt: ## check formatting
	$(CARGO) fmt --all -- --check

lint: ## clippy, warnings are errors; and the binary alone (without test-only crate features)
	$(CARGO) clippy --all-targets --locked -- -D warnings
	$(CARGO) check --locked --bins

unit: ## every test (starts real registries on 127.0.0.1)
	$(CARGO) test --locked

bench: test-deps ## benchmarks (results go in BENCHMARKS.md)
	$(CARGO) bench --locked --bench lookup
	$(CARGO) bench --locked --bench webhook
