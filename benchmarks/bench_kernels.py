"""Micro-benchmark of Odin's four kernels: per-op time of the pure-torch reference against the compiled C++ op.

Why: the kernels exist to make the runtime's bookkeeping cheap beside the renderer; this measures each op alone
at a realistic size, before the runtime calls them. N = 200k Gaussians in gsplat's layout at SH degree 3 (means
[N, 3], scales [N, 3], quats [N, 4], opacities [N], features_dc [N, 3], features_rest [N, 15, 3]) spread in a
100 m cube; a camera at its centre with a focal length searched so that |C(t)| is about the target (2.5k and 10k
rows). Per step: W x B = 4 tasks, each culls against 3 unpublished steps' write sets (|C| rows each) and gathers
its C(t); the 4 tasks' active sets (80% of each C(t), overlapping) are summed in task order; their union is
published with selective Adam. Times are the best of ``--repeat`` runs on ``--threads`` torch threads: thread CPU
time with one thread (robust on a shared machine), wall time with more.
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import torch

from odin_nerfstudio.core.camera import Camera
from odin_nerfstudio.core.conflicts import StepRows
from odin_nerfstudio.core.selective_adam import selective_adams
from odin_nerfstudio.core.sparse import SparseUpdate
from odin_nerfstudio.culling.candidates import BoundingSpheres, CullRegion
from odin_nerfstudio.kernels import ops

SHAPES = {"means": (3,), "scales": (3,), "quats": (4,), "opacities": (), "features_dc": (3,), "features_rest": (15, 3)}
TASKS = 4


def region_for(bounds: BoundingSpheres, target: int) -> CullRegion:
    """A camera at the cube's centre looking down +z whose candidate set holds about ``target`` rows."""
    low, high = 1.0, 1e5
    for _ in range(40):
        focal = math.sqrt(low * high)
        K = torch.tensor([[focal, 0.0, 320.0], [0.0, focal, 240.0], [0.0, 0.0, 1.0]])
        region = CullRegion.candidates(Camera(viewmat=torch.eye(4), K=K, width=640, height=480), 0.1)
        count = bounds.rows_in(region).numel()
        if abs(count - target) < 0.05 * target:
            break
        low, high = (focal, high) if count > target else (low, focal)
    return region


def best_ms(call: Callable[[], object], repeat: int) -> float:
    """Best time of ``call()`` over ``repeat`` runs, milliseconds: the calling thread's CPU time with one torch
    thread (all the work runs on it, and time spent descheduled on a shared machine is not counted), else wall."""
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    best = math.inf
    for _ in range(repeat):
        start = clock()
        call()
        best = min(best, clock() - start)
    return best * 1e3


def bench(num_rows: int, target: int, repeat: int) -> list[tuple[str, int, float, float]]:
    """Per op: name, rows it handles, reference ms and compiled ms (one step's calls)."""
    generator = torch.Generator().manual_seed(0)
    means = 100.0 * (torch.rand(num_rows, 3, generator=generator) - 0.5)
    bounds = BoundingSpheres.of(means, 0.05 * torch.rand(num_rows, 3, generator=generator))
    bounds.index()
    region = region_for(bounds, target)
    candidate = bounds.rows_in(region)
    size = candidate.numel()
    writes = [StepRows(s, torch.unique(torch.randint(0, num_rows, (size,), generator=generator))) for s in range(3)]
    params = {name: torch.randn(num_rows, *shape, generator=generator) for name, shape in SHAPES.items()}
    seq = torch.zeros(num_rows, dtype=torch.int64)
    updates = []
    for _ in range(TASKS):
        active = candidate[torch.rand(size, generator=generator) < 0.8]
        grads = {name: torch.randn(active.numel(), *shape, generator=generator) for name, shape in SHAPES.items()}
        updates.append(SparseUpdate(active, grads))
    union = ops.scatter_in_order(updates, params)

    def publisher() -> Callable[[], object]:
        copies = {name: torch.nn.Parameter(p.clone()) for name, p in params.items()}
        optimizers = selective_adams(copies, {name: 1e-3 for name in params})
        return lambda: ops.publish_adam(optimizers, union.rows, union.grads, seq)

    calls = {
        "cull_conflicts": (size * TASKS, lambda: [ops.cull_conflicts(bounds, region, 3, writes) for _ in range(TASKS)]),
        "gather_rows": (size * TASKS, lambda: [ops.gather_rows(params, candidate, seq) for _ in range(TASKS)]),
        "scatter_in_order": (sum(u.rows.numel() for u in updates), lambda: ops.scatter_in_order(updates, params)),
    }
    rows = []
    for name, (handled, call) in calls.items():
        with ops.use_reference():
            reference = best_ms(call, repeat)
        rows.append((name, handled, reference, best_ms(call, repeat)))
    with ops.use_reference():
        reference = best_ms(publisher(), repeat)
    rows.append(("publish_adam", union.rows.numel(), reference, best_ms(publisher(), repeat)))
    return rows


def main() -> None:
    """Run both sizes and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--candidates", type=int, nargs="+", default=[2_500, 10_000])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not ops.compiled("cpu"):
        raise SystemExit("bench_kernels: the compiled CPU ops are not available (see the warning above)")
    print(f"N = {args.rows}, SH degree 3, {TASKS} tasks per step, {args.threads} torch thread(s), ", end="")
    print(f"best of {args.repeat}\n")
    print("| op (one step's calls) | target \\|C\\| | rows handled | reference ms | C++ ms | speed-up |")
    print("|---|---|---|---|---|---|")
    for target in args.candidates:
        for name, handled, reference, compiled in bench(args.rows, target, args.repeat):
            print(f"| {name} | {target} | {handled} | {reference:.3f} | {compiled:.3f} | {reference / compiled:.1f}x |")


if __name__ == "__main__":
    main()
