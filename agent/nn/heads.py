"""Action heads, derived from the env's action space as stable-baselines3 derives its distributions.

Shapes: B batch, T window, d the core's output width, A the head's output size.

- ``Discrete(n)`` -> :class:`CategoricalHead`: n action logits, cross-entropy, held-out metric
  ``accuracy`` (higher is better); acting takes the argmax (or samples the softmax).
- ``Box`` of shape (A,) -> :class:`RegressionHead`: A outputs, mean squared error, metric ``mse``
  (lower is better); acting clips to the box (Udacity: normalised steering in [-1, 1]).

Each head is dense ``d -> hidden`` (activation) ``-> A`` and owns its loss, its metric and how an
output becomes an action, so the trainer and the actors never branch on the simulator.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

ACTIVATIONS = {"relu": nn.ReLU, "elu": nn.ELU, "tanh": nn.Tanh}
#: The target value of padded positions in integer (discrete) targets; float targets use NaN.
IGNORE_INDEX = -100


class ActionHead(nn.Module):
    """Base class. Attributes: ``kind`` ("discrete" or "continuous"), ``metric`` (its name),
    ``higher_is_better``, ``out_dim`` (A)."""

    kind = "discrete"
    metric = "accuracy"
    higher_is_better = True

    def __init__(self, in_dim: int, out_dim: int, hidden: int, activation: str):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}")
        self.out_dim = out_dim
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), ACTIVATIONS[activation](), nn.Linear(hidden, out_dim))

    def forward(self, y: Tensor) -> Tensor:
        """(..., d) -> (..., A)."""
        return self.net(y)

    def loss(self, out: Tensor, target: Tensor, mask: Tensor, weight: Tensor | None = None) -> Tensor:
        """The head's loss over the real positions (``mask``), optionally weighted per position.

        ``weight`` (B, T) float, >= 0, or None: with weights the loss is their weighted mean,
        sum(w * l) / sum(w) over the counted positions (so a weight of 1 everywhere gives the
        unweighted mean). DAgger's edge weights use it (:mod:`agent.train.dagger`)."""
        raise NotImplementedError  # pragma: no cover - abstract

    def metric_sums(self, out: Tensor, target: Tensor, mask: Tensor) -> tuple[float, int]:  # pragma: no cover
        """(sum, count) of the head's held-out metric over the real positions (``mask`` (B, T)
        bool), so batches add up exactly: the metric is sum / count."""
        raise NotImplementedError

    def better(self, a: float, b: float) -> bool:
        """Whether metric value ``a`` beats ``b`` (NaN never beats)."""
        if not np.isfinite(a):
            return False
        return not np.isfinite(b) or (a > b if self.higher_is_better else a < b)


class CategoricalHead(ActionHead):
    """n action logits; cross-entropy on integer targets; accuracy as the metric."""

    kind, metric, higher_is_better = "discrete", "accuracy", True

    def loss(self, out, target, mask, weight=None):
        """out (B, T, n), target (B, T) int64, mask (B, T) bool, weight (B, T) or None -> mean
        cross-entropy over real positions (weighted mean with ``weight``, see :meth:`ActionHead.loss`)."""
        target = target.masked_fill(~mask, IGNORE_INDEX)
        if weight is None:
            return F.cross_entropy(out.flatten(0, -2), target.flatten(), ignore_index=IGNORE_INDEX)
        per = F.cross_entropy(out[mask], target[mask], reduction="none")  # (counted positions,)
        return _weighted_mean(per, weight[mask].to(per.dtype))

    def metric_sums(self, out, target, mask):
        """(correct predictions, counted positions) over the real positions."""
        return int(((out.argmax(-1) == target) & mask).sum()), int(mask.sum())

    def act(self, out: Tensor, deterministic: bool = True) -> Tensor:
        """(B, n) logits -> (B,) int64 actions."""
        if deterministic:
            return out.argmax(-1)
        return torch.distributions.Categorical(logits=out).sample()

    def probs(self, out: Tensor) -> Tensor:
        """(B, n) logits -> (B, n) probabilities."""
        return torch.softmax(out.float(), -1)


class RegressionHead(ActionHead):
    """A continuous outputs; mean squared error; ``mse`` as the metric; actions clipped to [low, high]."""

    kind, metric, higher_is_better = "continuous", "mse", False

    def __init__(self, in_dim: int, out_dim: int, hidden: int, activation: str, low, high):
        super().__init__(in_dim, out_dim, hidden, activation)
        self.register_buffer("low", torch.as_tensor(low, dtype=torch.float32).reshape(out_dim), persistent=False)
        self.register_buffer("high", torch.as_tensor(high, dtype=torch.float32).reshape(out_dim), persistent=False)

    def loss(self, out, target, mask, weight=None):
        """out (B, T, A), target (B, T) or (B, T, A) float, mask (B, T), weight (B, T) or None -> mean
        squared error over real positions (weighted mean with ``weight``, see :meth:`ActionHead.loss`)."""
        target = target.reshape(out.shape)
        if weight is None:
            return ((out - target) ** 2)[mask].mean()
        per = ((out[mask] - target[mask]) ** 2).mean(-1)  # (counted positions,): the mean over the A outputs
        return _weighted_mean(per, weight[mask].to(per.dtype))

    def concordance_loss(self, out: Tensor, target: Tensor, mask: Tensor, weight: Tensor | None = None) -> Tensor:
        """1 - Lin's concordance correlation coefficient between outputs and targets over the counted
        positions, per output, averaged over the A outputs: a loss that does not reward shrinking.

        CCC = 2 cov(y, t) / (var(y) + var(t) + (mean(y) - mean(t))^2) (Lin 1989, "A concordance
        correlation coefficient to evaluate reproducibility", Biometrics 45(1)); 1 - CCC is the usual
        loss of continuous affect regression (e.g. Weninger et al., ICASSP 2016). MSE is minimised by
        the conditional mean, which on a new driver's curves sits near 0 when the features are unsure;
        1 - CCC is minimised only by outputs with the targets' spread and correlation 1, so it pays
        nothing for outputs smaller than the labels. The moments are the batch's (population, weighted
        by ``weight`` when given); with fewer than 2 counted positions, or targets and outputs without
        spread, the term is 0 (no gradient).

        Args:
            out: (B, T, A). target: (B, T) or (B, T, A) float. mask: (B, T) bool, the counted positions.
            weight: (B, T) float >= 0 or None.

        Returns:
            a 0-dim tensor in [0, 2].
        """
        target = target.reshape(out.shape)
        y, t = out[mask], target[mask]  # (N, A)
        if y.shape[0] < 2:
            return out.sum() * 0.0
        w = torch.ones(y.shape[0], dtype=y.dtype, device=y.device) if weight is None else weight[mask].to(y.dtype)
        w = (w / w.sum().clamp_min(torch.finfo(y.dtype).tiny))[:, None]  # (N, 1), sums to 1
        my, mt = (w * y).sum(0), (w * t).sum(0)
        vy, vt = (w * (y - my) ** 2).sum(0), (w * (t - mt) ** 2).sum(0)
        cov = (w * (y - my) * (t - mt)).sum(0)
        den = vy + vt + (my - mt) ** 2
        ccc = 2 * cov / den.clamp_min(1e-12)
        return (1.0 - torch.where(den > 1e-12, ccc, torch.ones_like(ccc))).mean()

    def metric_sums(self, out, target, mask):
        """(sum of squared errors, counted values) over the real positions (outputs clipped as when acting)."""
        target = target.reshape(out.shape)
        err = (self.clip(out) - target) ** 2
        return float(err[mask].sum()), int(mask.sum()) * self.out_dim

    def clip(self, out: Tensor) -> Tensor:
        """(..., A) outputs clipped to the action box [low, high] (the env's bounds)."""
        return torch.maximum(torch.minimum(out, self.high.to(out.device)), self.low.to(out.device))

    def act(self, out: Tensor, deterministic: bool = True) -> Tensor:
        """(B, A) -> (B, A) clipped to the action box (the policy is deterministic)."""
        return self.clip(out)


def _weighted_mean(per: Tensor, weight: Tensor) -> Tensor:
    """sum(w * l) / sum(w) of per-position losses ``per`` (N,) and weights (N,); 0 if they weigh 0.

    Raises:
        ValueError: a negative or non-finite weight.
    """
    if not bool(torch.isfinite(weight).all()) or bool((weight < 0).any()):
        raise ValueError("loss weights must be finite and >= 0")
    return (weight * per).sum() / weight.sum().clamp_min(torch.finfo(per.dtype).tiny)


def head_for(action_space: gym.Space, in_dim: int, hidden: int = 64, activation: str = "relu") -> ActionHead:
    """The head for an env's action space.

    Raises:
        ValueError: an action space that is neither ``Discrete`` nor a 1-D ``Box``.
    """
    if isinstance(action_space, gym.spaces.Discrete):
        return CategoricalHead(in_dim, int(action_space.n), hidden, activation)
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        return RegressionHead(in_dim, int(action_space.shape[0]), hidden, activation, action_space.low,
                              action_space.high)
    raise ValueError(f"no action head for {action_space}: use a Discrete or a 1-D Box action space")


def space_to_dict(space: gym.Space) -> dict:
    """A JSON-able description of a Discrete or 1-D Box space (stored in policy files)."""
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "discrete", "n": int(space.n)}
    if isinstance(space, gym.spaces.Box):
        return {"type": "box", "low": np.asarray(space.low, np.float64).tolist(),
                "high": np.asarray(space.high, np.float64).tolist()}
    raise ValueError(f"cannot describe action space {space}")


def space_from_dict(d: dict) -> gym.Space:
    """Inverse of :func:`space_to_dict`.

    Raises:
        ValueError: a malformed description.
    """
    try:
        if d["type"] == "discrete":
            return gym.spaces.Discrete(int(d["n"]))
        if d["type"] == "box":
            low, high = np.asarray(d["low"], np.float32), np.asarray(d["high"], np.float32)
            return gym.spaces.Box(low, high, dtype=np.float32)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed action space description {d!r}: {exc}") from exc
    raise ValueError(f"unknown action space type in {d!r}")


__all__ = ["ActionHead", "CategoricalHead", "IGNORE_INDEX", "RegressionHead", "head_for", "space_from_dict",
           "space_to_dict"]
