# walden build, test and tooling. Every tool the targets need is pinned in
# tools/go.mod and built from the Go module proxy into bin/tools.

GO        ?= go
BIN       := bin
TOOLS     := $(BIN)/tools
PKGS      := ./...
# Packages with goroutines of their own: run under the race detector.
RACE_PKGS ?= ./raftnode/... ./raftlog/... ./server/... ./wal/... ./gossip/... ./agent/... ./detect/... ./lease/... ./objstore/... ./fencing/... ./fsm/... ./broker/... ./recovery/... ./loadgen/... ./coordclient/... ./chaos/history/... ./chaos/netfault/... ./authz/... ./httplimit/... ./connlimit/... ./mtls/... ./automq/controller/... ./automq/devcontroller/... ./automq/failover/...
# How long fuzz-short fuzzes each target (scripts/fuzz.sh: a failure that is
# only the fuzzing engine's own deadline, with no input written, runs once
# more).
FUZZTIME  ?= 10s
# How long fuzz-short minimizes each input that finds new coverage. Go's
# default (60s) outlasts FUZZTIME: the workers stop exploring to minimize the
# first new input (quadratic in its length), the run ends before the
# minimization does, the input is never kept, and the next run finds and
# minimizes it again.
FUZZMINIMIZETIME ?= 1s
# The version and commit stamped into the binaries (walden version,
# waldenctl version, walden_build_info). Without git they stay empty and
# the binaries report what the Go toolchain recorded.
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null)
COMMIT    ?= $(shell git rev-parse HEAD 2>/dev/null)$(shell git diff --quiet HEAD -- 2>/dev/null || echo -dirty)
LDFLAGS   := -X walden/version.version=$(VERSION) -X walden/version.commit=$(COMMIT)

.PHONY: all deps build docs tools proto proto-check lint vet fmt-check cyclo test test-unit test-race test-alerts fuzz-short bench run e2e chaos simulate clean

all: build

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/walden ./cmd/walden
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/waldenctl ./cmd/waldenctl

tools: $(TOOLS)/buf $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc $(TOOLS)/gocyclo

$(TOOLS)/buf $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc: tools/go.mod tools/go.sum
	cd tools && $(GO) build -o ../$(TOOLS)/ \
		github.com/bufbuild/buf/cmd/buf \
		google.golang.org/protobuf/cmd/protoc-gen-go \
		google.golang.org/grpc/cmd/protoc-gen-go-grpc

$(TOOLS)/gocyclo: tools/go.mod tools/go.sum
	cd tools && $(GO) build -o ../$(TOOLS)/ github.com/fzipp/gocyclo/cmd/gocyclo

# proto regenerates the Go code committed beside proto/walden/v1/*.proto.
proto: tools
	$(TOOLS)/buf lint
	$(TOOLS)/buf generate

# proto-check fails when the committed generated code differs from what
# `make proto` produces.
proto-check: proto
	@if [ -n "$$(git status --porcelain -- proto)" ]; then \
		echo "generated protobuf code is out of date; run 'make proto' and commit:"; \
		git status --porcelain -- proto; git diff --stat -- proto; exit 1; fi

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

# cyclo fails when a function of the core packages (the state machine, the
# decision and observation, the leases, the recovery, a restored cluster's
# reconciliation, AutoMQ's failover) has a cyclomatic complexity above
# CYCLO_OVER: each should read as a short sequence of named steps. Tests are
# not counted.
CYCLO_PKGS ?= fsm detect lease recovery reconcile automq/failover
CYCLO_OVER ?= 20
cyclo: $(TOOLS)/gocyclo
	@out=$$($(TOOLS)/gocyclo -over $(CYCLO_OVER) -ignore '_test\.go$$' $(CYCLO_PKGS)); \
	if [ -n "$$out" ]; then echo "functions above cyclomatic complexity $(CYCLO_OVER) (split them into named steps):"; echo "$$out"; exit 1; fi

lint: proto-check fmt-check vet cyclo

# A package's tests may take longer than go test's default 10 minutes on a
# loaded 2-core machine (the server package under the race detector takes 3
# on a quiet one): every package gets 30.
TEST_TIMEOUT ?= 30m

test-unit:
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)

test-race:
	$(GO) test -count=1 -race -timeout $(TEST_TIMEOUT) $(RACE_PKGS)

fuzz-short:
	GO=$(GO) scripts/fuzz.sh FuzzReader ./wal $(FUZZTIME) $(FUZZMINIMIZETIME)
	GO=$(GO) scripts/fuzz.sh FuzzReadAll ./objformat $(FUZZTIME) $(FUZZMINIMIZETIME)
	GO=$(GO) scripts/fuzz.sh FuzzReadObject ./automq/object $(FUZZTIME) $(FUZZMINIMIZETIME)
	GO=$(GO) scripts/fuzz.sh FuzzReadLog ./raftlog $(FUZZTIME) $(FUZZMINIMIZETIME)
	GO=$(GO) scripts/fuzz.sh FuzzReplayFrames ./raftlog $(FUZZTIME) $(FUZZMINIMIZETIME)
	GO=$(GO) scripts/fuzz.sh FuzzAPI ./server $(FUZZTIME) $(FUZZMINIMIZETIME)
	GO=$(GO) scripts/fuzz.sh FuzzDecodeFrames ./automq/protocol $(FUZZTIME) $(FUZZMINIMIZETIME)

# deps installs what the tests need beyond Go modules: the pinned versitygw
# S3 gateway (end-to-end tests) and the system packages of
# scripts/install-deps.sh (chromium for the web view's browser test;
# iproute2, nftables and iptables for the chaos harness).
deps: versitygw system-deps

# test is what CI runs (.ci/run): lint, every test, the race detector on the
# concurrent packages and short fuzz runs of the WAL, object (walden's and
# AutoMQ's) and raft log readers and of AutoMQ's controller frames.
test: deps lint build test-unit test-race test-alerts fuzz-short

# test-alerts checks the shipped Prometheus alert rules and runs their unit
# tests (promtool, from Debian's prometheus package: make deps).
test-alerts:
	promtool check rules deploy/prometheus/alerts.yml
	promtool test rules deploy/prometheus/alerts_test.yml

# bench prints every benchmark table of the README, each measured side by
# side with its baseline in the same run (about 10 minutes on 2 cores):
# the WAL against raw write+fdatasync and read; raft storage and a 3-member
# cluster; walden against embedded etcd; detection latency against
# memberlist alone, with a false-positive soak; recovery upload against the
# transfer manager direct; AutoMQ's failover of 1 GiB against the transfer
# manager direct; the failover end to end (64 MiB un-uploaded WAL).
bench: versitygw
	$(GO) test -run='^$$' -bench=. -benchtime=1x ./wal ./raftlog ./raftnode
	cd bench && $(GO) run ./raftcompare
	$(GO) test ./server -run='^$$' -bench=BenchmarkDetection -benchtime=1x -timeout=30m
	$(GO) test -run='^$$' -bench=BenchmarkRecovery -benchtime=1x ./recovery
	$(GO) test -run='^$$' -bench=BenchmarkAutoMQRecovery -benchtime=1x -timeout=60m ./automq/failover -args -automq.size=1073741824
	$(GO) test ./e2e -run='^$$' -bench=BenchmarkFailover -benchtime=1x -timeout=60m -e2e.backlog=67108864 -e2e.trials=5

run: build
	$(BIN)/walden dev

# simulate runs the deterministic simulation of leases and failover
# decisions (package sim, docs/safety.md): SIM_RUNS seeds of every fault
# profile, 10 simulated minutes each (about 15 minutes on 2 cores with the
# default 200). `make test` runs a few seeds of each as part of go test.
SIM_RUNS ?= 200
simulate:
	$(GO) test -count=1 -timeout 120m -v -run TestSimulate ./sim -sim.runs=$(SIM_RUNS)

# e2e runs every end-to-end scenario on real processes (walden and waldenctl
# built by the test, S3 served by versitygw): kill -9 a broker under load and
# restart it, a SIGSTOPped zombie broker, kill -9 the recovery's executor
# mid-upload, kill -9 the raft leader during a failover. `make test` runs the
# short form (TestE2EShort*, part of `go test ./...`).
e2e: build versitygw
	$(GO) test -count=1 -v -timeout 20m ./e2e -e2e.full

# chaos runs every chaos scenario (docs/chaos.md) on real processes in Linux
# network namespaces, as root: link cuts (nftables), loss and jitter (an
# NFQUEUE delayer), kill -9, SIGSTOP, S3 out of reach, a full disk; it prints
# one line per scenario (CHAOS_FLAGS="-o json" for scripts; -scenarios a,b
# for some; -list names them). Without root it says so and runs nothing.
# `make test` runs the short form (TestChaosShort).
CHAOS_FLAGS ?=
chaos: build versitygw
	$(GO) run ./chaos/cmd/walden-chaos -walden $(BIN)/walden -versitygw $(TOOLS)/versitygw $(CHAOS_FLAGS)

# docs writes the pages generated from the code: the configuration
# references (docs/server.md, docs/agent.md, docs/broker.md, from the config
# structs' doc comments and defaults) and the CLI reference (docs/waldenctl.md,
# from waldenctl's commands). The tests fail when a page differs from the
# code and say to run this.
docs:
	WALDEN_UPDATE_DOCS=1 $(GO) test -count=1 -run 'TestConfigReferencesUpToDate|TestCLIReferenceUpToDate' ./config ./cmd/waldenctl

clean:
	rm -rf $(BIN)

# ---- S3: versitygw (pinned S3 gateway for the end-to-end tests) ----
# `make versitygw` installs bin/tools/versitygw at the version pinned in
# scripts/install-versitygw.sh (idempotent). Tests that need it skip when it is
# missing; add `versitygw` to the prerequisites of `test` to run them.
.PHONY: versitygw
versitygw:
	scripts/install-versitygw.sh

# ---- packaging ----
# docker builds the walden image (deploy/docker/Dockerfile: static binaries on
# distroless, non-root) with the version and commit stamped. It needs a
# container engine; the tests check what they can without one (go test ./deploy).
IMAGE ?= walden
.PHONY: docker
docker:
	docker build -f deploy/docker/Dockerfile --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t $(IMAGE):$(or $(VERSION),dev) .

.PHONY: system-deps
system-deps:
	scripts/install-deps.sh

# ---- releases ----
# release builds VERSION (semver: vMAJOR.MINOR.PATCH[-PRERELEASE], by default
# the tag on HEAD) into dist/VERSION: per platform a tarball of walden and
# waldenctl (static, stamped with VERSION and COMMIT as LDFLAGS does),
# LICENSE, README.md and the CHANGELOG's section of VERSION; SHA256SUMS and
# RELEASE-NOTES.md beside them (scripts/release.sh; PLATFORMS="linux/amd64"
# for fewer). The steps around it are in docs/runbook.md#releasing.
.PHONY: release
release:
	COMMIT=$(COMMIT) scripts/release.sh $(VERSION)

# upgrade-test builds the previous release (PREVIOUS: a tag or commit) in a
# temporary work tree and runs the rolling upgrade and the rollback of one
# member against this tree on real processes (TestE2EMixedVersionUpgrade,
# docs/runbook.md#upgrades; `make e2e` runs it with the default PREVIOUS).
PREVIOUS ?= 4aeb5d7
.PHONY: upgrade-test
upgrade-test: versitygw
	$(GO) test -count=1 -v -timeout 20m -run TestE2EMixedVersionUpgrade ./e2e -e2e.full -e2e.previous=$(PREVIOUS)
