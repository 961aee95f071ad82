"""OdinSplatModel: splatfacto that runs on any device and renders through Odin's rasterizer dispatch.

It keeps splatfacto's parameters, losses, densification strategy and exporters, so the viewer,
`ns-export gaussian-splat` and `ns-eval` treat it as splatfacto. It changes three things splatfacto gets
wrong off a GPU: no hard-coded `.cuda()`, rendering through :func:`odin_nerfstudio.rendering.rasterize.rasterization`
(gsplat on CUDA, the pure-torch rasterizer on CPU), and LPIPS that never downloads weights (`ns/lpips.py`). For a
schedule of W x B views per step it counts its refinement, SH and resolution schedules in views (`batch_scaling`,
the batch rule).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Literal, Optional, Tuple, Type, Union

import torch
from nerfstudio.cameras.cameras import Cameras
from nerfstudio.model_components.lib_bilagrid import BilateralGrid, color_correct
from nerfstudio.models.splatfacto import (
    RGB2SH,
    SplatfactoModel,
    SplatfactoModelConfig,
    num_sh_bases,
    random_quat_tensor,
    resize_image,
)
from nerfstudio.utils.colors import get_color
from pytorch_msssim import SSIM
from torch import Tensor

from odin_nerfstudio.adapter.gsplat import ViewCountedStrategy
from odin_nerfstudio.ns.batch_scaling import BatchScaling, batch_scaling
from odin_nerfstudio.ns.lpips import make_lpips


def get_viewmat(camera_to_world: Tensor) -> Tensor:
    """World-to-camera matrices [C, 4, 4] (gsplat's axes) of camera-to-world matrices [C, 3, 4], computed eagerly.

    splatfacto's `get_viewmat` is the same arithmetic wrapped in `torch.compile`: on a CPU its first call has inductor
    generate and build C++ (11 s measured on the 2-core development machine: most of the first iteration), for a
    4 x 4 rigid inverse that takes microseconds eagerly.
    """
    flip = torch.tensor([[[1, -1, -1]]], device=camera_to_world.device, dtype=camera_to_world.dtype)
    R = camera_to_world[:, :3, :3] * flip  # y and z flipped: nerfstudio's (OpenGL) camera axes to gsplat's (OpenCV)
    T = camera_to_world[:, :3, 3:4]
    R_inv = R.transpose(1, 2)
    viewmat = torch.zeros(R.shape[0], 4, 4, device=R.device, dtype=R.dtype)
    viewmat[:, 3, 3] = 1.0
    viewmat[:, :3, :3] = R_inv
    viewmat[:, :3, 3:4] = -torch.bmm(R_inv, T)
    return viewmat


@dataclass
class OdinSplatModelConfig(SplatfactoModelConfig):
    """Splatfacto's options, rendered through Odin's device-agnostic rasterizer."""

    _target: Type = field(default_factory=lambda: OdinSplatModel)
    batch_scaling: Union[Literal["adaptive", "sqrt", "off"], bool] = "adaptive"
    """The batch rule for a step of W x B > 1 views (`ns/batch_scaling.py`). sqrt: Grendel's, learning rates x
    sqrt(W x B), Adam's betas ** (W x B), and the schedules below (warmup, refinement, opacity reset, SH degree,
    resolution) and the learning-rate decay counted in views, so W workers reach the same epochs' densification as
    one. adaptive: the same, with the learning rates also x sqrt(r), r measured on the steps (how alike their views'
    gradients are, 1 to W x B). off: every count in iterations and every rate as configured, whatever the batch.
    True / False: adaptive / off."""


class OdinSplatModel(SplatfactoModel):
    """Splatfacto on CPU or CUDA, with LPIPS that never downloads at init."""

    config: OdinSplatModelConfig

    def populate_modules(self) -> None:
        """Build the Gaussians from the SfM seed points (or at random), the metrics and the densification strategy.

        This mirrors splatfacto's populate_modules; it is rewritten rather than called because splatfacto's
        version moves the seed colours to CUDA and builds an LPIPS metric that downloads AlexNet.
        """
        self.gauss_params = torch.nn.ParameterDict(self._initial_gaussians())
        self.camera_optimizer = self.config.camera_optimizer.setup(num_cameras=self.num_train_data, device="cpu")

        from torchmetrics.image import PeakSignalNoiseRatio

        self.psnr = PeakSignalNoiseRatio(data_range=1.0)
        self.ssim = SSIM(data_range=1.0, size_average=True, channel=3)
        self.lpips = make_lpips()
        self.step = 0
        self.crop_box = None
        if self.config.background_color == "random":
            self.background_color = torch.tensor([0.1490, 0.1647, 0.2157])
        else:
            self.background_color = get_color(self.config.background_color)
        if self.config.use_bilateral_grid:
            self.bil_grids = BilateralGrid(
                num=self.num_train_data,
                grid_X=self.config.grid_shape[0],
                grid_Y=self.config.grid_shape[1],
                grid_W=self.config.grid_shape[2],
            )
        self.batch = BatchScaling()
        self.strategy = self._make_strategy()
        self.strategy_state = self.strategy.initialize_state(scene_scale=1.0)

    def scale_to_batch(self, num_workers: int, views_per_worker: int) -> BatchScaling:
        """Run the schedules ``num_workers`` x ``views_per_worker`` views a step (unless the config's
        `batch_scaling` is off): rebuilds the densification strategy (its statistics start from zero) and returns the
        rule, whose learning rates the trainer applies to its optimizers (and whose adaptive gain, if any, the
        runtime). The schedules stay counted in views: a step refines, resets, raises the SH degree and the
        resolution where a one-view run would at one of its views."""
        self.batch = batch_scaling(self.config.batch_scaling, num_workers, views_per_worker)
        self.strategy = self._make_strategy()
        self.strategy_state = self.strategy.initialize_state(scene_scale=1.0)
        return self.batch

    def _get_downscale_factor(self, step: Optional[int] = None) -> int:
        """splatfacto's resolution schedule at `step` (default: the model's), `resolution_schedule` counted in views
        (`batch_scaling`)."""
        if not self.training:
            return 1
        step = self.step if step is None else step
        view = self.batch.first_view(step)
        return 2 ** max(self.config.num_downscales - view // self.config.resolution_schedule, 0)

    def get_gt_img(self, image: torch.Tensor, step: Optional[int] = None) -> torch.Tensor:
        """splatfacto's ground truth (float in [0, 1], on the model's device) at the resolution schedule's downscale
        at `step` (default: the model's; a task passes its own, as its camera is downscaled at it)."""
        if image.dtype == torch.uint8:
            image = image.float() / 255.0
        factor = self._get_downscale_factor(step)
        if factor > 1:
            image = resize_image(image, factor)
        return image.to(self.device)

    def _initial_gaussians(self) -> Dict[str, torch.nn.Parameter]:
        """Splatfacto's initialisation: seeds (or a random cube), kNN scales, random rotations, opacity 0.1."""
        use_seeds = self.seed_points is not None and not self.config.random_init
        if use_seeds:
            means = self.seed_points[0].float()
        else:
            means = (torch.rand((self.config.num_random, 3)) - 0.5) * self.config.random_scale
        distances, _ = self.k_nearest_sklearn(means, 3)
        avg_dist = torch.from_numpy(distances).float().mean(dim=-1, keepdim=True)
        num_points = means.shape[0]
        dim_sh = num_sh_bases(self.config.sh_degree)
        if use_seeds and self.seed_points[1].shape[0] > 0:
            rgb = self.seed_points[1].float() / 255
            shs = torch.zeros((num_points, dim_sh, 3))
            if self.config.sh_degree > 0:
                shs[:, 0, :] = RGB2SH(rgb)
            else:
                shs[:, 0, :] = torch.logit(rgb, eps=1e-10)
            features_dc, features_rest = shs[:, 0, :], shs[:, 1:, :]
        else:
            features_dc = torch.rand(num_points, 3)
            features_rest = torch.zeros((num_points, dim_sh - 1, 3))
        tensors = {
            "means": means,
            "scales": torch.log(avg_dist.repeat(1, 3)),
            "quats": random_quat_tensor(num_points),
            "features_dc": features_dc,
            "features_rest": features_rest,
            "opacities": torch.logit(0.1 * torch.ones(num_points, 1)),
        }
        return {name: torch.nn.Parameter(value.contiguous()) for name, value in tensors.items()}

    def _make_strategy(self) -> ViewCountedStrategy:
        """gsplat's DefaultStrategy with splatfacto's settings, its intervals in views, stepped `self.batch`'s views
        at a time (``adapter/gsplat.py``'s ``ViewCountedStrategy``).

        The strategy's statistics need no scaling: the runtime accumulates them per task (one view's screen-space
        gradient norm, count + 1 per visible Gaussian), so grad2d / count stays a mean over views for any W x B.
        """
        config = self.config
        return ViewCountedStrategy(
            prune_opa=config.cull_alpha_thresh,
            grow_grad2d=config.densify_grad_thresh,
            grow_scale3d=config.densify_size_thresh,
            grow_scale2d=config.split_screen_size,
            prune_scale3d=config.cull_scale_thresh,
            prune_scale2d=config.cull_screen_size,
            refine_scale2d_stop_iter=config.stop_screen_size_at,
            refine_start_iter=config.warmup_length,
            refine_stop_iter=config.stop_split_at,
            reset_every=config.reset_alpha_every * config.refine_every,
            refine_every=config.refine_every,
            pause_refine_after_reset=self.num_train_data + config.refine_every,
            absgrad=config.use_absgrad,
            revised_opacity=False,
            verbose=True,
            views_per_step=self.batch.views_per_step,
        )

    def get_outputs(self, camera: Cameras) -> Dict[str, Union[torch.Tensor, list]]:
        """Render one camera: rgb [H, W, 3], depth [H, W, 1] (eval), accumulation [H, W, 1], background."""
        if not isinstance(camera, Cameras):
            raise TypeError(f"get_outputs expects a Cameras object, got {type(camera).__name__}")
        if self.training:
            if camera.shape[0] != 1:
                raise ValueError("OdinSplatModel trains on one camera at a time")
            camera_to_world = self.camera_optimizer.apply_to_camera(camera)
        else:
            camera_to_world = camera.camera_to_worlds

        crop_ids = None
        if self.crop_box is not None and not self.training:
            crop_ids = self.crop_box.within(self.means).squeeze()
            if crop_ids.sum() == 0:
                return self.get_empty_outputs(
                    int(camera.width.item()), int(camera.height.item()), self.background_color
                )
        params = {name: value if crop_ids is None else value[crop_ids] for name, value in self.gauss_params.items()}

        scale = self._get_downscale_factor()
        camera.rescale_output_resolution(1 / scale)
        viewmat = get_viewmat(camera_to_world)
        K = camera.get_intrinsics_matrices().to(self.device)
        W, H = int(camera.width.item()), int(camera.height.item())
        self.last_size = (H, W)
        camera.rescale_output_resolution(scale)

        render, alpha, self.info = self.render_gaussians(params, viewmat, K, W, H)
        if self.training:
            self.strategy.step_pre_backward(
                self.gauss_params, self.optimizers, self.strategy_state, self.step, self.info
            )
        background = self._get_background_color()
        rgb = torch.clamp(render[..., :3] + (1 - alpha) * background, 0.0, 1.0)
        if self.config.use_bilateral_grid and self.training:
            if camera.metadata is not None and "cam_idx" in camera.metadata:
                rgb = self._apply_bilateral_grid(rgb, camera.metadata["cam_idx"], H, W)
        depth = None
        if render.shape[-1] == 4:
            depth = render[..., 3:4]
            depth = torch.where(alpha > 0, depth, depth.detach().max()).squeeze(0)
        if background.shape[0] == 3 and not self.training:
            background = background.expand(H, W, 3)
        return {"rgb": rgb.squeeze(0), "depth": depth, "accumulation": alpha.squeeze(0), "background": background}

    def render_gaussians(
        self,
        params: Dict[str, torch.Tensor],
        viewmat: torch.Tensor,
        K: torch.Tensor,
        width: int,
        height: int,
        step: Optional[int] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor, dict]:
        """Rasterize raw (pre-activation) Gaussian parameters for one camera: render [1, H, W, 3|4], alpha [1, H, W, 1].

        `params` holds splatfacto's tensors (means, scales, quats, features_dc, features_rest, opacities); Odin's
        runtime passes task-local gathered rows here, the plain model passes its own parameters. `step` (default:
        the model's) sets the SH degree: a task passes its own, since tasks of several steps render side by side.
        """
        from odin_nerfstudio.rendering.rasterize import rasterization

        if self.config.rasterize_mode not in ("antialiased", "classic"):
            raise ValueError(f"Unknown rasterize_mode {self.config.rasterize_mode!r}: use 'classic' or 'antialiased'")
        colors = torch.cat((params["features_dc"][:, None, :], params["features_rest"]), dim=1)
        if self.config.sh_degree > 0:
            sh_degree: Optional[int] = min(
                self.batch.first_view(self.step if step is None else step) // self.config.sh_degree_interval,
                self.config.sh_degree,
            )
        else:
            colors = torch.sigmoid(colors).squeeze(1)
            sh_degree = None
        render_mode = "RGB+ED" if self.config.output_depth_during_training or not self.training else "RGB"
        return rasterization(
            means=params["means"],
            quats=params["quats"],
            scales=torch.exp(params["scales"]),
            opacities=torch.sigmoid(params["opacities"]).squeeze(-1),
            colors=colors,
            viewmats=viewmat.to(self.device),
            Ks=K,
            width=width,
            height=height,
            packed=False,
            near_plane=0.01,
            far_plane=1e10,
            render_mode=render_mode,
            sh_degree=sh_degree,
            sparse_grad=False,
            absgrad=self.strategy.absgrad,
            rasterize_mode=self.config.rasterize_mode,
        )

    def get_image_metrics_and_images(
        self, outputs: Dict[str, torch.Tensor], batch: Dict[str, torch.Tensor]
    ) -> Tuple[Dict[str, float], Dict[str, torch.Tensor]]:
        """PSNR, SSIM and (when its weights are present) LPIPS of one eval image, plus the side-by-side image."""
        gt_rgb = self.composite_with_background(self.get_gt_img(batch["image"]), outputs["background"])
        predicted_rgb = outputs["rgb"]
        images = {"img": torch.cat([gt_rgb, predicted_rgb], dim=1)}
        metrics = self._image_metrics(gt_rgb, predicted_rgb, prefix="")
        if self.config.color_corrected_metrics:
            metrics.update(self._image_metrics(gt_rgb, color_correct(predicted_rgb, gt_rgb), prefix="cc_"))
        return metrics, images

    def _image_metrics(self, gt_rgb: torch.Tensor, rgb: torch.Tensor, prefix: str) -> Dict[str, float]:
        """PSNR, SSIM and optional LPIPS between two [H, W, 3] images."""
        gt = torch.moveaxis(gt_rgb, -1, 0)[None, ...]
        pred = torch.moveaxis(rgb, -1, 0)[None, ...]
        metrics = {f"{prefix}psnr": float(self.psnr(gt, pred).item()), f"{prefix}ssim": float(self.ssim(gt, pred))}
        if self.lpips is not None:
            metrics[f"{prefix}lpips"] = float(self.lpips(gt, pred))
        return metrics
