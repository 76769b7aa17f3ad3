#!/usr/bin/env bash
# `pip install .` as a user gets it: builds nmkit's wheel from this checkout with pip's build isolation (scikit-build-core
# and nanobind from PyPI into a throwaway environment, nothing from .deps/ or the build trees), CPU-only
# (NMKIT_ENABLE_CUDA=OFF), installs it into a clean venv (numpy from PyPI) and runs python/tests against the installed
# package, from outside the checkout. CI runs it after `make test` (.ci/run); it takes about a minute and a half on
# two cores.
#
# The torch cases run too where scripts/setup.sh installed PyTorch (.deps/torch, NMKIT_SETUP_TORCH=1; then a PyTorch
# that does not import is a failure), and the files-from-the-CLI cases where `make build` made the CLI (or NMKIT_CLI
# names one): neither is part of the wheel. JOBS: compile jobs (default: all cores). KEEP=1 keeps the work folder.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
work="$(mktemp -d "${TMPDIR:-/tmp}/nmkit-wheel.XXXXXX")"
if [ "${KEEP:-0}" = "1" ]; then echo "check_wheel: work folder $work"; else trap 'rm -rf "$work"' EXIT; fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
start=$SECONDS

echo "check_wheel: building the wheel (CPU-only, build isolation)"
CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-$(nproc)}" python3 -m pip wheel --no-deps --wheel-dir "$work/dist" \
  --config-settings=cmake.define.NMKIT_ENABLE_CUDA=OFF --config-settings=build-dir="$work/build" "$repo"
wheels=("$work"/dist/nmkit-*.whl)
[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] || { echo "check_wheel: expected one nmkit wheel in $work/dist" >&2; exit 1; }

echo "check_wheel: installing $(basename "${wheels[0]}") into a clean venv"
venv="$work/venv"
if python3 -m venv "$venv" 2>/dev/null; then
  pip=("$venv/bin/python" -m pip)
else  # a python3 without ensurepip (Debian without python3-venv): this pip installs into the venv
  python3 -m venv --without-pip "$venv"
  pip=(python3 -m pip --python "$venv/bin/python")
fi
"${pip[@]}" install -q "${wheels[0]}"

# From outside the checkout, with no PYTHONPATH but the optional PyTorch: only the installed nmkit can be imported.
cd "$work"
unset PYTHONPATH
"$venv/bin/python" - "$venv" <<'EOF'
import sys
import nmkit
venv = sys.argv[1]
for module in (nmkit, nmkit._nmkit):
    assert module.__file__.startswith(venv + "/"), f"{module.__name__} imported from {module.__file__}, not the venv"
assert nmkit.build_info()["cuda"] is False, nmkit.build_info()
print(f"check_wheel: nmkit {nmkit.__version__} from {nmkit.__file__}")
EOF
if [ -d "$repo/.deps/torch/torch" ]; then
  export PYTHONPATH="$repo/.deps/torch" NMKIT_REQUIRE_TORCH=1
fi
if [ -z "${NMKIT_CLI:-}" ]; then
  for cli in "$repo"/build/{cpu,default,py}/tools/nmkit/nmkit; do
    if [ -x "$cli" ]; then export NMKIT_CLI="$cli"; break; fi
  done
fi
echo "check_wheel: python/tests against the installed package (PyTorch: ${PYTHONPATH:-none}; CLI: ${NMKIT_CLI:-none})"
"$venv/bin/python" -m unittest discover -v -s "$repo/python/tests"
echo "check_wheel: passed in $((SECONDS - start)) s"
