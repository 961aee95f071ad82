"""Two "nodes" on this machine (`torchrun --nnodes 2`, one process each, rendezvous on localhost), each with its own
output folder and no folder shared: both train to the end and write their per-rank files on their own node."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from odin_nerfstudio.scenes.synth import SynthConfig, make_scene
from tests.ns.processes import environment
from tests.ns.test_launch import train_args
from tests.ns.test_training import free_port

BIN = Path(sys.executable).parent


@pytest.mark.slow
def test_two_nodes_train_with_separate_output_folders(tmp_path: Path) -> None:
    scene = make_scene(SynthConfig(preset="street", num_views=12, output=tmp_path / "street"))
    port = str(free_port())
    env = environment(one_thread=True)
    nodes = []
    for node in range(2):
        output = tmp_path / f"node{node}"
        torchrun = [str(BIN / "torchrun"), "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node)]
        rendezvous = ["--master-addr", "127.0.0.1", "--master-port", port, "--no-python", str(BIN / "odin-train")]
        log = open(tmp_path / f"node{node}.log", "w")
        command = [*torchrun, *rendezvous, *train_args(scene, output, "multi")]
        nodes.append((subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env), log))
    for process, log in nodes:
        process.wait(timeout=600)
        log.close()
    for node, (process, _) in enumerate(nodes):
        assert process.returncode == 0, (tmp_path / f"node{node}.log").read_text()[-5000:]
    run0 = tmp_path / "node0" / "multi" / "odin-splat" / "run"
    run1 = tmp_path / "node1" / "multi" / "odin-splat" / "run"
    assert (run0 / "odin_timeline_rank0.json").exists() and (run0 / "odin_counters_rank0.json").exists()
    assert (run1 / "odin_timeline_rank1.json").exists() and (run1 / "odin_counters_rank1.json").exists()
    assert (run0 / "nerfstudio_models" / "step-000000013.ckpt").exists() and (run0 / "config.yml").exists()
    assert not (run1 / "odin_timeline_rank0.json").exists(), "node 1 holds only its own rank's files"
