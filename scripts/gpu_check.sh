#!/usr/bin/env bash
# The GPU check of issue 10: build the CUDA ops, run the kernel tests on CUDA against the reference, and train a
# short bare-gsplat loop through the Odin runtime in barrier, quality and throughput modes (scripts/gpu_check.py);
# then the sharded check (scripts/gpu_check.py --sharded): the sharded barrier and quality-first on 2 ranks (threads on
# one GPU, and NCCL processes where there are 2 GPUs) against the replicated barrier.
#
#   bash scripts/gpu_check.sh --pack   # here (a machine with the project's .venv): fill .gpu_carry/ (about 20 MiB)
#   bash scripts/gpu_check.sh          # on the GPU machine (Python 3.12, torch 2.11, nvcc, no registry)
#   bash scripts/gpu_check.sh --cpu    # the same flow on CPU (this machine): a dry run that must pass
#
# The GPU machine has no nerfstudio and no package registry, so what the check imports beyond torch and numpy
# travels in .gpu_carry/ (git-ignored; hand it over with the tree, e.g. the device runner's `carry`): gsplat's
# Python package with its CUDA sources (JIT-built there by gsplat's own _backend on first use; glm's headers only),
# pytest, hypothesis and their pure-Python dependencies, rich (gsplat's build messages), and a ninja binary
# (torch's extension builder needs it). All are pure Python or static, so the 3.11 venv's copies serve 3.12.
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=.gpu_carry

VENV="${VENV:-.venv}"  # the project's venv (--pack copies from it; --cpu runs in it)

if [ "${1:-}" = "--pack" ]; then
    SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    rm -rf "$CARRY" && mkdir -p "$CARRY/site-packages" "$CARRY/bin"
    for pkg in gsplat pytest _pytest pluggy iniconfig py.py hypothesis _hypothesis_globals.py sortedcontainers attr attrs \
        packaging rich markdown_it mdurl pygments typing_extensions.py; do
        [ -e "$SITE/$pkg" ] && cp -r "$SITE/$pkg" "$CARRY/site-packages/"
    done
    # glm is header-only: keep its headers, drop its docs and tests (most of gsplat's 25 MiB).
    glm="$CARRY/site-packages/gsplat/cuda/csrc/third_party/glm"
    find "$glm" -mindepth 1 -maxdepth 1 ! -name glm ! -name copying.txt -exec rm -rf {} +
    find "$CARRY" -name __pycache__ -type d -prune -exec rm -rf {} +
    cp "$("$VENV/bin/python" -c 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))' 2>/dev/null || command -v ninja)" "$CARRY/bin/ninja"
    du -sh "$CARRY"
    exit 0
fi

if [ "${1:-}" = "--cpu" ]; then
    PY="${PYTHON:-$VENV/bin/python}"
    [ -x "$PY" ] || PY=python3
    echo "== gpu_check --cpu: CPU ops (built by setup.sh, or now), their tests, the training flow on CPU"
    "$PY" -m odin_nerfstudio.kernels.build
    "$PY" -m pytest -q tests/kernels/test_ops.py -k "cpu and not 2_to_the_24" -p no:cacheprovider
    "$PY" scripts/gpu_check.py --cpu
    "$PY" scripts/gpu_check.py --cpu --sharded
    exit 0
fi

PY="${PYTHON:-python3}"
[ -d "$CARRY/site-packages" ] || { echo "gpu_check: $CARRY/ is missing: run 'bash scripts/gpu_check.sh --pack' where the .venv is, and carry it" >&2; exit 2; }
export PYTHONPATH="$PWD/$CARRY/site-packages:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$PWD/$CARRY/bin:$PATH"
export CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
export MAX_JOBS="${MAX_JOBS:-16}"
echo "== gpu_check: $("$PY" -c 'import torch, sys; print(f"torch {torch.__version__}, python {sys.version.split()[0]}, {torch.cuda.get_device_name()}")'), CUDA_HOME=$CUDA_HOME"
start=$(date +%s)
"$PY" -m odin_nerfstudio.kernels.build --cuda
echo "== CUDA ops built in $(( $(date +%s) - start )) s"
start=$(date +%s)
"$PY" -c 'import gsplat.cuda._backend as b; assert b._C is not None, "gsplat CUDA build failed"'
echo "== gsplat's CUDA rasterizer built in $(( $(date +%s) - start )) s"
"$PY" -m pytest -q -p no:cacheprovider tests/kernels -k "cuda or nvcc"
"$PY" scripts/gpu_check.py
echo "== the sharded check"
"$PY" scripts/gpu_check.py --sharded
