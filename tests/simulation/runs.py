"""Helpers of the simulator's tests: a hand-made run folder whose timeline follows a known cost formula."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TASK_S = (0.020, 40e-6, 1e-6)
"""The synthetic run's render + backward: 20 ms + 40 us x |C(t)| + 1 us x pixels."""
PUBLISH_S = (0.002, 1e-6)
"""Its publications: 2 ms + 1 us x rows."""


def write_run(folder: Path, ranks: int = 2, steps: int = 30, seed: int = 0) -> Path:
    """A run folder with ``ranks`` Chrome traces and counters: each rank renders one task per step, its render and
    backward spans (half the task's time each) carrying |C(t)| and pixels, then publishes the step."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(ranks):
        events, clock, bookkeeping = [], 0.0, 0
        for step in range(steps):
            size, pixels = int(rng.integers(50, 2000)), int(rng.choice([12288, 49152]))
            seconds = TASK_S[0] + TASK_S[1] * size + TASK_S[2] * pixels
            args = {"step": step, "view": step % 7, "candidates": size, "pixels": pixels}
            for name in ("render", "backward"):
                events.append(_span(name, clock, seconds / 2, args))
                clock += seconds / 2
            events.append(_span("comm", clock, 0.001, {"step": step}))
            rows = int(rng.integers(10, 500))
            publish = PUBLISH_S[0] + PUBLISH_S[1] * rows
            events.append(_span("publish", clock + 0.001, publish, {"step": step, "rows": rows}, worker=-1))
            clock += 0.001 + publish
            bookkeeping += int(publish * 1e9) + 1_000_000
        trace = {"traceEvents": events, "otherData": {"origin_ns": 0}}
        (folder / f"odin_timeline_rank{rank}.json").write_text(json.dumps(trace))
        counters = {"bookkeeping_ns": bookkeeping, "comm_ns": 0, "stale_reads": [], "validation_failures": {}}
        (folder / f"odin_counters_rank{rank}.json").write_text(json.dumps(counters))
    return folder


def _span(name: str, start_s: float, seconds: float, args: dict, worker: int = 0) -> dict:
    """A complete event of the Trace Event Format (microseconds)."""
    return {"name": name, "ph": "X", "ts": start_s * 1e6, "dur": seconds * 1e6, "pid": 0, "tid": worker, "args": args}



CONFIG_YML = """\
!!python/object:odin_nerfstudio.ns.trainer.OdinTrainerConfig
data: &id002 !!python/object/apply:pathlib.PosixPath
{data}
interconnect: {interconnect}
max_num_iterations: {steps}
pipeline: !!python/object:odin_nerfstudio.ns.pipeline.OdinPipelineConfig
  datamanager: !!python/object:odin_nerfstudio.ns.datamanager.OdinDatamanagerConfig
    data: *id002
    num_workers: null
    schedule_seed: 0
    views_per_step: 1
runtime: !!python/object:odin_nerfstudio.runtime.config.OdinRuntimeConfig
  mode: {mode}
  ring_slots: 4
"""
"""The keys of nerfstudio's config.yml dump that odin-simulate reads, with its Python tags."""


def write_config(run: Path, scene: Path, mode: str = "quality", interconnect: str = "none", steps: int = 30) -> None:
    """A config.yml in ``run`` as ns-train writes it (paths as pathlib's part lists)."""
    parts = "\n".join(f"- {part}" for part in scene.resolve().parts)
    text = CONFIG_YML.format(data=parts, interconnect=interconnect, steps=steps, mode=mode)
    (run / "config.yml").write_text(text)
