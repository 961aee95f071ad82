"""Shared helpers of the kernel tests: which devices to test, the compiled ops required, random scenes and models."""

from __future__ import annotations

import pytest
import torch

from odin_nerfstudio.core.camera import Camera
from odin_nerfstudio.core.selective_adam import SelectiveAdam, selective_adams
from odin_nerfstudio.kernels import _backend, ops
from tests.conftest import missing

NO_GPU = "no CUDA device here: the CUDA kernels are compiled by test_nvcc.py and run by scripts/gpu_check.sh on a GPU"
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)]),
]
"""Every op test runs per device; the CUDA ones skip with a reason on a machine without a GPU."""


def require_compiled(device: str) -> None:
    """Fail (CI) or skip (elsewhere) when the compiled ops for ``device`` are not loaded."""
    if ops.compiled(device):
        return
    missing(f"the compiled odin ops for {device} are not loaded (flavour {_backend.load()!r}; see the warnings)")


def random_camera(generator: torch.Generator, width: int = 64, height: int = 48) -> Camera:
    """A camera with a random rotation, translation and focal length (no skew)."""
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=generator, dtype=torch.float64))
    rotation = q * torch.sign(torch.diagonal(r))
    if torch.det(rotation) < 0:
        rotation[:, 0] = -rotation[:, 0]
    viewmat = torch.eye(4)
    viewmat[:3, :3] = rotation.float()
    viewmat[:3, 3] = 3.0 * torch.randn(3, generator=generator)
    focal = float(20.0 + 80.0 * torch.rand((), generator=generator))
    K = torch.tensor([[focal, 0.0, width / 2], [0.0, focal * 1.1, height / 2], [0.0, 0.0, 1.0]])
    return Camera(viewmat=viewmat, K=K, width=width, height=height)


SHAPES = {"means": (3,), "scales": (3,), "quats": (4,), "opacities": (), "features_dc": (3,), "features_rest": (15, 3)}
"""gsplat's parameter layout at SH degree 3 (trailing shapes)."""
LRS = {
    "means": 1.6e-4,
    "scales": 5e-3,
    "quats": 1e-3,
    "opacities": 5e-2,
    "features_dc": 2.5e-3,
    "features_rest": 1.25e-4,
}


def make_model(num_rows: int, seed: int, device: str, shapes: dict[str, tuple[int, ...]] = SHAPES) -> tuple[
    dict[str, torch.nn.Parameter], dict[str, SelectiveAdam]
]:
    """Random parameters [N, ...] and their fresh SelectiveAdams (zero moments, step 0)."""
    generator = torch.Generator().manual_seed(seed)
    params = {
        name: torch.nn.Parameter(torch.randn(num_rows, *shape, generator=generator).to(device))
        for name, shape in shapes.items()
    }
    optimizers = selective_adams(params, {name: LRS.get(name, 1e-2) for name in params})
    return params, optimizers


def clone_model(params: dict[str, torch.nn.Parameter], optimizers: dict[str, SelectiveAdam]) -> tuple[
    dict[str, torch.nn.Parameter], dict[str, SelectiveAdam]
]:
    """An independent copy of parameters and optimizers (values, moments and step counts)."""
    copies = {name: torch.nn.Parameter(p.detach().clone()) for name, p in params.items()}
    new = {}
    for name, optimizer in optimizers.items():
        group = optimizer.param_groups[0]
        new[name] = SelectiveAdam([copies[name]], lr=group["lr"], betas=group["betas"], eps=group["eps"])
        old = optimizer.state[params[name]]
        state = new[name].state[copies[name]]
        state["step"] = old["step"].clone()
        state["exp_avg"] = old["exp_avg"].clone()
        state["exp_avg_sq"] = old["exp_avg_sq"].clone()
    return copies, new


def same_model(a: tuple[dict, dict], b: tuple[dict, dict]) -> bool:
    """Whether two (params, optimizers) pairs hold the same bits everywhere (values, moments, step counts)."""
    for name in a[0]:
        pa, pb = a[0][name], b[0][name]
        sa, sb = a[1][name].state[pa], b[1][name].state[pb]
        if not (torch.equal(pa, pb) and torch.equal(sa["exp_avg"], sb["exp_avg"])):
            return False
        if not (torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"]) and torch.equal(sa["step"], sb["step"])):
            return False
    return True


def random_rows(generator: torch.Generator, num_rows: int, count: int, device: str) -> torch.Tensor:
    """Sorted unique rows of [0, num_rows), at most ``count``, int64."""
    if num_rows == 0 or count == 0:
        return torch.empty(0, dtype=torch.int64, device=device)
    return torch.unique(torch.randint(0, num_rows, (count,), generator=generator)).to(device)

