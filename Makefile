# agentguard - convenience targets over CMake.
#   make demo       build the program only, then run a stuck agent through
#                   the guard (stopped) and the same agent recovering
#                   through a nudge
#   make test       build and run every test (CTest over Criterion)
#   make test-asan  the tests under AddressSanitizer + UBSan
#   make test-tsan  the runtime's concurrent scenarios under ThreadSanitizer
#                   (tests/tsan/: Criterion cannot start under TSan)
#   make bench      benchmarks (print figures; never pass/fail on speed)
#   make fuzz       every libFuzzer target for FUZZ_SECONDS (default 60) each
# Missing Debian packages are installed first when run as root.

BUILD      ?= build
BUILD_ASAN ?= build-asan
BUILD_TSAN ?= build-tsan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=

# The library and the program need only these; the tests add Criterion,
# fuzzing adds clang and the clang runtime that matches it.
LIB_PKGS  = cmake pkg-config gcc make libjansson-dev libssl-dev \
            libcurl4-openssl-dev libpcre2-dev libmicrohttpd-dev libedit-dev
TEST_PKGS = $(LIB_PKGS) libcriterion-dev

.PHONY: all deps deps-lib deps-fuzz build program demo test test-asan test-tsan bench fuzz format format-check clean

all: build

deps-lib:
	@sh scripts/deps.sh $(LIB_PKGS)

deps:
	@sh scripts/deps.sh $(TEST_PKGS)

deps-fuzz: deps
	@sh scripts/deps.sh clang
	@sh scripts/deps.sh $$(sh scripts/clang-rt.sh)

# Everything: the library, the program, the tests and the benchmarks.
build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DAG_BUILD_TESTS=ON -DAG_BUILD_BENCH=ON $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS)

# The program alone (what `make demo` needs): no Criterion, no tests. A
# build folder configured by `make build` is reused as it is.
program: deps-lib
	@test -f $(BUILD)/CMakeCache.txt || cmake -S . -B $(BUILD) \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAG_BUILD_TESTS=OFF \
	  -DAG_BUILD_BENCH=OFF $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS) --target agentguard_cli

# A stuck agent stopped by the guard (exit 3 is expected), then the same
# agent recovering through a nudge (exit 0).
demo: program
	@$(BUILD)/agentguard simulate --timeline examples/scenarios/stuck_agent.json; \
	  test $$? -eq 3
	@echo
	@$(BUILD)/agentguard simulate --timeline examples/scenarios/recovering_agent.json

SAN_ENV = ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
          UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

# Tests over ../shared's data skip when it is not beside the project (a
# clone alone); their "skipped: ..." lines are listed after the run.
test: build
	cd $(BUILD) && $(SAN_ENV) ctest --output-on-failure -j $(JOBS); rc=$$?; \
	  grep -h '^skipped: ' Testing/Temporary/LastTest.log 2>/dev/null | sort -u; \
	  exit $$rc

test-asan: deps
	cmake -S . -B $(BUILD_ASAN) -DCMAKE_BUILD_TYPE=Debug \
	  -DAG_SANITIZE=address,undefined -DAG_BUILD_BENCH=OFF $(CMAKE_ARGS)
	cmake --build $(BUILD_ASAN) -j $(JOBS)
	cd $(BUILD_ASAN) && $(SAN_ENV) ctest --output-on-failure -j $(JOBS)

test-tsan: deps
	cmake -S . -B $(BUILD_TSAN) -DCMAKE_BUILD_TYPE=Debug \
	  -DAG_SANITIZE=thread -DAG_BUILD_BENCH=OFF $(CMAKE_ARGS)
	cmake --build $(BUILD_TSAN) -j $(JOBS)
	cd $(BUILD_TSAN) && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest -L tsan --output-on-failure -j $(JOBS)

bench: build
	@sh bench/run.sh $(BUILD)

# libFuzzer targets (clang) in build-fuzz/, FUZZ_SECONDS (60) each.
fuzz: deps-fuzz
	@JOBS=$(JOBS) sh scripts/fuzz.sh

C_FILES = $(wildcard include/*.h include/agentguard/*.h src/*/*.c src/*/*.h \
            cli/*.c cli/*.h tests/*/*.c tests/*/*.h bench/*.c examples/*.c)

format:
	clang-format -i $(C_FILES)

format-check:
	clang-format --dry-run --Werror $(C_FILES)

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_TSAN)
