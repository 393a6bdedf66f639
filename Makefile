# Prosody-C: the two commands are `make demo` and `make test`. Both install
# what they need on a fresh machine (scripts/deps.sh) and build first.
#
#   make / make all     build library, CLI and tests (build/)
#   make demo           run the main job on the embedded mock broker
#   make test           every tier: unit, mock cluster, real Kafka (started
#                       and stopped here unless already running)
#   make test-quick     unit + mock-cluster tests only
#   make test-cluster   faults of a three-broker Kafka cluster (started and
#                       stopped here unless already running)
#   make test-interop   beside the original Prosody (PyPI prosody-events, pinned,
#                       in a venv of its own) on the real Kafka and Cassandra:
#                       one keyspace, one group (also run by `make test`)
#   make test-kafka4    the C real tier against Kafka 4 (scripts/services/kafka4,
#                       127.0.0.1:9096), with Cassandra and Jaeger; each started
#                       and stopped here unless already running
#   make test-sanitize  unit + mock tests under ASan+UBSan, then TSan
#   make bench          optimised build, benchmarks (bench/results/latest.json)
#   make fuzz           the libFuzzer targets (CQL decoder, JSON validator,
#                       option values, record intake),
#                       FUZZ_SECONDS (600) each
#   make soak           a long run against real Kafka and Cassandra (started
#                       here unless running): messages, timers, a member
#                       joining and leaving, one failing key; SOAK_MINUTES
#                       (30); summary in build-soak/soak-summary.md
#   make install        install into PREFIX (default /usr/local)
#   make dist           release tarball of libprosody and the CLI (dist/)
#   make dist-python    the Python sdist and a manylinux wheel per CPython (dist/)
#   make dist-node      the npm tarball, with a prebuilt addon (dist/)
#   make test-dist      each artefact installed and run outside the checkout
#   make docs           regenerate docs/CONFIGURATION.md from the option table
#   make format         clang-format every C file

BUILD   ?= build
PREFIX  ?= /usr/local
JOBS    ?= 2
CMAKE_FLAGS ?=
CTEST   = ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

PKGS := jansson libuv libmicrohttpd libcurl libxxhash cmocka libssl libsasl2 libzstd liblz4 zlib

.PHONY: fuzz soak all deps configure demo test test-quick test-real test-cluster test-kafka4 test-interop test-sanitize \
        bench install docs format format-check clean dist dist-python dist-node test-dist

all: configure
	cmake --build $(BUILD) -j $(JOBS)

deps:
	@if ! command -v cmake >/dev/null || ! command -v cc >/dev/null || \
	    ! command -v clang-format >/dev/null || ! command -v valgrind >/dev/null || \
	    ! pkg-config --exists $(PKGS) 2>/dev/null; then \
	  scripts/deps.sh; fi

configure: deps
	@test -f $(BUILD)/CMakeCache.txt || \
	  cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	    -DPROSODY_WERROR=ON -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_FLAGS)

demo: all
	$(BUILD)/prosody demo

test: all
	scripts/run-tests.sh $(BUILD)

test-quick: all
	$(CTEST) -L 'unit|mock'

test-real: all
	scripts/run-tests.sh $(BUILD) real

test-cluster: all
	scripts/run-tests.sh $(BUILD) cluster

test-interop: all
	scripts/interop-tests.sh

test-kafka4: all
	scripts/run-tests.sh $(BUILD) kafka4

test-sanitize: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DPROSODY_WERROR=ON \
	  -DPROSODY_SANITIZE=address,undefined -DPROSODY_BENCH=OFF
	cmake --build build-asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir build-asan --output-on-failure -j $(JOBS) -L 'unit|mock' -LE 'nosan'
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DPROSODY_WERROR=ON \
	  -DPROSODY_SANITIZE=thread -DPROSODY_BENCH=OFF
	cmake --build build-tsan -j $(JOBS)
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	  ctest --test-dir build-tsan --output-on-failure -j $(JOBS) -L 'unit|mock' -LE 'nosan'

FUZZ_SECONDS ?= 600
fuzz: deps
	scripts/fuzz.sh $(FUZZ_SECONDS)

SOAK_MINUTES ?= 30
soak: deps
	SOAK_MINUTES=$(SOAK_MINUTES) scripts/soak.sh

bench: deps
	cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DPROSODY_TESTS=OFF
	cmake --build build-release -j $(JOBS)
	bench/run.sh build-release

install: all
	cmake --install $(BUILD) --prefix $(PREFIX)

dist: deps
	scripts/dist.sh c

dist-python: deps
	scripts/dist.sh python

dist-node: deps
	scripts/dist.sh node

test-dist: dist dist-python dist-node
	scripts/test-dist.sh

docs: all
	$(BUILD)/prosody config --markdown > docs/CONFIGURATION.md

format: deps
	clang-format -i $$(git ls-files '*.c' '*.h')

format-check: deps
	clang-format --dry-run --Werror $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-asan build-tsan build-release build-soak dist
