#!/usr/bin/env bash
# Copies this machine's RE2 (headers and shared library, ~1 MB) into .deps/re2 for the GPU machine, whose image
# lacks it: name ".deps/re2" in the device call's carry; scripts/gpu_env.sh points CMake and the loader at it.
set -euo pipefail
cd "$(dirname "$0")/.."
lib=$(ls /usr/lib/x86_64-linux-gnu/libre2.so.* 2>/dev/null | head -n 1)
[ -n "$lib" ] && [ -f /usr/include/re2/re2.h ] || { echo "RE2 is not installed here (scripts/setup.sh installs it)"; exit 1; }
rm -rf .deps/re2 && mkdir -p .deps/re2/include .deps/re2/lib
cp -r /usr/include/re2 .deps/re2/include/
cp -L "$lib" ".deps/re2/lib/$(basename "$lib")"
cp -L "$lib" .deps/re2/lib/libre2.so  # a file, not a link: links travel to the GPU machine only as links
echo "made .deps/re2 from $lib"
