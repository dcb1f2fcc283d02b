"""How ``drive`` acts: a driver per policy kind turns an observation into a :class:`Decision`.

Temporary home: these will give way to the project-wide actor interface (``agent.rollout``); they are
kept self-contained here so that the swap is one import change in the modules that use them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.drive.hud import steering_class


@dataclass
class Decision:
    """One control step's decision and what the overlays need to explain it.

    Attributes:
        action: what the env is given: a discrete action index (int), or an array for a
            continuous action space (normalised steering for Udacity).
        action_class: the class that colours the traces (the action index; for steering
            0 straight, 1 left, 2 right).
        probs: (A,) action probabilities, or None.
        output: the policy's raw output for this frame, (1, A) logits or (1, 1) steering; None
            for policies without one (the expert).
        state_before, state: the policy state given to and returned by ``step``.
        t: (1,) the timestamp given to the policy in seconds, or None.
        intermediates: the NAC intermediates of this step, or None.
    """

    action: Any
    action_class: int = 0
    probs: np.ndarray | None = None
    output: Any = None
    state_before: Any = None
    state: Any = None
    t: Any = None
    intermediates: Any = None


class _Driver:
    """Chooses actions for the runner and exposes what the HUD shows about the decision."""

    label = "policy"
    has_probs = False
    traces_reason = "the policy has no NAC layer (no intermediates to trace)"

    def reset(self) -> None: ...

    def act(self, obs: np.ndarray, env, info: dict | None = None) -> Decision:
        raise NotImplementedError


class _NACDriver(_Driver):
    """Any policy with ``step(obs, state, return_intermediates, t)`` and an ``output_kind``."""

    def __init__(self, policy, name: str):
        import torch

        self.policy, self.state, self.torch = policy, None, torch
        self.kind = getattr(policy, "output_kind", "discrete")
        self.has_probs = self.kind == "discrete"
        self.want_intermediates = False
        self.traces_reason = None
        self.label = f"NAC policy {name} (window {policy.config.window})"

    def reset(self) -> None:
        self.state = None

    def act(self, obs, env, info=None):
        torch = self.torch
        x = torch.from_numpy(np.array(obs, dtype=np.uint8)).to(self.policy.device)[None]  # a writable copy
        t = None
        if info is not None and "time_s" in info:
            t = torch.tensor([float(info["time_s"])], dtype=torch.float64, device=x.device)
        before = self.state
        if self.policy.training:
            self.policy.eval()
        out, self.state = self.policy.step(x, before, return_intermediates=self.want_intermediates, t=t)
        inter = self.state.last.get("intermediates") if self.want_intermediates else None
        if self.want_intermediates and inter is None and self.traces_reason is None:
            self.traces_reason = f"{type(self.policy).__name__}.step returns no NAC intermediates"
            self.want_intermediates = False
        if self.kind == "discrete":
            probs = torch.softmax(out[0].float(), -1).cpu().numpy()
            a = int(out[0].argmax())
            return Decision(a, a, probs, out, before, self.state, t, inter)
        steer = float(out.reshape(-1)[0].clamp(-1, 1))
        return Decision(np.array([steer], np.float32), steering_class(steer), None, out, before, self.state, t, inter)


class _ActorDriver(_Driver):
    def __init__(self, actor, label: str):
        self.actor, self.label = actor, label

    def reset(self) -> None:
        self.actor.reset()

    def act(self, obs, env, info=None):
        a = int(self.actor.act(obs, env))
        return Decision(a, a)


def _make_driver(policy, name: str) -> _Driver:
    from agent.train.expert import ExpertPolicy
    from agent.loading import make_actor

    if callable(getattr(policy, "step", None)) and hasattr(policy, "config") and not isinstance(policy, ExpertPolicy):
        return _NACDriver(policy, name)
    label = "expert (privileged state)" if isinstance(policy, ExpertPolicy) else f"policy {name}"
    return _ActorDriver(make_actor(policy), label)


__all__ = ["Decision"]
