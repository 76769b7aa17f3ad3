# The two entry points of the README. Both install what is missing first (scripts/setup.sh).
# PRESET=cpu builds without CUDA; the default preset needs nvcc (CUDA 13).
PRESET ?= $(shell command -v nvcc >/dev/null 2>&1 || test -x /usr/local/cuda/bin/nvcc && echo default || echo cpu)
JOBS ?= $(shell nproc)
export PATH := $(PATH):/usr/local/cuda/bin

.PHONY: setup build demo test clean fuzz

setup:
	bash scripts/setup.sh

build: setup
	cmake --preset $(PRESET)
	cmake --build --preset $(PRESET) -j $(JOBS)

demo: build
	./build/$(PRESET)/tools/nmkit/nmkit demo

test: build
	ctest --preset $(PRESET) -j $(JOBS)

# libFuzzer harnesses (clang, ASan + UBSan) in build/fuzz, each run FUZZ_SECONDS (default 60) over its corpus.
fuzz: setup
	bash scripts/fuzz.sh

clean:
	rm -rf build
