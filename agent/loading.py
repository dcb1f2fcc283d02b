"""Find and load any policy file the project knows: a NAC policy (.pt) or the PPO expert (.zip)."""

from __future__ import annotations

from pathlib import Path

from agent.rollout import Actor, ExpertActor, PolicyActor

#: Where shipped policies live: ``policies/`` at the top of the repository.
POLICIES_DIR = Path(__file__).resolve().parent.parent / "policies"


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


def policy_file_kind(path: str | Path) -> str | None:
    """The ``kind`` stored in a ``.pt`` policy file (read with ``weights_only=True``), or None if
    the file is not a readable dict with a kind."""
    from agent.nn.policy import read_policy_file

    try:
        payload = read_policy_file(path)
    except (FileNotFoundError, ValueError):
        return None
    kind = payload.get("kind") if isinstance(payload, dict) else None
    return kind if isinstance(kind, str) else None


def load_policy(name: str | Path, device: str = "cpu"):
    """Load a policy file, dispatching on what it is.

    ``.zip`` -> :class:`agent.train.expert.ExpertPolicy`; a ``.pt`` of kind ``"nac-udacity-policy"`` ->
    :class:`agent.nn.udacity_policy.UdacityNACPolicy`; any other file ->
    :class:`agent.nn.policy.NACPolicy` (the CarRacing policy, whose loader explains what is wrong
    with a file that is neither). The file is read once.

    Raises:
        FileNotFoundError, ValueError: see :func:`resolve_policy_path` and the loaders.
    """
    path = resolve_policy_path(name)
    if path.suffix == ".zip":
        from agent.train.expert import ExpertPolicy

        return ExpertPolicy.load(path, device=device)
    from agent.nn.policy import NACPolicy, read_policy_file
    from agent.nn.udacity_policy import FILE_KIND as UDACITY_KIND, UdacityNACPolicy

    payload = read_policy_file(path)
    kind = payload.get("kind") if isinstance(payload, dict) else None
    cls = UdacityNACPolicy if kind == UDACITY_KIND else NACPolicy
    return cls.from_payload(payload, path, device)


def make_actor(policy, deterministic: bool = True) -> Actor:
    """The rollout actor for a loaded policy (the expert acts from privileged state)."""
    from agent.train.expert import ExpertPolicy

    if isinstance(policy, ExpertPolicy):
        return ExpertActor(policy)
    return PolicyActor(policy, deterministic=deterministic)
