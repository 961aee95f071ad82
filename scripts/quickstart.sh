#!/usr/bin/env bash
# Install, then train odin-splat-quick on the CPU and report what a user judges 3DGS by: held-out PSNR and SSIM,
# the Gaussian count at the end, the time per iteration, and a held-out view beside its render (a PNG).
# Usage: bash scripts/quickstart.sh [SCENE_DIR [NS_TRAIN_FLAGS...]]
#   SCENE_DIR: a COLMAP scene (default: odin-synth's default scene, made in data/synth-object);
#   NS_TRAIN_FLAGS: passed on to ns-train, e.g. --pipeline.datamanager.camera-res-scale-factor 0.25 for photos.
# Everything is written to outputs/<scene folder name>/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
# One intra-op thread, so that the time per iteration compares between runs (without it the plugin chooses from the
# cores and the load, odin_nerfstudio/ns/threads.py); ns-eval below runs at the same count.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

scene="${1:-data/synth-object}"
scene_flags=()
if [ $# -eq 0 ]; then
    [ -d "$scene/sparse/0" ] || odin-synth --preset object --output "$scene"
    # odin-synth's empty space is black; its 128x96 views are trained and evaluated at 64x48.
    scene_flags=(--pipeline.model.background-color black --pipeline.datamanager.camera-res-scale-factor 0.5)
fi
name="$(basename "${scene%/}")"
run="outputs/$name/odin-splat-quick/quickstart"
rm -rf "$run" "outputs/$name/renders"  # a second run on the same scene replaces the first
iters_flags=()
if [ -n "${ODIN_QUICKSTART_ITERS:-}" ]; then
    iters_flags=(--max-num-iterations "$ODIN_QUICKSTART_ITERS" --steps-per-save "$ODIN_QUICKSTART_ITERS")
fi

ns-train odin-splat-quick --data "$scene" --machine.device-type cpu "${scene_flags[@]}" "${iters_flags[@]}" \
    --vis tensorboard --viewer.quit-on-train-completion True \
    --output-dir outputs --experiment-name "$name" --timestamp quickstart \
    --steps-per-eval-all-images 0 --steps-per-eval-image 0 "${@:2}"
ns-eval --load-config "$run/config.yml" --output-path "outputs/$name/eval.json" \
    --render-output-path "outputs/$name/renders"

python - "$run" "outputs/$name" <<'EOF'
"""Print the run's held-out metrics, Gaussians and time per iteration; write the first held-out view | its render."""
import json
import sys
from pathlib import Path

import torch
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from odin_nerfstudio.ns.checkpoints import allow_nerfstudio_checkpoints

run, out = Path(sys.argv[1]), Path(sys.argv[2])
results = json.loads((out / "eval.json").read_text())["results"]
allow_nerfstudio_checkpoints()
checkpoint = max((run / "nerfstudio_models").glob("step-*.ckpt"))
state = torch.load(checkpoint, map_location="cpu")
gaussians = state["pipeline"]["_model.gauss_params.means"].shape[0]
events = EventAccumulator(str(run), size_guidance={"scalars": 0})
events.Reload()
train_seconds = events.Scalars("Train Total (time)")[-1].value
iterations = state["step"] + 1
pairs = sorted((out / "renders").glob("*_img_*.png"))  # nerfstudio writes ground truth | render per held-out view
with Image.open(pairs[0]) as pair:
    pair.resize((pair.width * 4, pair.height * 4), Image.NEAREST).save(out / "heldout.png")
print(
    f"held-out PSNR {results['psnr']:.2f} dB, SSIM {results['ssim']:.3f} over {len(pairs)} views; "
    f"{gaussians} Gaussians at the end; {iterations} iterations in {train_seconds:.0f} s of training "
    f"({1000 * train_seconds / iterations:.0f} ms per iteration)"
)
print(f"ground truth | render of a held-out view: {out / 'heldout.png'}")
EOF
