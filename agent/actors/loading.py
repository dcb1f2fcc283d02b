"""Find and load any policy file the project knows, through a registry keyed by the file's kind.

Kinds (:data:`LOADERS`):

- ``"nac-drive-policy"`` (format 2): a :class:`agent.nn.policy.DrivingPolicy` ``.pt``, read with
  ``torch.load(weights_only=True)``; format-1 files of the two pre-unification kinds
  (``"nac-drive-policy"`` v1 and ``"nac-udacity-policy"`` v1) are converted in memory
  (:mod:`agent.nn.legacy`; ``agent convert-policy`` saves the conversion);
- ``"sb3-ppo-expert"``: the PPO expert ``.zip`` (:class:`agent.experts.policy.ExpertPolicy`), read
  without unpickling anything.

No loader ever runs code stored in a file.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from agent.actors.rollout import ExpertActor, PolicyActor
from agent.experts.policy import ExpertPolicy
from agent.nn.legacy import convert_payload, is_legacy
from agent.nn.policy import DrivingPolicy, read_policy_file
from envs.carracing import make_carracing

#: Where shipped policies live: ``policies/`` at the top of the repository.
POLICIES_DIR = Path(__file__).resolve().parents[2] / "policies"

log = logging.getLogger(__name__)


def resolve_policy_path(name: str | Path) -> Path:
    """A path as given if it exists; otherwise a bare name looked up inside ``policies/``.

    Raises:
        FileNotFoundError: neither exists; the message lists the shipped policies.
    """
    p = Path(name)
    if p.is_file():
        return p
    if len(p.parts) == 1 and (POLICIES_DIR / p).is_file():
        return POLICIES_DIR / p
    shipped = sorted(x.name for x in POLICIES_DIR.glob("*") if x.suffix in (".pt", ".zip")) if POLICIES_DIR.is_dir() else []
    raise FileNotFoundError(f"no policy file {name!r} (looked at {p} and {POLICIES_DIR / p.name}); "
                            f"shipped policies: {', '.join(shipped) or 'none'}")


def _load_driving_policy(path: Path, payload: dict, device: str):
    if is_legacy(payload):
        log.warning("%s is a format-1 policy file; converted in memory (save it with `agent convert-policy %s NEW`)",
                    path, path)
        return convert_payload(payload, path).to(device)
    return DrivingPolicy.from_payload(payload, path, device)


def _load_expert(path: Path, payload, device: str):
    return ExpertPolicy.load(path, device=device)


#: Loaders by file kind: ``LOADERS[kind](path, payload, device) -> policy``.
LOADERS: dict[str, Callable] = {
    "nac-drive-policy": _load_driving_policy,
    "nac-udacity-policy": _load_driving_policy,  # format 1 only (converted)
    "sb3-ppo-expert": _load_expert,
}


def file_kind(path: str | Path) -> tuple[str, object]:
    """(kind, payload) of a policy file: ``.zip`` files are the PPO expert (payload None); a ``.pt``
    is read once with ``weights_only=True`` and its stored ``kind`` returned with its contents.

    Raises:
        FileNotFoundError: no such file. ValueError: an unreadable file or one without a kind.
    """
    path = Path(path)
    if path.suffix == ".zip":
        if not path.is_file():
            raise FileNotFoundError(f"expert file {path} does not exist")
        return "sb3-ppo-expert", None

    payload = read_policy_file(path)
    kind = payload.get("kind") if isinstance(payload, dict) else None
    if not isinstance(kind, str):
        raise ValueError(f"{path} is not a policy file of this project (no kind stored; make one with `agent train`)")
    return kind, payload


def load_policy(name: str | Path, device: str = "cpu"):
    """Load a policy file by name or path, dispatching on its kind through :data:`LOADERS`.

    Raises:
        FileNotFoundError: no such file (the message lists the shipped policies).
        ValueError: an unknown kind, or a file its loader refuses. Nothing is half-loaded.
    """
    path = resolve_policy_path(name)
    kind, payload = file_kind(path)
    if kind not in LOADERS:
        raise ValueError(f"{path} holds a policy of kind {kind!r}, which this version cannot load "
                         f"(known kinds: {', '.join(LOADERS)})")
    return LOADERS[kind](path, payload, device)


def make_actor(policy, deterministic: bool = True, label: str | None = None):
    """The actor (:mod:`agent.actors.rollout`) for a loaded policy: the expert acts from privileged state.

    ``label`` names the policy in the HUD (e.g. its file name).
    """
    if isinstance(policy, ExpertPolicy):
        return ExpertActor(policy)
    if label is not None:
        label = f"{policy.config.core} policy {label} (window {policy.config.window})"
    return PolicyActor(policy, deterministic=deterministic, label=label)


def action_space_of(policy):
    """The gymnasium action space a loaded policy acts in (the expert's, or a DrivingPolicy's head's)."""
    return policy.policy.action_space if isinstance(policy, ExpertPolicy) else policy.action_space


def is_continuous(policy) -> bool:
    """Whether a loaded policy has continuous actions (a Box action space) rather than discrete ones.

    True for a continuous PPO expert (:attr:`agent.experts.policy.ExpertPolicy.continuous`) and for a
    :class:`agent.nn.policy.DrivingPolicy` with a Box head (CarRacing's continuous configuration,
    or Udacity steering); False for CarRacing's five discrete actions.
    """
    import gymnasium as gym

    return isinstance(action_space_of(policy), gym.spaces.Box)


def reads_speedometer(policy) -> bool:
    """Whether a policy reads the speedometer drawn into its frames (``--dashboard speedometer``,
    through its CNN, or ``--dashboard speed-input``, as a number:
    :func:`envs.carracing.draw_speedometer`). ``policy``: a loaded policy, or the
    :class:`agent.nn.policy.PolicyConfig` of one still to be built; False for the expert."""
    kwargs = getattr(policy, "features_kwargs", None)  # a PolicyConfig
    if kwargs is None:
        kwargs = getattr(getattr(policy, "config", None), "features_kwargs", None) or {}
    return kwargs.get("dashboard") in ("speedometer", "speed-input")


def make_carracing_for(policy, **kwargs):
    """The CarRacing env ``policy`` drives: :func:`envs.carracing.make_carracing` with
    ``continuous=True`` when :func:`is_continuous` (actions Box(-1, 1, (2,)): steering, throttle),
    else the default five discrete actions, and ``speedometer=True`` when :func:`reads_speedometer`.
    ``kwargs`` go to ``make_carracing`` (an explicit ``speedometer`` wins).

    Raises:
        ValueError: a continuous policy whose action space is not CarRacing's continuous
            Box(-1, 1, (2,)) (e.g. a Udacity steering policy, one output).
    """
    import gymnasium as gym
    import numpy as np

    continuous = is_continuous(policy)
    if continuous:
        space = action_space_of(policy)
        if space.shape != (2,) or not (np.allclose(space.low, -1.0) and np.allclose(space.high, 1.0)):
            raise ValueError(f"this policy's actions are {space}, but CarRacing's continuous configuration takes "
                             f"{gym.spaces.Box(-1.0, 1.0, (2,), np.float32)} (steering, throttle)")
    kwargs.setdefault("speedometer", reads_speedometer(policy))
    return make_carracing(continuous=continuous, **kwargs)
