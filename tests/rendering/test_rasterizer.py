"""The CPU rasterizer against gsplat's references: autograd, projection, per-pixel compositing, strategy, dispatch."""

from __future__ import annotations

import math
from typing import Dict, List, Optional

import pytest
import torch
from gsplat.cuda._torch_impl import _fully_fused_projection, _quat_scale_to_covar_preci, _spherical_harmonics
from gsplat.strategy import DefaultStrategy

from odin_nerfstudio.rendering import cpu_rasterizer
from odin_nerfstudio.rendering.rasterize import rasterization


def make_scene(
    n: int,
    width: int,
    height: int,
    n_cameras: int = 1,
    sh_degree: Optional[int] = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    scale: float = 0.12,
    opacity_range: tuple = (0.3, 0.95),
) -> Dict[str, object]:
    """Random Gaussians in front of `n_cameras` pinhole cameras (a few off-screen and behind the first one)."""
    g = torch.Generator().manual_seed(seed)
    focal = 0.9 * width
    depth = 1.5 + 2.0 * torch.rand(n, generator=g, dtype=dtype)
    xy = (
        (torch.rand(n, 2, generator=g, dtype=dtype) * 2 - 1)
        * torch.tensor([width, height], dtype=dtype)
        / (2 * focal)
        * 1.3
    )
    means = torch.cat([xy * depth[:, None], depth[:, None]], dim=1)
    means[0, 2] = -1.0
    low, high = opacity_range
    quats = torch.randn(n, 4, generator=g, dtype=dtype)
    scales = scale * torch.exp(0.5 * torch.randn(n, 3, generator=g, dtype=dtype))
    opacities = low + (high - low) * torch.rand(n, generator=g, dtype=dtype)
    K = 1 if sh_degree is None else (sh_degree + 1) ** 2
    colors = (
        torch.rand(n, 3, generator=g, dtype=dtype)
        if sh_degree is None
        else 0.4 * torch.randn(n, K, 3, generator=g, dtype=dtype)
    )
    viewmats = torch.eye(4, dtype=dtype).repeat(n_cameras, 1, 1)
    for c in range(1, n_cameras):
        viewmats[c, :3, 3] = torch.tensor([0.1 * c, -0.05 * c, 0.2 * c], dtype=dtype)
    Ks = torch.tensor([[focal, 0.0, width / 2], [0.0, focal, height / 2], [0.0, 0.0, 1.0]], dtype=dtype)
    return {
        "means": means,
        "quats": quats,
        "scales": scales,
        "opacities": opacities,
        "colors": colors,
        "viewmats": viewmats,
        "Ks": Ks.repeat(n_cameras, 1, 1),
        "width": width,
        "height": height,
    }


def render(scene: Dict[str, object], **kwargs) -> tuple:
    """Call the dispatcher on a scene dict with packed=False."""
    return rasterization(**scene, packed=False, **kwargs)


def brute_force(
    scene: Dict[str, object],
    sh_degree: Optional[int],
    render_mode: str,
    backgrounds: Optional[torch.Tensor],
    tile_size: int,
) -> tuple:
    """gsplat's forward rules as a plain per-pixel Python loop over gsplat's reference projection."""
    covars, _ = _quat_scale_to_covar_preci(scene["quats"], scene["scales"], compute_preci=False)
    radii, means2d, depths, conics, _ = _fully_fused_projection(
        scene["means"], covars, scene["viewmats"], scene["Ks"], scene["width"], scene["height"]
    )
    C, N = radii.shape
    colors = scene["colors"]
    if sh_degree is not None:
        dirs = scene["means"][None] - torch.inverse(scene["viewmats"])[:, None, :3, 3]
        colors = torch.clamp_min(_spherical_harmonics(sh_degree, dirs, colors.expand(C, -1, -1, -1)) + 0.5, 0.0)
    else:
        colors = colors.expand(C, -1, -1)
    colors = torch.cat([colors, depths[..., None]], -1)
    width, height = scene["width"], scene["height"]
    out = torch.zeros(C, height, width, 4, dtype=torch.float64)
    out_alpha = torch.zeros(C, height, width, 1, dtype=torch.float64)
    terminated = 0
    for c in range(C):
        r, m, d, q, col = (x[c].tolist() for x in (radii, means2d, depths, conics, colors))
        o = scene["opacities"].tolist()
        boxes = {}
        for n in range(N):
            if r[n] > 0:
                tx, ty, tr = m[n][0] / tile_size, m[n][1] / tile_size, r[n] / tile_size
                boxes[n] = (math.floor(tx - tr), math.ceil(tx + tr), math.floor(ty - tr), math.ceil(ty + tr))
        order = sorted(boxes, key=lambda n: (d[n], n))
        for y in range(height):
            for x in range(width):
                T, acc = 1.0, [0.0] * 4
                for n in order:
                    x0, x1, y0, y1 = boxes[n]
                    if not (x0 <= x // tile_size < x1 and y0 <= y // tile_size < y1):
                        continue
                    dx, dy = m[n][0] - (x + 0.5), m[n][1] - (y + 0.5)
                    sigma = 0.5 * (q[n][0] * dx * dx + q[n][2] * dy * dy) + q[n][1] * dx * dy
                    alpha = min(0.999, o[n] * math.exp(-sigma))
                    if sigma < 0 or alpha < 1 / 255:
                        continue
                    if T * (1 - alpha) <= 1e-4:
                        terminated += 1
                        break
                    acc = [a + alpha * T * v for a, v in zip(acc, col[n])]
                    T *= 1 - alpha
                out[c, y, x] = torch.tensor(acc, dtype=torch.float64)
                out_alpha[c, y, x, 0] = 1 - T
    if backgrounds is not None:
        out[..., :3] += (1 - out_alpha) * backgrounds[:, None, None, :]
    if render_mode == "RGB+ED":
        out[..., 3:] /= out_alpha.clamp(min=1e-10)
        return out, out_alpha, terminated
    return out[..., :3], out_alpha, terminated


@pytest.mark.parametrize("sh_degree", [None, 0, 1, 2, 3])
def test_compositing_matches_per_pixel_loop(sh_degree: Optional[int]) -> None:
    """Render and alpha equal a per-pixel loop of gsplat's rules, RGB and RGB+ED, with and without background."""
    scene = make_scene(50, 20, 12, n_cameras=2, sh_degree=sh_degree, seed=1, scale=0.3, opacity_range=(0.6, 0.99))
    scene["means"][1, 0] += 2.5  # off-screen
    backgrounds = torch.tensor([[0.2, 0.5, 0.9], [1.0, 0.0, 0.3]], dtype=torch.float64)
    for render_mode in ("RGB", "RGB+ED"):
        for bg in (None, backgrounds):
            expected, expected_alpha, terminated = brute_force(scene, sh_degree, render_mode, bg, tile_size=8)
            got, got_alpha, _ = render(scene, sh_degree=sh_degree, render_mode=render_mode, backgrounds=bg, tile_size=8)
            torch.testing.assert_close(got_alpha, expected_alpha, rtol=0, atol=1e-10)
            torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)
            assert terminated > 0, "the scene should exercise early termination"


def test_chunked_pair_search_matches_one_chunk() -> None:
    """Visiting Gaussians in many small chunks (stopped pixels dropped between chunks) finds the same pairs."""
    scene = make_scene(50, 20, 12, n_cameras=2, seed=1, scale=0.3, opacity_range=(0.6, 0.99))
    covars, _ = _quat_scale_to_covar_preci(scene["quats"], scene["scales"], compute_preci=False)
    radii, means2d, depths, conics, _, covars2d = cpu_rasterizer.project(
        scene["means"], covars, scene["viewmats"], scene["Ks"], 20, 12, 0.01, 1e10, 0.0, 0.3, False
    )
    opacities = scene["opacities"].repeat(2, 1)
    lo, hi = cpu_rasterizer.tile_box(means2d, radii, 8, 3, 2)
    args = (means2d, conics, covars2d, opacities, depths, radii, lo, hi, 20, 12, 8)
    one_ids, one_pixels = cpu_rasterizer.composited_pairs(*args, chunk_pairs=1 << 30)
    many_ids, many_pixels = cpu_rasterizer.composited_pairs(*args, chunk_pairs=97)
    assert torch.equal(one_ids, many_ids) and torch.equal(one_pixels, many_pixels)


def test_depth_modes_follow_gsplat() -> None:
    """'D' is the accumulated depth, 'ED' divides it by alpha, 'RGB+D' appends it; backgrounds leave depth alone."""
    scene = make_scene(30, 16, 12, seed=2)
    bg = torch.tensor([[0.3, 0.3, 0.3]], dtype=torch.float64)
    rgbd, alpha, _ = render(scene, render_mode="RGB+D", backgrounds=bg)
    d, _, _ = render(scene, render_mode="D", backgrounds=bg)
    ed, _, _ = render(scene, render_mode="ED")
    rgb, _, _ = render(scene, render_mode="RGB", backgrounds=bg)
    torch.testing.assert_close(rgbd[..., 3:], d)
    torch.testing.assert_close(rgbd[..., :3], rgb)
    torch.testing.assert_close(ed, d / alpha.clamp(min=1e-10))


def test_covars_and_per_camera_colors() -> None:
    """`covars` render as the quats/scales they come from (gradient on the upper triangle only, as gsplat reads
    it); per-camera colors [C, N, D] render as shared ones."""
    scene = make_scene(30, 16, 12, n_cameras=2, seed=8)
    expected, expected_alpha, _ = render(scene)
    covars, _ = _quat_scale_to_covar_preci(scene["quats"], scene["scales"], compute_preci=False)
    covars.requires_grad_(True)
    got, got_alpha, _ = render({**scene, "quats": None, "scales": None}, covars=covars)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got_alpha, expected_alpha)
    got.sum().backward()
    assert not bool(covars.grad.tril(-1).any()) and bool(covars.grad.triu().any())
    per_camera, _, _ = render({**scene, "colors": scene["colors"].expand(2, -1, -1)})
    torch.testing.assert_close(per_camera, expected)


def test_projection_matches_gsplat_reference() -> None:
    """means2d, depths, conics, compensations and radii equal gsplat's `_fully_fused_projection`."""
    scene = make_scene(500, 64, 48, n_cameras=2, seed=3, dtype=torch.float32, scale=0.05)
    covars, _ = _quat_scale_to_covar_preci(scene["quats"], scene["scales"], compute_preci=False)
    args = (scene["means"], covars, scene["viewmats"], scene["Ks"], 64, 48)
    ref_radii, ref_means2d, ref_depths, ref_conics, ref_comp = _fully_fused_projection(
        *args, eps2d=0.3, near_plane=0.01, far_plane=1e10, calc_compensations=True
    )
    radii, means2d, depths, conics, comp, _ = cpu_rasterizer.project(*args, 0.01, 1e10, 0.0, 0.3, True)
    assert radii.dtype == torch.int32 and radii.shape == (2, 500)
    assert torch.equal(radii, ref_radii)
    visible = radii > 0
    assert 0 < int(visible.sum()) < radii.numel()
    torch.testing.assert_close(means2d[visible], ref_means2d[visible])
    torch.testing.assert_close(depths, ref_depths)
    torch.testing.assert_close(conics[visible], ref_conics[visible])
    torch.testing.assert_close(comp[visible], ref_comp[visible])

    clipped, *_ = cpu_rasterizer.project(*args, 0.01, 1e10, 3.0, 0.3, False)
    assert torch.equal(clipped, torch.where(ref_radii > 3, ref_radii, 0))
    far_culled, *_ = cpu_rasterizer.project(*args, 0.01, 2.5, 0.0, 0.3, False)
    assert torch.equal(far_culled, torch.where(ref_depths <= 2.5, ref_radii, 0))


@pytest.mark.parametrize(
    "rasterize_mode,render_mode,sh_degree,n,scale,opacity_range",
    [
        ("classic", "RGB", None, 6, 0.15, (0.3, 0.8)),
        ("antialiased", "RGB+ED", 2, 6, 0.15, (0.3, 0.8)),
        ("classic", "RGB+D", 1, 24, 0.6, (0.9, 0.99)),  # dense: many pixels stop early
    ],
)
def test_gradcheck(
    rasterize_mode: str, render_mode: str, sh_degree: Optional[int], n: int, scale: float, opacity_range: tuple
) -> None:
    """float64 gradcheck w.r.t. means, quats, scales, opacities, colors (and background) on a tiny scene."""
    scene = make_scene(n, 14, 10, n_cameras=2, sh_degree=sh_degree, seed=4, scale=scale, opacity_range=opacity_range)
    names = ("means", "quats", "scales", "opacities", "colors")
    bg = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]], dtype=torch.float64, requires_grad=True)

    def f(*inputs: torch.Tensor):
        params = dict(zip(names, inputs[:-1]))
        out, alpha, _ = rasterization(
            **{**scene, **params},
            packed=False,
            sh_degree=sh_degree,
            tile_size=8,
            backgrounds=inputs[-1],
            render_mode=render_mode,
            rasterize_mode=rasterize_mode,
        )
        return out, alpha

    inputs = [scene[k].clone().requires_grad_(True) for k in names] + [bg]
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6, rtol=1e-4, fast_mode=True)


def test_absgrad_is_sum_of_per_pixel_abs_gradients() -> None:
    """`means2d.absgrad` equals sum over pixels of |d(pixel's loss)/d means2d|, as gsplat's backward computes."""
    scene = make_scene(12, 10, 8, seed=5, scale=0.15)
    scene["means"].requires_grad_(True)
    out, alpha, info = render(scene, absgrad=True, tile_size=4)
    g = torch.Generator().manual_seed(0)
    w, wa = torch.randn(out.shape, generator=g, dtype=out.dtype), torch.randn(alpha.shape, generator=g, dtype=out.dtype)
    per_pixel = (out * w).sum(-1) + (alpha * wa).sum(-1)  # [C, H, W]
    means2d = info["means2d"]
    expected, signed = torch.zeros_like(means2d), torch.zeros_like(means2d)
    for pixel in per_pixel.flatten():
        (grad,) = torch.autograd.grad(pixel, means2d, retain_graph=True)
        expected += grad.abs()
        signed += grad
    per_pixel.sum().backward()
    torch.testing.assert_close(means2d.absgrad, expected)
    assert bool((expected > signed.abs() + 1e-9).any()), "the scene should have Gaussians seen by several pixels"


def test_info_keys_and_empty_view() -> None:
    """`info` carries gsplat's non-packed keys and shapes; a view that sees nothing renders the background."""
    scene = make_scene(50, 16, 12, n_cameras=2, dtype=torch.float32)
    _, _, info = render(scene)
    C, N = 2, 50
    assert info["means2d"].shape == (C, N, 2) and info["depths"].shape == (C, N)
    assert info["conics"].shape == (C, N, 3) and info["opacities"].shape == (C, N)
    assert info["radii"].shape == (C, N) and info["radii"].dtype == torch.int32
    assert info["camera_ids"] is None and info["gaussian_ids"] is None
    assert (info["width"], info["height"], info["n_cameras"], info["tile_size"]) == (16, 12, C, 16)
    assert info["tiles_per_gauss"].shape == (C, N)

    scene["means"][:, 2] = -scene["means"][:, 2].abs()
    bg = torch.tensor([[0.5, 0.25, 1.0]] * C)
    out, alpha, info = render(scene, backgrounds=bg)
    assert int(info["radii"].sum()) == 0
    assert torch.equal(alpha, torch.zeros_like(alpha))
    assert torch.equal(out, bg[:, None, None, :].expand_as(out))


@pytest.mark.parametrize("absgrad", [False, True])
def test_default_strategy_runs_on_cpu(absgrad: bool) -> None:
    """gsplat's DefaultStrategy updates grad2d/count from `info`, then refines (grow, prune) on CPU."""
    scene = make_scene(200, 32, 24, sh_degree=1, seed=6, dtype=torch.float32, scale=0.05)
    params = torch.nn.ParameterDict(
        {
            "means": scene["means"],
            "quats": scene["quats"],
            "scales": torch.log(scene["scales"]),
            "opacities": torch.logit(scene["opacities"]),
            "sh0": scene["colors"][:, :1],
            "shN": scene["colors"][:, 1:],
        }
    )
    optimizers = {k: torch.optim.Adam([p], lr=1e-3) for k, p in params.items()}
    strategy = DefaultStrategy(absgrad=absgrad, refine_start_iter=1, refine_every=2, grow_grad2d=1e-6)
    strategy.check_sanity(params, optimizers)
    state = strategy.initialize_state()
    for step in (1, 2):
        out, _, info = rasterization(
            params["means"],
            params["quats"],
            torch.exp(params["scales"]),
            torch.sigmoid(params["opacities"]),
            torch.cat([params["sh0"], params["shN"]], 1),
            scene["viewmats"],
            scene["Ks"],
            32,
            24,
            sh_degree=1,
            packed=False,
            absgrad=absgrad,
        )
        strategy.step_pre_backward(params, optimizers, state, step, info)
        out.mean().backward()
        n_before = len(params["means"])
        strategy.step_post_backward(params, optimizers, state, step, info, packed=False)
        if step == 1:
            visible = info["radii"][0] > 0
            grad = (info["means2d"].absgrad if absgrad else info["means2d"].grad)[0]
            expected = (grad * torch.tensor([32 / 2.0, 24 / 2.0])).norm(dim=-1) * visible
            assert torch.equal(state["count"], visible.float())
            torch.testing.assert_close(state["grad2d"], expected)
            assert bool((expected > 0).any())
        else:
            assert len(params["means"]) != n_before
            assert all(len(p) == len(params["means"]) for p in params.values())
            assert not bool(state["count"].any())
        for opt in optimizers.values():
            opt.step()
            opt.zero_grad()


def test_dispatcher_rejects_what_cpu_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU calls never reach gsplat's CUDA path; unsupported options and bad input raise clear ValueErrors."""
    import gsplat.rendering

    def no_cuda(*args, **kwargs):
        raise AssertionError("CPU tensors reached gsplat.rendering.rasterization")

    monkeypatch.setattr(gsplat.rendering, "rasterization", no_cuda)
    scene = make_scene(10, 8, 6, dtype=torch.float32)
    render(scene)
    with pytest.raises(ValueError, match="packed=False"):
        rasterization(**scene)
    with pytest.raises(ValueError, match="distributed"):
        render(scene, distributed=True)
    with pytest.raises(ValueError, match="pinhole"):
        render(scene, camera_model="fisheye")
    with pytest.raises(ValueError, match="one device"):
        render({**scene, "Ks": scene["Ks"].to("meta")})
    with pytest.raises(ValueError, match="CUDA .* or CPU"):
        render({k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in scene.items()})
    with pytest.raises(ValueError, match="quats"):
        render({**scene, "quats": scene["quats"][:, :3]})
    with pytest.raises(ValueError, match="sh_degree"):
        render({**scene, "colors": torch.rand(10, 4, 3)}, sh_degree=2)
    with pytest.raises(ValueError, match="render_mode"):
        render(scene, render_mode="RGBD")
    with pytest.raises(ValueError, match="backgrounds"):
        render(scene, backgrounds=torch.rand(1, 4))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to run gsplat's kernels")
@pytest.mark.parametrize("rasterize_mode,render_mode", [("classic", "RGB"), ("antialiased", "RGB+ED")])
def test_cpu_matches_gsplat_cuda(rasterize_mode: str, render_mode: str) -> None:
    """Forward outputs, radii and gradients of the CPU backend agree with gsplat's CUDA kernels."""
    scene = make_scene(3000, 96, 64, n_cameras=2, sh_degree=3, seed=7, dtype=torch.float32, scale=0.03)
    names = ("means", "quats", "scales", "opacities", "colors")
    results: List[tuple] = []
    for device in ("cpu", "cuda"):
        params = {k: scene[k].detach().to(device).requires_grad_(True) for k in names}
        rest = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in scene.items() if k not in names}
        out, alpha, info = rasterization(
            **params,
            **rest,
            sh_degree=3,
            packed=False,
            render_mode=render_mode,
            rasterize_mode=rasterize_mode,
            absgrad=True,
        )
        info["means2d"].retain_grad()
        w = torch.linspace(-1, 1, out.numel(), device=device).reshape(out.shape)
        ((out * w).sum() + alpha.sum()).backward()
        results.append(
            tuple(
                t.detach().cpu()
                for t in (
                    out,
                    alpha,
                    info["radii"],
                    info["means2d"],
                    info["means2d"].grad,
                    info["means2d"].absgrad,
                    *(params[k].grad for k in names),
                )
            )
        )
    cpu, cuda = results
    assert (cpu[2] != cuda[2]).float().mean() < 1e-3  # radii: float rounding may flip an integer ceiling
    visible = (cpu[2] > 0) & (cuda[2] > 0)
    torch.testing.assert_close(cpu[3][visible], cuda[3][visible], rtol=1e-4, atol=1e-3)
    for got, expected in zip(cpu[:2], cuda[:2]):  # a pair right at alpha = 1/255 may flip: allow a few pixels
        close = torch.isclose(got, expected, rtol=1e-3, atol=1e-4)
        assert close.float().mean() > 0.999 and (got - expected).abs().max() < 2e-2
    for got, expected in zip(cpu[4:], cuda[4:]):
        assert torch.linalg.norm(got - expected) <= 2e-2 * torch.linalg.norm(expected)


def test_projected_radii_equal_the_rasterizer_radii() -> None:
    from odin_nerfstudio.rendering.rasterize import projected_radii

    generator = torch.Generator().manual_seed(7)
    means = torch.randn(300, 3, generator=generator) * 2 + torch.tensor([0.0, 0.0, 4.0])
    quats = torch.randn(300, 4, generator=generator)
    scales = torch.rand(300, 3, generator=generator) * 0.2
    viewmats, Ks = torch.eye(4)[None], torch.tensor([[[30.0, 0, 20], [0, 30.0, 15], [0, 0, 1]]])
    _, _, info = rasterization(
        means,
        quats,
        scales,
        torch.full((300,), 0.5),
        torch.rand(300, 3, generator=generator),
        viewmats,
        Ks,
        40,
        30,
        packed=False,
    )
    radii = projected_radii(means, quats, scales, viewmats, Ks, 40, 30)
    assert torch.equal(radii, info["radii"])
    assert 0 < int((radii > 0).sum()) < 300


def test_backward_is_bit_identical_at_the_default_thread_count(default_torch_threads: int) -> None:
    """Gradients do not depend on how torch's intra-op threads are scheduled: the same backward five times gives the
    same bits. Gathers with duplicate ids must not back-propagate through `x[ids]`: on CPU its backward,
    `index_put_(accumulate=True)`, adds float32 in parallel atomics (>= 32768 elements, > 1 thread) in whatever
    order the threads run."""
    scene = make_scene(300, 96, 72, sh_degree=1, seed=7, dtype=torch.float32, scale=0.1)
    leaves = {name: scene[name].requires_grad_(True) for name in ("means", "quats", "scales", "opacities", "colors")}
    target = torch.rand(1, 72, 96, 3, generator=torch.Generator().manual_seed(3))
    runs = []
    for _ in range(5):
        for leaf in leaves.values():
            leaf.grad = None
        out, _, info = render(scene, sh_degree=1)
        info["means2d"].retain_grad()
        ((out - target) ** 2).mean().backward()
        runs.append({"means2d": info["means2d"].grad, **{name: leaf.grad for name, leaf in leaves.items()}})
    assert torch.get_num_threads() == default_torch_threads > 1
    assert int((info["radii"] > 0).sum()) > 200, "most Gaussians must be drawn, with many pixels each"
    for run in runs[1:]:
        for name, grad in runs[0].items():
            assert torch.equal(run[name], grad), f"{name}.grad differs between identical runs"
