"""Weight averaging of policies trained from one starting point: a uniform "model soup"
(Wortsman et al. 2022, "Model soups: averaging weights of multiple fine-tuned models improves
accuracy without increasing inference time", ICML; the same idea as stochastic weight averaging,
Izmailov et al. 2018, across runs instead of along one).

DAgger runs that start from the same behaviour-cloning checkpoint (``agent train --init BC.pt
--epochs 0 --seed S ...``) differ by their seed: the mixing draws, the disturbances, the batches.
On CarRacing the seed decides much of the closed-loop return (README, "Skipped tiles"), and the
average of the runs' weights is one network of the same size and speed that is often better
than each of them when they stay in one basin of the loss. Whether it is, here, is measured
closed loop (README, "A soup of DAgger students, tried": not here).
"""

from __future__ import annotations

from pathlib import Path

import torch

from agent.actors.loading import load_policy
from agent.nn.policy import DrivingPolicy


def average_state_dicts(states: list[dict[str, torch.Tensor]], weights: list[float] | None = None) -> dict:
    """The (weighted) mean of state dicts with the same keys and shapes.

    Floating-point tensors are averaged (in float64, then cast back); every other tensor (integer
    masks, counters) must be equal in all of them and is kept.

    Args:
        states: two or more state dicts.
        weights: one non-negative weight per state dict (normalised to sum 1); None: uniform.

    Raises:
        ValueError: fewer than two state dicts, different keys or shapes, unequal non-float
            tensors, or bad weights.
    """
    if len(states) < 2:
        raise ValueError(f"averaging needs two or more policies, got {len(states)}")
    w = [1.0] * len(states) if weights is None else [float(x) for x in weights]
    if len(w) != len(states) or any(not x >= 0 for x in w) or sum(w) <= 0:
        raise ValueError(f"weights must be one non-negative number per policy with a positive sum, got {weights}")
    w = [x / sum(w) for x in w]
    keys = list(states[0])
    out = {}
    for i, s in enumerate(states[1:], start=1):
        if list(s) != keys:
            missing, extra = sorted(set(keys) - set(s)), sorted(set(s) - set(keys))
            raise ValueError(f"policy {i} has other weights than policy 0 (missing {missing[:3]}, extra {extra[:3]}): "
                             "only policies of one configuration can be averaged")
    for k in keys:
        ts = [s[k] for s in states]
        if any(t.shape != ts[0].shape for t in ts):
            raise ValueError(f"weight {k!r} differs in shape between the policies: {[tuple(t.shape) for t in ts]}")
        if ts[0].is_floating_point():
            acc = sum(x * t.detach().to(torch.float64) for x, t in zip(w, ts))
            out[k] = acc.to(ts[0].dtype)
        else:
            if any(not torch.equal(t, ts[0]) for t in ts):
                raise ValueError(f"weight {k!r} is not a floating-point tensor and differs between the policies")
            out[k] = ts[0].clone()
    return out


def average_policies(paths: list[str | Path], weights: list[float] | None = None) -> DrivingPolicy:
    """Load the policy files ``paths`` and return one policy with their averaged weights.

    Every file must hold a :class:`agent.nn.policy.DrivingPolicy` of the same configuration
    (features, core, window, head); the result has that configuration, in eval mode.

    Raises:
        FileNotFoundError: a file that does not exist.
        ValueError: fewer than two files, a file that is not a NAC-drive policy (an expert .zip),
            configurations that differ, or the errors of :func:`average_state_dicts`.
    """
    if len(paths) < 2:
        raise ValueError(f"averaging needs two or more policy files, got {len(paths)}")
    policies = [load_policy(p) for p in paths]
    for p, pol in zip(paths, policies):
        if not isinstance(pol, DrivingPolicy):
            raise ValueError(f"{p} is not a student policy (.pt); only those can be averaged")
    base = policies[0].config.to_dict()
    for p, pol in zip(paths[1:], policies[1:]):
        if pol.config.to_dict() != base:
            diff = sorted(k for k in base if pol.config.to_dict().get(k) != base[k])
            raise ValueError(f"{p} differs from {paths[0]} in its configuration ({', '.join(diff)}): only policies "
                             "of one configuration can be averaged")
    soup = DrivingPolicy(policies[0].config)
    soup.load_state_dict(average_state_dicts([pol.state_dict() for pol in policies], weights))
    return soup.eval()


__all__ = ["average_policies", "average_state_dicts"]
