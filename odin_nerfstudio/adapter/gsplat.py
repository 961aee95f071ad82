"""gsplat at the edge: the one module that knows gsplat's render meta, densification statistics and refinement.

The runtime (``odin_nerfstudio/runtime``) sees a render only through a :class:`~odin_nerfstudio.runtime.adapter.
RenderAdapter`; :class:`GsplatAdapter` is gsplat's: the active rows of a render are those with ``radii > 0``
(``gaussian_ids`` when packed), ``means2d.retain_grad()`` runs before backward so that the task's densification
statistics (``DefaultStrategy._update_state``'s arithmetic, in global rows) can be staged beside its gradients as a
plain ``dict[str, Tensor]``, and the bounding spheres use ``exp`` of gsplat's log-scales.

Refinement (densify, prune, opacity reset) runs behind the runtime's drain barrier between two steps, with the
conditions and ops of ``DefaultStrategy.step_post_backward``; the statistics are already accumulated per task by
the runtime, so only the edits are made here. A split's random samples are drawn per row from (seed, step, global
id) (``core/row_random.py``), so every worker, every re-run and every shard of a sharded run makes the same edit.

gsplat's private functions the project relies on are imported here and nowhere else (the rendering layer takes
them from this module); ``tests/adapter/test_gsplat_pins.py`` pins their source, so a gsplat upgrade that changes
one fails loudly. See ``docs/architecture.md`` for where the adapter sits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from gsplat.cuda._torch_impl import _persp_proj, _quat_scale_to_covar_preci, _spherical_harmonics, _world_to_cam
from gsplat.cuda._wrapper import fully_fused_projection
from gsplat.strategy import DefaultStrategy
from gsplat.strategy.ops import _update_param_with_optimizer, duplicate, reset_opa
from gsplat.utils import normalized_quat_to_rotmat
from torch import Tensor

from odin_nerfstudio.core.row_random import row_normals
from odin_nerfstudio.core.tables import index_map_from_uid

__all__ = [
    "STATS_SCHEMA",
    "GsplatAdapter",
    "ViewCountedStrategy",
    "accumulate",
    "apply_structural_change",
    "edit_rows",
    "fully_fused_projection",
    "refine_due",
    "reset_due",
    "structural_change_due",
    "task_stats",
    "_persp_proj",
    "_quat_scale_to_covar_preci",
    "_spherical_harmonics",
    "_world_to_cam",
]

STATS_SCHEMA = {"rows": torch.int64, "grad2d": torch.float32, "radii": torch.float32}
"""One task's densification statistics: global rows of its visible entries (one per camera and visible Gaussian),
the norm of each entry's normalized screen-space gradient and its radius normalized by max(width, height), each
[M]; what the transports carry per task (their wire dtypes)."""


class GsplatAdapter:
    """The runtime's view of gsplat's renders (:class:`~odin_nerfstudio.runtime.adapter.RenderAdapter`).

    Args:
        packed: whether the rasterizer runs packed (``radii`` [nnz] with ``gaussian_ids``) or not ([C, M]).
        absgrad: whether the statistics use ``means2d.absgrad`` (``DefaultStrategy(absgrad=True)``).
        log_scales: whether ``params["scales"]`` holds log-scales (gsplat's convention) rather than scales.
    """

    stats_schema = STATS_SCHEMA

    def __init__(self, packed: bool = False, absgrad: bool = False, log_scales: bool = True) -> None:
        self.packed = packed
        self.absgrad = absgrad
        self.log_scales = log_scales

    def world_scales(self, scales: Tensor) -> Tensor:
        """World-space scales [M, 3] of parameter rows ``scales`` [M, 3] (exp of gsplat's log-scales)."""
        scales = scales.detach()
        return torch.exp(scales) if self.log_scales else scales

    def scale_growth(self, step: float) -> float:
        """exp(step) for log-scales (a world scale is exp of its parameter); unbounded for linear scales."""
        return math.exp(step) if self.log_scales else math.inf

    def before_backward(self, info: dict[str, Any]) -> None:
        """Keep the screen-space means' gradient (gsplat's statistics read ``means2d.grad`` after backward)."""
        if "means2d" in info and info["means2d"].requires_grad:
            info["means2d"].retain_grad()

    def active_mask(self, info: dict[str, Any], size: int) -> Tensor | None:
        """Which of C(t)'s ``size`` rows are in A(t), the rows with radii > 0, bool [size]; None without radii (the
        compaction into rows is the staging op's, ``kernels.ops.stage_rows``)."""
        if "radii" not in info:
            return None
        if self.packed:
            visible = torch.zeros(size, dtype=torch.bool, device=info["radii"].device)
            visible[info["gaussian_ids"]] = True
        else:
            radii = info["radii"].reshape(-1, size)
            visible = radii[0] > 0 if radii.shape[0] == 1 else (radii > 0).any(dim=0)
        return visible

    def task_stats(self, info: dict[str, Any], candidate: Tensor) -> dict[str, Tensor] | None:
        """The task's densification statistics in global rows (:data:`STATS_SCHEMA`); None without ``means2d``."""
        if "means2d" not in info:
            return None
        return task_stats(info, candidate, self.packed, self.absgrad)

    def accumulate(self, state: dict[str, Any], stats: dict[str, Tensor], num_primitives: int) -> None:
        """Add one task's statistics to gsplat's strategy state (see :func:`accumulate`)."""
        accumulate(state, stats, num_primitives)


def task_stats(info: dict[str, Any], candidate: Tensor, packed: bool, absgrad: bool = False) -> dict[str, Tensor]:
    """A task's statistics in global rows, as ``DefaultStrategy._update_state`` computes them.

    Args:
        info: the rasterizer's meta after backward (``means2d`` with ``.grad`` or ``.absgrad``, ``radii``,
            ``width``, ``height``, ``n_cameras``, and ``gaussian_ids`` when packed); ids index the gathered rows.
        candidate: the task's candidate set, sorted int64 [M_c] (gathered row i is global row candidate[i]).
        packed: whether the rasterizer ran packed (means2d [nnz, 2]) or not (means2d [C, M_c, 2]).
        absgrad: use ``means2d.absgrad`` as gsplat's ``absgrad=True``.

    Returns:
        ``rows`` int64 [M], ``grad2d`` [M] and ``radii`` [M] (:data:`STATS_SCHEMA`).
    """
    grads = (info["means2d"].absgrad if absgrad else info["means2d"].grad).clone()
    grads[..., 0] *= info["width"] / 2.0 * info["n_cameras"]
    grads[..., 1] *= info["height"] / 2.0 * info["n_cameras"]
    if packed:
        local_ids = info["gaussian_ids"]
        radii = info["radii"]
    else:
        visible = info["radii"] > 0.0
        local_ids = torch.where(visible)[1]
        grads = grads[visible]
        radii = info["radii"][visible]
    return {
        "rows": candidate[local_ids],
        "grad2d": grads.norm(dim=-1),
        "radii": radii / float(max(info["width"], info["height"])),
    }


def accumulate(state: dict[str, Any], stats: dict[str, Tensor], num_primitives: int) -> None:
    """Add one task's statistics to gsplat's strategy state (creating its tensors on first use, as gsplat does).

    Args:
        state: DefaultStrategy state (``grad2d``, ``count`` and, when present, ``radii``), [N] each.
        stats: the task's statistics (:data:`STATS_SCHEMA`).
        num_primitives: N, for first use.
    """
    rows, grad2d = stats["rows"], stats["grad2d"]
    device = grad2d.device
    if state.get("grad2d") is None:
        state["grad2d"] = torch.zeros(num_primitives, device=device)
    if state.get("count") is None:
        state["count"] = torch.zeros(num_primitives, device=device)
    state["grad2d"].index_add_(0, rows, grad2d)
    state["count"].index_add_(0, rows, torch.ones_like(rows, dtype=torch.float32))
    if "radii" in state:
        if state["radii"] is None:
            state["radii"] = torch.zeros(num_primitives, device=device)
        state["radii"][rows] = torch.maximum(state["radii"][rows], stats["radii"])


@dataclass
class ViewCountedStrategy(DefaultStrategy):
    """gsplat's ``DefaultStrategy`` whose intervals count one-view iterations (splatfacto's config, unconverted), run
    ``views_per_step`` views a step (W x B, the batch rule's): step s trains views s x S to s x S + S - 1, and it
    refines (resets) where one of those is a view a one-view run refines (resets) after. W x B workers thus refine
    after the same views as one worker, to within a step, and as often; steps rounded from views would not (50 views
    a refinement at 4 views a step rounded to 13 steps refines after views 104, 156, ... instead of 150, 200, ...;
    the batch rule, ``ns/batch_scaling.py``, says why the schedules count views)."""

    views_per_step: int = 1


def step_views(strategy: DefaultStrategy, step: int) -> range:
    """The one-view iterations that schedule step ``step`` trains (a plain ``DefaultStrategy``: one a step)."""
    size = strategy.views_per_step if isinstance(strategy, ViewCountedStrategy) else 1
    return range(step * size, (step + 1) * size)


def refine_view(strategy: DefaultStrategy, step: int) -> int | None:
    """The first view of ``step`` after which gsplat would densify and prune (its rule at that iteration), or None."""
    for view in step_views(strategy, step):
        if (
            strategy.refine_start_iter < view < strategy.refine_stop_iter
            and view % strategy.refine_every == 0
            and view % strategy.reset_every >= strategy.pause_refine_after_reset
        ):
            return view
    return None


def refine_due(strategy: DefaultStrategy, step: int) -> bool:
    """Whether gsplat would densify and prune after `step` (the statistics of steps <= `step` are in)."""
    return refine_view(strategy, step) is not None


def reset_due(strategy: DefaultStrategy, step: int) -> bool:
    """Whether gsplat would reset the opacities after `step`."""
    views = step_views(strategy, step)
    return any(view < strategy.refine_stop_iter and view % strategy.reset_every == 0 for view in views)


def structural_change_due(strategy: DefaultStrategy, step: int) -> bool:
    """Whether any structural change follows `step`."""
    return refine_due(strategy, step) or reset_due(strategy, step)


def apply_structural_change(
    strategy: DefaultStrategy,
    params: dict[str, torch.nn.Parameter],
    optimizers: dict[str, torch.optim.Optimizer],
    state: dict[str, Any],
    step: int,
    seed: int,
) -> Tensor:
    """Densify, prune and reset as gsplat would after `step`; returns the index map, int64 [N_new] (new -> old row).

    The statistics in `state` must hold every task of steps <= `step`; they are zeroed after a refinement, as
    gsplat does. An opacity reset changes values, not rows: its index map is the identity. The rows are the global
    ids (the replicated model); a shard passes its own to :func:`edit_rows`.
    """
    ids = torch.arange(params["means"].shape[0], device=params["means"].device)
    return edit_rows(strategy, params, optimizers, state, step, seed, ids)[0]


GROUPS = 4
"""Where gsplat's edit puts a row, in order: kept (not split), a duplicate, a split's first child, its second."""


def edit_rows(
    strategy: DefaultStrategy,
    params: dict[str, torch.nn.Parameter],
    optimizers: dict[str, torch.optim.Optimizer],
    state: dict[str, Any],
    step: int,
    seed: int,
    ids: Tensor,
) -> tuple[Tensor, Tensor]:
    """The structural change of rows whose global ids are ``ids`` (sorted int64 [N]): the whole model's, or a shard's.

    gsplat's ``_grow_gs`` and ``_prune_gs`` rules (pinned), every rule per row; a split's two samples are drawn per
    row from (seed, step, global id) (``core/row_random.py``) rather than from one block for all split rows, so a
    row splits alike whichever rows share its shard. Returns the index map (new row -> old row) and, per new row,
    its place in the order the whole model's edit would give it: ``group x N_all + parent id`` with the group of
    :data:`GROUPS` (kept rows, then duplicates, then first and second children, each by parent id), int64 [N_new].
    """
    state["uid"] = torch.arange(params["means"].shape[0], device=ids.device)
    parents = ids
    view = refine_view(strategy, step)
    if view is not None:
        parents = _grow(strategy, params, optimizers, state, step, view, seed, ids)
        state["tie"] = parents
        strategy._prune_gs(params, optimizers, state, view)  # its rules count views
        parents = state.pop("tie")
        for key in ("grad2d", "count", "radii"):
            if state.get(key) is not None:
                state[key].zero_()
    if reset_due(strategy, step):
        reset_opa(params=params, optimizers=optimizers, state=state, value=strategy.prune_opa * 2.0)
    return index_map_from_uid(state.pop("uid")), parents


def _grow(
    strategy: DefaultStrategy,
    params: dict[str, torch.nn.Parameter],
    optimizers: dict[str, torch.optim.Optimizer],
    state: dict[str, Any],
    step: int,
    view: int,
    seed: int,
    ids: Tensor,
) -> Tensor:
    """``DefaultStrategy._grow_gs`` (duplicate small rows with high gradients, split large ones) with per-row split
    draws, after ``step``'s view ``view`` (:func:`refine_view`); returns each new row's order key (see
    :func:`edit_rows`), int64 [N_new]."""
    count = state["count"]
    grads = state["grad2d"] / count.clamp_min(1)
    is_grad_high = grads > strategy.grow_grad2d
    is_small = torch.exp(params["scales"]).max(dim=-1).values <= strategy.grow_scale3d * state["scene_scale"]
    is_dupli = is_grad_high & is_small
    is_split = is_grad_high & ~is_small
    if view < strategy.refine_scale2d_stop_iter:
        is_split |= state["radii"] > strategy.grow_scale2d
    total = torch.iinfo(torch.int64).max // GROUPS
    keys = ids.clone()
    if bool(is_dupli.any()):
        duplicate(params=params, optimizers=optimizers, state=state, mask=is_dupli)
        keys = torch.cat([keys, total + ids[is_dupli]])
    is_split = torch.cat([is_split, torch.zeros(keys.numel() - is_split.numel(), dtype=torch.bool, device=ids.device)])
    if bool(is_split.any()):
        parents = keys[is_split]  # split rows are kept rows: their keys are their ids
        _split(params, optimizers, state, is_split, strategy.revised_opacity, row_normals(seed, step, parents, 6))
        keys = torch.cat([keys[~is_split], 2 * total + parents, 3 * total + parents])
    return keys


@torch.no_grad()
def _split(
    params: dict[str, torch.nn.Parameter],
    optimizers: dict[str, torch.optim.Optimizer],
    state: dict[str, Any],
    mask: Tensor,
    revised_opacity: bool,
    normals: Tensor,
) -> None:
    """gsplat 1.4.0's ``ops.split`` with the samples' normals given (``normals`` float32 [S, 6]: per split row, its
    two children's) and the rotation applied element-wise (a row's sample does not depend on the others')."""
    sel, rest = torch.where(mask)[0], torch.where(~mask)[0]
    scales = torch.exp(params["scales"][sel])
    rotmats = normalized_quat_to_rotmat(torch.nn.functional.normalize(params["quats"][sel], dim=-1))
    samples = []
    for child in range(2):
        local = scales * normals[:, 3 * child : 3 * child + 3].to(scales.device)
        samples.append(rotmats[..., 0] * local[:, None, 0] + rotmats[..., 1] * local[:, None, 1]
                       + rotmats[..., 2] * local[:, None, 2])
    samples = torch.stack(samples)  # [2, S, 3]

    def param_fn(name: str, p: Tensor) -> Tensor:
        repeats = [2] + [1] * (p.dim() - 1)
        if name == "means":
            split = (p[sel] + samples).reshape(-1, 3)
        elif name == "scales":
            split = torch.log(scales / 1.6).repeat(2, 1)
        elif name == "opacities" and revised_opacity:
            split = torch.logit(1.0 - torch.sqrt(1.0 - torch.sigmoid(p[sel]))).repeat(repeats)
        else:
            split = p[sel].repeat(repeats)
        return torch.nn.Parameter(torch.cat([p[rest], split]))

    def optimizer_fn(key: str, v: Tensor) -> Tensor:
        return torch.cat([v[rest], torch.zeros((2 * len(sel), *v.shape[1:]), device=v.device)])

    _update_param_with_optimizer(param_fn, optimizer_fn, params, optimizers)
    for key, value in state.items():
        if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == mask.shape[0]:
            state[key] = torch.cat((value[rest], value[sel].repeat([2] + [1] * (value.dim() - 1))))
