"""Benchmark of the pure-torch CPU rasterizer: forward + backward of 20k Gaussians at 126x94 on one thread.

Why: the CPU backend trains Odin's tests and CI runs; its target is <= 1.0 s per forward + backward for this
scene. Run `python benchmarks/bench_rasterizer.py`; it prints the figures and rewrites its own section of
BENCHMARKS.md at the repository root (between its markers), leaving the other sections alone.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import statistics
import sys
import time
from typing import Dict, List

import torch
from _report import BENCHMARKS, machine, write_section

from odin_nerfstudio.rendering.rasterize import rasterization

NAME = "bench_rasterizer"
TARGET_S = 1.0


def make_scene(n: int = 20_000, width: int = 126, height: int = 94, seed: int = 0) -> Dict[str, object]:
    """A plausible trained-splat view: Gaussians in the frustum at depth 2..8, log-normal sizes, SH degree 3.

    Scales are log-normal around 0.015 (about 0.4 px sigma at depth 4, most radii 2..4 px, a tail of large
    ones), opacities are sigmoid(N(1, 2)) (many nearly opaque, as after training), colors SH degree 3 [N, 16, 3].
    """
    g = torch.Generator().manual_seed(seed)
    focal = 0.6 * width / math.tan(math.radians(60) / 2)
    depth = 2.0 + 6.0 * torch.rand(n, generator=g)
    xy = (torch.rand(n, 2, generator=g) * 2 - 1) * torch.tensor([width, height]) / (2 * focal) * 1.1
    means = torch.cat([xy * depth[:, None], depth[:, None]], dim=1)
    params = {
        "means": means,
        "quats": torch.randn(n, 4, generator=g),
        "scales": torch.exp(math.log(0.015) + 0.6 * torch.randn(n, 3, generator=g)),
        "opacities": torch.sigmoid(1.0 + 2.0 * torch.randn(n, generator=g)),
        "colors": 0.3 * torch.randn(n, 16, 3, generator=g),
    }
    Ks = torch.tensor([[focal, 0.0, width / 2], [0.0, focal, height / 2], [0.0, 0.0, 1.0]])[None]
    return {"params": params, "viewmats": torch.eye(4)[None], "Ks": Ks, "width": width, "height": height}


def step(scene: Dict[str, object], params: Dict[str, torch.Tensor]) -> Dict[str, object]:
    """One forward + backward (L1 to a constant target, DefaultStrategy's retain_grad on means2d)."""
    render, alpha, info = rasterization(
        params["means"],
        params["quats"],
        params["scales"],
        params["opacities"],
        params["colors"],
        scene["viewmats"],
        scene["Ks"],
        scene["width"],
        scene["height"],
        sh_degree=3,
        packed=False,
    )
    info["means2d"].retain_grad()
    (render - 0.5).abs().mean().backward()
    return info


def main(argv: List[str] | None = None) -> None:
    """Time warm-up + `--repeats` forward + backward passes; print and record median, min and peak memory."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    scene = make_scene()
    rss_before_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    times, visible = [], 0
    for i in range(args.warmup + args.repeats):
        params = {k: v.clone().requires_grad_(True) for k, v in scene["params"].items()}
        start = time.perf_counter()
        info = step(scene, params)
        elapsed = time.perf_counter() - start
        if i >= args.warmup:
            times.append(elapsed)
        visible = int((info["radii"] > 0).sum())
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    command = "python " + " ".join(["benchmarks/bench_rasterizer.py", *(argv if argv is not None else sys.argv[1:])])
    median, best = statistics.median(times), min(times)
    text = "\n".join(
        [
            "## CPU rasterizer (odin_nerfstudio.rendering.cpu_rasterizer)",
            "",
            f"- command: `{command}` (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')})",
            f"- machine: {machine(torch)}",
            f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}",
            f"- scene: 20,000 Gaussians ({visible} visible), 126x94, one camera, SH degree 3, render_mode RGB, seed 0",
            f"- forward + backward: median {median:.3f} s, min {best:.3f} s over {len(times)} runs "
            f"(after {args.warmup} warm-up); target <= {TARGET_S:.1f} s",
            f"- peak resident memory: {peak_mb:.0f} MB for the process, {peak_mb - rss_before_mb:.0f} MB above the "
            f"{rss_before_mb:.0f} MB it held before the first pass (imports and scene)",
        ]
    )
    print(text)
    if not args.no_write:
        write_section(NAME, text)
        print(f"updated {BENCHMARKS}")


if __name__ == "__main__":
    main()
