# Sourced by the scripts that build on the GPU machine. Its image has no RE2 (the CLI's tensor-name filters), so
# the device call carries .deps/re2, which `bash scripts/carry_re2.sh` makes on the development machine.
if [ -d .deps/re2/lib ]; then
  export CMAKE_PREFIX_PATH="$PWD/.deps/re2${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LD_LIBRARY_PATH="$PWD/.deps/re2/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
