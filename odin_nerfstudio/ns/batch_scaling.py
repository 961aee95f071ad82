"""The batch rule: learning rates, Adam's momenta and every schedule of a W x B step, counted in views.

Three rules (``--pipeline.model.batch-scaling``): ``adaptive`` (the default), Grendel's rule below with the learning
rates' sqrt(W x B) times a measured gain sqrt(r) (``core/batch_gain.py``); ``sqrt``, Grendel's rule as it is; ``off``,
every rate and count as configured, per iteration (``True`` / ``False`` still mean ``adaptive`` / ``off``).

Why: one odin-splat iteration publishes ONE selective-Adam update from the W x B views of a schedule step, while the
configs (splatfacto's learning rates, their schedulers, the densification intervals) are written for one view per
update. Without a rule, 4 workers take 4x fewer, 4x larger updates over the same views and densify 4x later in
epochs. Grendel-GS (github:nyu-systems/Grendel-GS at 6e50e9a, ``scene/gaussian_model.py``,
``GaussianModel.training_setup``, ``lr_scale_mode == "sqrt"``; ``train_internal.py`` divides the gradients by
``bsz``; ``densification.py`` counts its intervals in images) scales for a batch of ``bsz`` images:

    lr *= sqrt(bsz)      betas = (beta1 ** bsz, beta2 ** bsz)      eps /= sqrt(bsz)      grad = mean over bsz

and counts its schedules in images. The momenta decay once per update, so ``beta ** bsz`` keeps their memory the
same number of views long; ``sqrt(bsz)`` is the square-root scaling of the step size with the batch, exact when the
views' gradients are independent (Grendel's "independent gradients hypothesis": Adam's step on a sum of ``bsz``
uncorrelated gradients is sqrt(bsz) one-view steps long, as ``bsz`` one-view steps in random directions are).
``benchmarks/bench_batch.py`` measures the hypothesis on its scene: r = ||sum of the views' gradients||^2 over the
sum of their squared norms is 1 when they are independent and ``bsz`` when identical, and Adam's step on the sum
matches ``bsz`` one-view steps at about lr x sqrt(bsz x r) (r is a ratio over a whole group, Adam's per coordinate).
It holds late and fails early: on CPU at 80x60 with 4 views, r is 1.6 to 3.2 after 26 views, 1.1 to 2.4 after 101
and 0.75 to 1.2 after 400 (kermit_320 and fern, BENCHMARKS.md), so in the first hundred views sqrt(bsz) takes
shorter steps than one worker, and a short run of 4 workers ends below one worker's (fern, ibid.).

Hence the adaptive rule: lr x sqrt(bsz) x sqrt(r), with r measured on the steps themselves (the runtime sums the
squared norms of each task's gradient in task and worker order, they travel with the exchange, and the merged
gradient gives the numerator), averaged over the views Adam's first moment remembers, clamped to [1, bsz], and taken
from the steps already wholly published (a step published in two parts, priority publication's, uses one gain).
``core/batch_gain.py`` says why each choice; betas ** bsz, eps and the schedules counted in views are Grendel's.
On fern (24 seeds per side, BENCHMARKS.md) the median of 4 workers under it ends 0.10 dB above one worker's (90%
interval -0.10 to +0.28 dB; Grendel's rule: 2.38 dB below on 3 seeds, BENCHMARKS.md at a24cf35); the gains it
measured on the steps' views were 1.16 to 1.8 at the end (r above the random view sets' 1: a schedule step's views
are not a random draw).

Grendel's densification statistics are per image (``GaussianModel.add_densification_stats`` once per camera of the
batch, on that camera's screen-space gradient, not divided by ``bsz``) and so are ours (the runtime accumulates each
task's, one view's, statistics), so the densification threshold needs no scaling.

One difference remains: Grendel steps a dense Adam, ours is selective (a row's moments move only at the updates
that touch it), so ``beta ** bsz`` decays a row seen in k < bsz of a step's views as if it had been seen bsz times.
Where every view sees most Gaussians this is immaterial (kermit_320 at 80x60: 97% of them per view, measured once
after 1 and 200 views).

Sum, not mean: Odin's step SUMS the W x B views' gradients (``core/sparse.py``'s ``sum_in_order``, the reference
semantics of docs/design.md), i.e. exactly ``bsz`` times Grendel's mean, for every row and step (Grendel divides by
``bsz``, not by a row's visible count). Adam is invariant to a constant factor c on its gradients except for eps:
m -> c m, sqrt(v) -> c sqrt(v), so the update lr m / (sqrt(v) + eps) equals the mean's with eps / c. Hence, for a
sum, the learning rate takes the same ``sqrt(bsz)`` and eps is MULTIPLIED by ``sqrt(bsz)`` (= bsz x Grendel's
eps / sqrt(bsz)); dividing it, as Grendel does for its mean, would shrink it bsz-fold further. (With splatfacto's
eps of 1e-15 this matters only for rows with vanishing gradients, but it is the exact equivalent.)

Counting in views: a config field keeps its splatfacto meaning, iterations of a one-view run. The refinement, the
opacity reset, the SH degree and the resolution follow the views a step trains (:meth:`BatchScaling.first_view`;
``adapter/gsplat.py``'s ``ViewCountedStrategy``): a step refines where one of its views is one a one-view run refines
after, so W x B workers refine as often and after the same views, to within a step. Converting each interval to
steps instead would round it (50 views at 4 a step: 13 steps, a refinement after views 104, 156, ..., one more
than a one-view run's over kermit_320's 700 views of densification; BENCHMARKS.md, bench_quality). The learning
rates' schedulers count steps (nerfstudio steps them once per optimizer update), so :meth:`BatchScaling.steps`
converts their lengths, rounded to the nearest step. The batch is the schedule's nominal step size: the short last
step of an epoch (V not a multiple of W x B) is counted as a full one.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, Tuple

from nerfstudio.engine.schedulers import ExponentialDecaySchedulerConfig

from odin_nerfstudio.core.batch_gain import AdaptiveGain

FLAG = "--pipeline.model.batch-scaling"
RULES = ("adaptive", "sqrt", "off")
"""The batch rules, by the flag's values."""
OFF_FLAG = f"{FLAG} off"


@dataclass(frozen=True)
class BatchScaling:
    """Grendel's rule for a step that sums ``views_per_step`` views' gradients (1: the identity, a one-view run),
    with the adaptive gain on its learning rates when ``adaptive``."""

    views_per_step: int = 1
    """W x B: the views whose gradients one optimizer update sums."""
    adaptive: bool = False
    """Whether the runtime scales the learning rates by the measured gain sqrt(r) too (:meth:`gain`)."""

    def __post_init__(self) -> None:
        if not isinstance(self.views_per_step, int) or self.views_per_step < 1:
            raise ValueError(f"views_per_step must be an integer >= 1, got {self.views_per_step!r}")

    @property
    def lr_scale(self) -> float:
        """sqrt(W x B): the factor on every learning rate (and, for a gradient sum, on Adam's eps)."""
        return math.sqrt(self.views_per_step)

    def gain(self) -> AdaptiveGain | None:
        """The runtime's adaptive gain for this batch, or None (Grendel's sqrt only, or a one-view step)."""
        return AdaptiveGain(self.views_per_step) if self.adaptive and self.views_per_step > 1 else None

    def first_view(self, step: int) -> int:
        """The first of the views step ``step`` trains, counted as a one-view run counts its iterations."""
        return step * self.views_per_step

    def steps(self, views: int) -> int:
        """A count of one-view iterations (an interval or a threshold) in schedule steps: views / (W x B) rounded to
        the nearest step (half up), and at least 1 when ``views`` > 0 (0 and negatives stay as they are)."""
        if views <= 0:
            return views
        return max(1, math.floor(views / self.views_per_step + 0.5))

    def adam(self, lr: float, betas: Tuple[float, float], eps: float) -> Tuple[float, Tuple[float, float], float]:
        """Adam's (lr, betas, eps) for a W x B gradient sum: lr x sqrt(S), beta ** S, eps x sqrt(S) (S = W x B)."""
        scale, size = self.lr_scale, self.views_per_step
        return lr * scale, (betas[0] ** size, betas[1] ** size), eps * scale

    def optimizers(self, config: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
        """A copy of a nerfstudio ``optimizers`` config (per group: ``optimizer``, ``scheduler``) under the rule.

        Each optimizer config needs ``lr``, ``betas`` and ``eps`` (``SelectiveAdamOptimizerConfig``); each scheduler
        is None or an ``ExponentialDecaySchedulerConfig``, whose absolute rates are scaled like ``lr`` and whose step
        counts are converted from views. Anything else is refused, naming the group and the flag that turns the rule
        off, rather than left unscaled.
        """
        scaled = copy.deepcopy(config)
        if self.views_per_step == 1:
            return scaled
        for name, group in scaled.items():
            optimizer = group["optimizer"]
            if not all(hasattr(optimizer, field) for field in ("lr", "betas", "eps")):
                raise ValueError(
                    f"batch scaling: the optimizer of {name!r} ({type(optimizer).__name__}) has no lr, betas and eps "
                    f"to scale; use SelectiveAdamOptimizerConfig or turn the rule off ({OFF_FLAG})"
                )
            lr, betas, eps = self.adam(optimizer.lr, tuple(optimizer.betas), optimizer.eps)
            optimizer.lr, optimizer.betas, optimizer.eps = lr, betas, eps
            group["scheduler"] = self._scheduler(name, group.get("scheduler"))
        return scaled

    def _scheduler(self, name: str, scheduler: Any) -> Any:
        """An exponential-decay scheduler config with its rates scaled and its step counts in schedule steps."""
        if scheduler is None:
            return None
        if type(scheduler) is not ExponentialDecaySchedulerConfig:
            raise ValueError(
                f"batch scaling: the scheduler of {name!r} ({type(scheduler).__name__}) is not an "
                f"ExponentialDecaySchedulerConfig, whose steps the rule knows how to count; turn the rule off "
                f"({OFF_FLAG})"
            )
        return dataclasses.replace(
            scheduler,
            lr_pre_warmup=scheduler.lr_pre_warmup * self.lr_scale,
            lr_final=None if scheduler.lr_final is None else scheduler.lr_final * self.lr_scale,
            warmup_steps=self.steps(scheduler.warmup_steps),
            max_steps=self.steps(scheduler.max_steps),
        )


def batch_scaling(rule: str | bool, num_workers: int, views_per_worker: int) -> BatchScaling:
    """The rule named by the flag's value (one of :data:`RULES`; True / False: adaptive / off) for a schedule of
    ``num_workers`` x ``views_per_worker`` views per step; the identity when off."""
    if isinstance(rule, bool):
        rule = "adaptive" if rule else "off"
    if rule not in RULES:
        raise ValueError(f"{FLAG} {rule!r}: choose one of {', '.join(RULES)}")
    return BatchScaling(1 if rule == "off" else num_workers * views_per_worker, adaptive=rule == "adaptive")
