"""Read policy files of format version 1 (the two pre-unification policy classes) as a DrivingPolicy.

Version 1 files came in two kinds: ``"nac-drive-policy"`` (CarRacing: CNN + NAC + dense head,
``NACPolicy``) and ``"nac-udacity-policy"`` (PilotNet + NAC + dense head, ``UdacityNACPolicy``).
Both are exactly a :class:`agent.nn.policy.DrivingPolicy` with a NAC core, so conversion maps the
config and renames the state-dict keys (``nac.*`` -> ``core.nac.*``, ``head.N.*`` ->
``head.net.N.*``); the weights are unchanged and the converted policy acts identically
(``tests/test_nn_policy.py`` checks it on the shipped files). ``agent convert-policy OLD NEW``
writes the converted file.
"""

from __future__ import annotations

from pathlib import Path

from agent.nn.policy import CARRACING_ACTIONS, FILE_KIND, DrivingPolicy, PolicyConfig, read_policy_file

LEGACY_KINDS = {"nac-drive-policy": "carracing", "nac-udacity-policy": "udacity"}


def is_legacy(payload) -> bool:
    """Whether a policy file's contents are a version-1 file of either kind."""
    return isinstance(payload, dict) and payload.get("kind") in LEGACY_KINDS and payload.get("format_version") == 1


def convert_payload(payload: dict, path: str | Path = "<payload>") -> DrivingPolicy:
    """A version-1 file's contents -> the equivalent :class:`DrivingPolicy` (weights loaded, eval mode).

    Raises:
        ValueError: not a version-1 policy file, or weights that do not fit its config.
    """
    if not is_legacy(payload):
        raise ValueError(f"{path} is not a version-1 policy file (kind {payload.get('kind')!r}, "
                         f"version {payload.get('format_version')!r})")
    env = LEGACY_KINDS[payload["kind"]]
    old = payload["config"]
    try:
        nac = {"num_heads": int(old["num_heads"]), "topk": int(old["topk"]), "sparsity": float(old["sparsity"]),
               "seed": int(old["seed"])}
        if env == "carracing":
            cfg = PolicyConfig(env="carracing", obs_shape=tuple(old["obs_shape"]),
                               action_space={"type": "discrete", "n": int(old["n_actions"])},
                               action_names=tuple(old.get("action_names", CARRACING_ACTIONS)),
                               features="carracing-cnn", features_kwargs={"dropout": float(old["dropout"])},
                               core=f"nac-{old['mode']}", core_kwargs=nac, d_model=int(old["d_model"]),
                               window=int(old["window"]), frame_dt=float(old["frame_dt"]),
                               head_hidden=int(old["hidden"]), head_activation="relu", seed=int(old["seed"]))
        else:
            cfg = PolicyConfig(env="udacity", obs_shape=tuple(old["obs_shape"]),
                               action_space={"type": "box", "low": [-1.0], "high": [1.0]}, action_names=("steering",),
                               features="pilotnet", features_kwargs={"dropout": float(old["dropout"])},
                               core=f"nac-{old['mode']}", core_kwargs=nac, d_model=int(old["d_model"]),
                               window=int(old["window"]), frame_dt=float(old["frame_dt"]),
                               head_hidden=int(old["hidden"]), head_activation="elu", seed=int(old["seed"]))
        state = {}
        for k, v in payload["state_dict"].items():
            if k.startswith("nac."):
                k = "core." + k
            elif k.startswith("head."):
                k = "head.net." + k[len("head."):]
            state[k] = v
        policy = DrivingPolicy(cfg)
        policy.load_state_dict(state, strict=True)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{path}: cannot convert this version-1 policy file: {exc}") from exc
    meta = dict(payload.get("metadata") or {})
    meta["converted_from"] = {"kind": payload["kind"], "format_version": 1}
    policy.metadata = meta
    return policy.eval()


def convert_policy_file(src: str | Path, dst: str | Path) -> DrivingPolicy:
    """Convert a version-1 policy file at ``src`` and write it to ``dst`` (format version 2).

    Raises:
        FileNotFoundError: ``src`` does not exist.
        ValueError: ``src`` is not a version-1 policy file (already converted files are refused too).
    """
    payload = read_policy_file(src)
    if isinstance(payload, dict) and payload.get("kind") == FILE_KIND and payload.get("format_version") != 1:
        raise ValueError(f"{src} is already format version {payload.get('format_version')}; nothing to convert")
    policy = convert_payload(payload, src)
    policy.save(dst, metadata=policy.metadata)
    return policy


__all__ = ["LEGACY_KINDS", "convert_payload", "convert_policy_file", "is_legacy"]
