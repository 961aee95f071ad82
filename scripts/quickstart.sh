#!/usr/bin/env bash
# Install, then train odin-splat on CPU and print PSNR on held-out views.
# Usage: bash scripts/quickstart.sh [SCENE_DIR]   (default: a synthetic street scene made by odin-synth)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

scene="${1:-data/synth-street}"
if [ $# -eq 0 ] && [ ! -d "$scene/sparse/0" ]; then
    odin-synth --preset street --output "$scene"
fi
iters="${ODIN_QUICKSTART_ITERS:-300}"
ns-train odin-splat --data "$scene" --machine.device-type cpu --max-num-iterations "$iters" \
    --vis tensorboard --viewer.quit-on-train-completion True \
    --output-dir outputs --experiment-name quickstart --timestamp latest \
    --steps-per-eval-all-images 0 --steps-per-eval-image 0 --steps-per-save "$iters" \
    --pipeline.model.num-downscales 0 --pipeline.model.sh-degree-interval 100
ns-eval --load-config outputs/quickstart/odin-splat/latest/config.yml --output-path outputs/quickstart/eval.json
python -c '
import json
results = json.load(open("outputs/quickstart/eval.json"))["results"]
print("held-out PSNR: %.2f dB, SSIM %.3f" % (results["psnr"], results["ssim"]))
'
