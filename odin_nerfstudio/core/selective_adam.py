"""Selective (visibility-masked) Adam: update only the rows a step touched, leave every other row untouched.

This is the optimizer of the reference semantics (docs/architecture.md), as gsplat's SelectiveAdam: for the rows ``p`` in
the union of a step's active sets, ``theta[p]``, ``exp_avg[p]`` and ``exp_avg_sq[p]`` follow torch.optim.Adam's
per-element formula; all other rows keep their values bit for bit (no momentum decay, no second-moment decay).

Bias correction counts GLOBAL steps: ``state["step"]`` is one counter per parameter tensor, advanced by every
publication whether or not a given row took part, so a row updated for the first time at step 100 is corrected
with ``1 - beta**100``, never ``1 - beta**1``. This is what a per-tensor Adam with masked updates does (gsplat's
SelectiveAdam behaves the same way) and it keeps the correction independent of which worker touched a row.

Each optimizer is a real ``torch.optim.Optimizer`` with one parameter group holding one parameter tensor, the
layout gsplat's strategies expect (``optimizers: Dict[str, Optimizer]``), so gsplat's ``ops.duplicate``,
``split``, ``remove`` and ``reset_opa`` remap its ``exp_avg`` / ``exp_avg_sq`` exactly as they do Adam's.

The arithmetic on the selected rows is the one of ``torch.optim.Adam(foreach=False)``'s single-tensor path
(``lerp_``, ``mul_().addcmul_()``, ``sqrt() / bias_correction2_sqrt``, ``add_(eps)``, ``addcdiv_``) applied to
the gathered rows; these are element-wise kernels, so with every row selected the result is bit-identical to
torch's Adam (tested). Weight decay, amsgrad and maximize are not supported. A step takes the group's ``lr`` times
its batch gain, 1 unless the runtime's adaptive batch rule sets one (``core/batch_gain.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor

from odin_nerfstudio.core.batch_gain import GAIN_KEY, scaled_lr


def adam_constants(group: dict, step: float) -> tuple[float, float]:
    """Adam's step size and bias correction at global step ``step`` of a parameter group: ``lr x batch gain /
    (1 - beta1^t)`` and ``sqrt(1 - beta2^t)``, as torch.optim.Adam's single-tensor path computes them."""
    beta1, beta2 = group["betas"]
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    return scaled_lr(group) / bias_correction1, bias_correction2**0.5


class SelectiveAdam(torch.optim.Optimizer):
    """Adam over one parameter tensor [N, ...] that updates only a given set of rows per step.

    Args:
        params: the parameter tensors (gsplat's layout uses exactly one per optimizer).
        lr: learning rate.
        betas: Adam's (beta1, beta2).
        eps: added to the denominator (gsplat's and nerfstudio's splatting use 1e-15).
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-15,
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps})
        for group in self.param_groups:
            for param in group["params"]:
                self._state_of(param)

    def _state_of(self, param: Tensor) -> dict[str, Tensor]:
        """The Adam state of ``param``, created as zeros (step 0) if it has none.

        Created for every parameter at construction (allocating two model-sized moments is the optimizer's
        set-up, not part of the first publication), and again for a parameter that gsplat's ops replaced
        without carrying state.
        """
        state = self.state[param]
        if not state:
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        return state

    @torch.no_grad()
    def step_rows(self, rows: Tensor, grads: list[Tensor], advance: bool = True, finish: bool = True) -> list[Tensor]:
        """Advance the global step and apply Adam to ``rows`` only.

        Args:
            rows: sorted, unique rows to update, int64 [M] (may be empty: the step still counts).
            grads: one gradient per parameter of the optimizer (in ``param_groups`` order), [M, ...] each,
                aligned with ``rows``.
            advance: whether this call advances the global step (False: a later part of a step published in
                parts, the runtime's priority publication, at the step the first part advanced to).
            finish: whether this call ends the step (runs the post-hooks; False: a first part).

        Returns:
            Per parameter, its new values on ``rows`` [M, ...] (what was just written; a caller that keeps
            something derived from them, as the runtime's culling bounds, need not gather them again).

        This is the optimizer's step: it runs the hooks registered with torch's ``register_step_post_hook`` (a
        trainer steps its learning-rate schedulers there, once per publication) and tells torch's LR schedulers
        that a step ran.
        """
        params = [p for group in self.param_groups for p in group["params"]]
        if len(grads) != len(params):
            raise ValueError(f"step_rows got {len(grads)} gradients for {len(params)} parameters")
        index = 0
        updated = []
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                grad = grads[index]
                index += 1
                state = self._state_of(param)
                step_size, bias_correction2_sqrt = adam_constants(group, self.advance_step(param, advance))
                exp_avg = state["exp_avg"].index_select(0, rows)
                exp_avg_sq = state["exp_avg_sq"].index_select(0, rows)
                value = param.data.index_select(0, rows)
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = exp_avg_sq.sqrt().div_(bias_correction2_sqrt).add_(group["eps"])
                value.addcdiv_(exp_avg, denom, value=-step_size)
                state["exp_avg"].index_copy_(0, rows, exp_avg)
                state["exp_avg_sq"].index_copy_(0, rows, exp_avg_sq)
                param.data.index_copy_(0, rows, value)
                updated.append(value)
        if finish:
            self.finish_step()
        return updated

    def advance_step(self, param: Tensor, advance: bool = True) -> float:
        """Count a publication on ``param``'s global step (unless not ``advance``: a later part of a step published
        in parts); the step now. The counter is a CPU tensor (:meth:`_state_of`): reading it never waits for a device.
        """
        state = self._state_of(param)
        if advance:
            state["step"] += 1
        return state["step"].item()

    def finish_step(self) -> None:
        """End a step after its update: mark the optimizer stepped (torch's LR schedulers check it) and run the hooks
        registered with ``register_step_post_hook`` (a trainer steps its schedulers there, once per publication)."""
        self._opt_called = True
        for hook in list(self._optimizer_step_post_hooks.values()):
            hook(self, (), {})

    def movement_bound(self, steps_ahead: int = 0, gain: float | None = None, lr: float | None = None) -> float:
        """The most a publication at the current global step count (plus ``steps_ahead``: 1 for the next
        publication) moves any element of the parameter, for any gradients: lr x sqrt(1 - beta2^t) / (1 - beta1^t) x (1 - beta1) / sqrt(1 - beta2) / (1 - beta1 / sqrt(beta2)),
        with 1% for rounding (inf if beta1 >= sqrt(beta2), or no step counted yet). ``gain``: the batch gain to
        bound with instead of the group's (``core/batch_gain.py``; its largest value while that publication's gain
        is not set yet); ``lr``: the learning rate that publication takes instead of the group's now (a scheduler
        may change it before then).

        Why it holds: a row's v_j >= (1 - beta2) beta2^k g_{j-k}^2 for each of its past gradients, so each is at most
        sqrt(v_j / ((1 - beta2) beta2^k)), and m_j sums them with weights (1 - beta1) beta1^k: |m_j| / sqrt(v_j) is at
        most the geometric series above, whatever the rows' own update counts j; eps only shrinks the step.
        """
        (group,) = self.param_groups
        (param,) = group["params"]
        beta1, beta2 = group["betas"]
        step = float(self._state_of(param)["step"]) + steps_ahead
        ratio = beta1 / math.sqrt(beta2)
        if ratio >= 1.0 or step < 1.0:
            return math.inf
        series = (1.0 - beta1) / math.sqrt(1.0 - beta2) / (1.0 - ratio)
        base = group["lr"] if lr is None else lr
        lr = base * (group.get(GAIN_KEY, 1.0) if gain is None else gain)
        return 1.01 * lr * math.sqrt(1.0 - beta2**step) / (1.0 - beta1**step) * series

    def step(self, closure: None = None) -> None:  # type: ignore[override]
        """Not supported: a selective optimizer must be told its rows; use :meth:`step_rows`."""
        raise RuntimeError("SelectiveAdam updates only given rows: call step_rows(rows, grads)")


def selective_adams(
    params: dict[str, Tensor],
    lrs: dict[str, float],
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-15,
) -> dict[str, SelectiveAdam]:
    """One :class:`SelectiveAdam` per parameter name, gsplat's ``optimizers`` layout.

    Args:
        params: per name, the parameter tensor [N, ...] (``torch.nn.Parameter`` for gsplat's ops).
        lrs: per name, its learning rate.
        betas: Adam's (beta1, beta2), shared.
        eps: Adam's epsilon, shared.
    """
    return {name: SelectiveAdam([param], lr=lrs[name], betas=betas, eps=eps) for name, param in params.items()}
