# pgwake. `make test` and `make demo` work on a fresh machine: with no
# TEST_DATABASE_URL / DATABASE_URL they start a throwaway PostgreSQL from the
# local server binaries (wal_level=logical) and remove it afterwards.

GO      ?= go
export PATH := $(PATH):/usr/local/go/bin
PKGS    ?= ./...
BIN     := bin/pgwake

.PHONY: all build test test-short bench demo lint fmt vet fuzz clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/pgwake

# Four packages and four parallel tests at a time (go test's defaults are
# the number of CPUs): the tests mostly wait on PostgreSQL, so on 2 cores
# the race run took 201 s at the defaults and 154 s so (2026-12-02).
# The second run: Watermill's reconnect test (the cluster restarted under a
# subscriber), whose own harness has a data race, so it runs without -race
# (events/pubsub/conformance_test.go).
TEST_PARALLEL ?= -p 4 -parallel 4
test:
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 $(TEST_PARALLEL) -timeout 20m $(PKGS)

test-short:
	$(GO) test -count=1 -short $(PKGS)

# bench: Go benchmarks, then `pgwake bench` (every mode, pgwake alone),
# then the same modes for pgwake, River and watermill-sql side by side in
# one run (bench/peers, its own module). About 8 minutes on 2 cores. See
# docs/benchmarks.md.
bench: build
	$(GO) test -run '^$$' -bench . -benchmem -count 3 ./queue/
	./$(BIN) bench
	cd bench/peers && $(GO) run . --modes drain,latency,idle,delayed,enqueue --svg ../../bin/benchmarks-latency.svg

demo: build
	./$(BIN) demo

lint: vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin

# Reliability suite at the issue's full sizes (20 SIGKILLs during 20,000
# jobs, ...); make test runs it at a reduced size. Figures: docs/reliability.md.
.PHONY: reliability soak
reliability:
	@mkdir -p bin
	PGWAKE_RELIABILITY_FULL=1 $(GO) test -race -count=1 -v -timeout 60m ./internal/reliability/ > bin/reliability.log 2>&1; \
	status=$$?; grep -E 'RESULT|invariant|^--- |^(ok|FAIL)' bin/reliability.log; exit $$status

# An hour of steady load with heap, RSS and goroutines sampled each minute
# (PGWAKE_SOAK_DURATION, PGWAKE_SOAK_SAMPLE, PGWAKE_SOAK_RATE override).
soak:
	$(GO) test -tags soak -count=1 -v -timeout 3h -run TestSoak ./internal/reliability/
