"""Model cards: what a policy file is, how it was made, and how it scored, read from the file itself.

A card is stored in the policy file's own metadata, so it travels with the weights:

- a ``.pt`` made by ``agent train`` keeps it under ``metadata["card"]`` (beside the training
  report and the resolved config that ``agent train`` writes there);
- a PPO expert ``.zip`` (stable-baselines3's format) keeps it as a JSON member
  :data:`ZIP_CARD_MEMBER`, which stable-baselines3's loader ignores.

Every file is named by two digests: ``file_sha256`` (the bytes on disk; it changes when a card is
edited) and ``weights_sha256`` (the stored config and weights only; it stays the same when the
card changes). Evaluation JSONs record both (:func:`identity`), and :func:`attach_evaluation`
refuses an evaluation of other weights. The card format follows Mitchell et al., "Model Cards for
Model Reporting" (FAT* 2019), cut to what a driving policy needs: what it is, its recipe, its
teacher and data, and its scores on the unseen track sets with 95 % confidence intervals.

Reading a card never runs code from the file: ``.pt`` files are read with
``torch.load(weights_only=True)``, zips member by member with their header sizes checked first.
"""
from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from agent.atomic import write_atomic
from agent.bounded import ZipMemberTooLarge, read_zip_member
from agent.nn.policy import FILE_KIND, json_ready, read_policy_file
from envs.tracks import EVAL_SEED_BASE

#: the zip member that holds an expert's card
ZIP_CARD_MEMBER = "nac_drive_card.json"
#: the largest zip member read for a card or digest (bytes, from the member's header before reading)
MAX_MEMBER_BYTES = 256 * 2**20
#: the return at or above which a CarRacing episode counts as driven (the project's floor per track)
GOOD_RETURN = 600.0


class CardError(ValueError):
    """A policy file, or an evaluation, that cannot give or take a card; the message says why."""


def file_sha256(path: str | Path) -> str:
    """SHA-256 (hex) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read_member(zf: zipfile.ZipFile, name: str, path: Path) -> bytes:
    """Member ``name``, refused (CardError) above :data:`MAX_MEMBER_BYTES` declared or inflated
    (:func:`agent.bounded.read_zip_member`: the header, then a bounded read)."""
    try:
        return read_zip_member(zf, name, path, MAX_MEMBER_BYTES)
    except ZipMemberTooLarge as exc:
        raise CardError(str(exc)) from exc
    except (zipfile.BadZipFile, OSError, EOFError, RuntimeError) as exc:
        raise CardError(f"{path}: its zip member {name!r} is unreadable: {exc}") from exc


def _open_zip(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise CardError(f"{path} is not a readable zip: {exc}") from exc


def weights_sha256(path: str | Path) -> str:
    """SHA-256 (hex) of a policy's config and weights alone, unchanged by edits to its card.

    ``.pt``: the JSON of the stored config (sorted keys), then each state-dict entry in key order
    (name, dtype, shape, raw bytes). ``.zip`` (PPO expert): the ``policy.pth`` member's bytes.

    Raises:
        FileNotFoundError: no such file.
        CardError: neither a ``.pt`` policy of this project nor an expert zip.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"policy file {path} does not exist")
    if zipfile.is_zipfile(path) and path.suffix == ".zip":
        with _open_zip(path) as zf:
            if "policy.pth" not in zf.namelist():
                raise CardError(f"{path} has no policy.pth member: not a stable-baselines3 PPO expert")
            return hashlib.sha256(_read_member(zf, "policy.pth", path)).hexdigest()
    payload = _read_pt(path)
    h = hashlib.sha256(json.dumps(payload["config"], sort_keys=True).encode())
    for key in sorted(payload["state_dict"]):
        t = payload["state_dict"][key].detach().cpu().contiguous()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _read_pt(path: Path) -> dict:
    try:
        payload = read_policy_file(path)
    except ValueError as exc:
        raise CardError(str(exc)) from exc
    if not isinstance(payload, dict) or payload.get("kind") != FILE_KIND:
        raise CardError(f"{path} is not a policy file of this project (made by `agent train`)")
    return payload


def identity(path: str | Path) -> dict:
    """``{"policy_file": str, "file_sha256": hex, "weights_sha256": hex}`` of a policy file."""
    return {"policy_file": str(path), "file_sha256": file_sha256(path), "weights_sha256": weights_sha256(path)}


def mean_ci(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student-t confidence interval of the mean over independent tracks.

    Args:
        values: (N,) episode returns, one per track, N >= 2.
        confidence: the interval's coverage (0.95: a 95 % interval).

    Returns:
        (mean, low, high).

    Raises:
        CardError: fewer than two values, or a non-finite one.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size < 2 or not np.isfinite(x).all():
        raise CardError(f"a confidence interval needs at least two finite returns, got {x.size}")
    mean = float(x.mean())
    sem = float(stats.sem(x))
    if sem == 0.0:
        return mean, mean, mean
    low, high = stats.t.interval(confidence, x.size - 1, loc=mean, scale=sem)
    return mean, float(low), float(high)


def _tracks_label(seeds: list[int]) -> str:
    if seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]:,}-{seeds[-1]:,}"
    return ", ".join(f"{s:,}" for s in seeds[:5]) + (" ..." if len(seeds) > 5 else "")


#: the intent measures of a Udacity offline result that a card keeps (issue "Udacity steering that turns", item 1);
#: a subset of what a leave-one-driver-out fold keeps (agent.train.lodo.INTENT_KEYS)
_CARD_INTENT_KEYS = ("smoothed_ratio", "smoothed_corr", "right_way_left", "right_way_right", "curve_mean_abs_pred",
               "curve_mean_abs_label")


def summarize_evaluation(result: dict, source: str = "") -> dict:
    """The card's row for one ``agent evaluate --json`` result.

    A CarRacing closed-loop result (``seeds``, ``returns``) gives ``{"kind": "closed-loop",
    "tracks", "episodes", "mean", "ci95": [low, high], "std", "worst", "at_least_600", "laps",
    "unseen", "weights_sha256", "source"}``; a Udacity offline result (``recordings``) gives
    ``{"kind": "offline", "tracks": the recordings' names, "recordings": [{"recording", "frames",
    "mse", "ratio"} and, when the result has them, the intent measures {"smoothed_ratio",
    "smoothed_corr", "right_way_left", "right_way_right", "curve_mean_abs_pred",
    "curve_mean_abs_label"}], "weights_sha256", "source"}`` (``ratio``: MSE over the predict-0 MSE on
    the same frames; the intent measures score the labels smoothed over +-0.5 s, see
    :func:`agent.eval.offline.evaluate_udacity`; a recording of correlated frames gives no interval).

    Args:
        result: the JSON object ``agent evaluate`` wrote.
        source: where it was read from, kept in the row.

    Raises:
        CardError: neither kind, or seeds and returns of different lengths.
    """
    if isinstance(result.get("recordings"), list) and result.get("env") == "udacity":
        rows = [{"recording": r.get("recording"), "frames": r.get("n_frames"), "mse": round(float(r["mse"]), 4),
                 "ratio": round(float(r["ratio"]), 3),
                 **{k: round(float(r[k]), 3) for k in _CARD_INTENT_KEYS if isinstance(r.get(k), (int, float))}}
                for r in result["recordings"] if isinstance(r, dict) and "mse" in r and "ratio" in r]
        if not rows:
            raise CardError(f"{source or 'the evaluation'} holds no scored recording (mse, ratio)")
        return {"kind": "offline", "tracks": ", ".join(str(r["recording"]) for r in rows), "recordings": rows,
                "weights_sha256": result.get("weights_sha256"), "source": source}
    seeds, returns = result.get("seeds"), result.get("returns")
    if not isinstance(seeds, list) or not isinstance(returns, list) or len(seeds) != len(returns) or not seeds:
        raise CardError(f"{source or 'the evaluation'} is not an `agent evaluate --json` result (it needs equally "
                        "long 'seeds' and 'returns' lists, or Udacity 'recordings')")
    mean, low, high = mean_ci(returns)
    r = np.asarray(returns, dtype=np.float64)
    return {"kind": "closed-loop", "tracks": _tracks_label([int(s) for s in seeds]), "episodes": len(seeds),
            "mean": round(mean, 1), "ci95": [round(low, 1), round(high, 1)], "std": round(float(r.std()), 1),
            "worst": round(float(r.min()), 1), "at_least_600": int((r >= GOOD_RETURN).sum()),
            "laps": result.get("laps_finished"), "unseen": min(seeds) >= EVAL_SEED_BASE,
            "weights_sha256": result.get("weights_sha256"), "source": source}


@dataclass
class Card:
    """A policy file's model card.

    Attributes:
        path: the file.
        kind: ``"driving-policy"`` (a ``.pt`` of ``agent train``) or ``"ppo-expert"`` (an SB3 zip).
        file_sha256, weights_sha256: see the module docstring.
        summary: one paragraph: what it is and what it is for.
        recipe: the recipe file that remakes it (e.g. ``recipes/nac.toml``), if any.
        teacher: the expert that labelled its data, if any.
        data: the recordings it was trained on, in words.
        config: the policy's architecture config (``.pt``) or the expert's network (``.zip``).
        evaluations: rows of :func:`summarize_evaluation`.
        command: the command that wrote the file, as stored.
        extra: any other stored facts shown on the card (``key: value``).
    """

    path: str
    kind: str
    file_sha256: str
    weights_sha256: str
    summary: str = ""
    recipe: str | None = None
    teacher: str | None = None
    data: str | None = None
    config: dict = field(default_factory=dict)
    evaluations: list = field(default_factory=list)
    command: str | None = None
    extra: dict = field(default_factory=dict)

    def lines(self, markdown: bool = False) -> list[str]:
        """The card as text lines (Markdown with a heading and a table when ``markdown``)."""
        name = Path(self.path).name
        out = [f"### {name}" if markdown else f"{name}", ""]
        out.append(self.summary or "(no summary stored; `agent info POLICY --summary TEXT --overwrite` adds one)")
        out.append("")
        facts = [("kind", self.kind), ("sha256", f"`{self.file_sha256}`" if markdown else self.file_sha256),
                 ("weights sha256", f"`{self.weights_sha256}`" if markdown else self.weights_sha256),
                 ("recipe", self.recipe or "none stored"), ("teacher", self.teacher or "none"),
                 ("data", self.data or "not stored")]
        if self.config:
            facts.append(("config", ", ".join(f"{k}={json.dumps(v)}" for k, v in self.config.items())))
        facts += list(self.extra.items())
        if self.command:
            facts.append(("last command", f"`{self.command}`" if markdown else self.command))
        out += [f"- **{k}**: {v}" if markdown else f"{k:>15}: {v}" for k, v in facts]
        out.append("")
        if not self.evaluations:
            out.append("no evaluation stored (`agent evaluate ... --json E.json`, then "
                       "`agent info POLICY --attach E.json --overwrite`)")
            return out
        closed = [e for e in self.evaluations if e.get("kind", "closed-loop") == "closed-loop"]
        offline = [r for e in self.evaluations if e.get("kind") == "offline" for r in e["recordings"]]
        if closed:
            head = ["tracks", "episodes", "mean return", "95 % CI", "worst", ">= 600", "laps"]
            rows = [[("unseen " if e.get("unseen") else "") + e["tracks"], str(e["episodes"]), f"{e['mean']:.1f}",
                     f"[{e['ci95'][0]:.1f}, {e['ci95'][1]:.1f}]", f"{e['worst']:.1f}",
                     f"{e['at_least_600']}/{e['episodes']}", "-" if e.get("laps") is None else str(e["laps"])]
                    for e in closed]
            out += _table(head, rows, markdown)
            out += ["", "95 % CI: Student-t interval of the mean return over the tracks (one episode each)."]
        if offline:
            head = ["recording (offline)", "frames", "steering MSE", "MSE / predict-0 MSE"]
            rows = [[str(r["recording"]), str(r["frames"]), f"{r['mse']:.4f}", f"{r['ratio']:.3f}"] for r in offline]
            intent = any("smoothed_ratio" in r for r in offline)
            if intent:
                head += ["smoothed ratio", "r", "right way left / right", "|pred| vs |label| in curves"]
                for row, r in zip(rows, offline):
                    row += [_cell(r, "smoothed_ratio"), _cell(r, "smoothed_corr", ".2f"),
                            f"{_cell(r, 'right_way_left', '.2f')} / {_cell(r, 'right_way_right', '.2f')}",
                            f"{_cell(r, 'curve_mean_abs_pred')} vs {_cell(r, 'curve_mean_abs_label')}"]
            out += ([""] if closed else []) + _table(head, rows, markdown)
            out += ["", "Offline: the steering error on recorded frames of drivers it never saw; below 1 it beats "
                    "driving straight. Correlated frames of one recording give no interval."]
            if intent:
                out += ["Against the driver's intent: the labels averaged over +-0.5 s (centred); smoothed ratio = "
                        "MSE / predict-0 MSE on them, r = Pearson correlation with them, right way = share of curve "
                        "frames (|smoothed| > 0.05) steered their way, and the mean magnitudes on those frames."]
        return out


def _cell(row: dict, key: str, fmt: str = ".3f") -> str:
    """``row[key]`` formatted, or "-" where an older evaluation lacks it."""
    return format(row[key], fmt) if key in row else "-"


def _table(head: list[str], rows: list[list[str]], markdown: bool) -> list[str]:
    if markdown:  # a cell's own "|" (|pred|) is escaped, or it would split the cell
        def md(cells):
            return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
        return [md(head), "|" + "---|" * len(head)] + [md(r) for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    return ["  ".join(h.rjust(w) for h, w in zip(head, widths))] + \
        ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]


def _stored_card_pt(payload: dict) -> dict:
    meta = payload.get("metadata") or {}
    return dict(meta.get("card") or {})


def _stored_card_zip(path: Path) -> dict:
    with _open_zip(path) as zf:
        if ZIP_CARD_MEMBER not in zf.namelist():
            return {}
        try:
            card = json.loads(_read_member(zf, ZIP_CARD_MEMBER, path))
        except json.JSONDecodeError as exc:
            raise CardError(f"{path}: its card member {ZIP_CARD_MEMBER} is not valid JSON: {exc}") from exc
    if not isinstance(card, dict):
        raise CardError(f"{path}: its card member {ZIP_CARD_MEMBER} is not a JSON object")
    return card


def _expert_config(path: Path) -> dict:
    with _open_zip(path) as zf:
        try:
            data = json.loads(_read_member(zf, "data", path))
        except (KeyError, json.JSONDecodeError):
            return {}
    out = {}
    kwargs = data.get("policy_kwargs")
    if isinstance(kwargs, dict) and isinstance(kwargs.get("net_arch"), (list, dict)):
        out["net_arch"] = kwargs["net_arch"]
    for key in ("num_timesteps", "n_steps", "batch_size", "gamma", "seed"):
        if isinstance(data.get(key), (int, float)):
            out[key] = data[key]
    return out


def read_card(path: str | Path) -> Card:
    """The card of a policy file, from what the file stores.

    Raises:
        FileNotFoundError: no such file.
        CardError: not a policy file of this project or an expert zip.
    """
    path = Path(path)
    w = weights_sha256(path)
    if path.suffix == ".zip":
        stored, config, kind, command = _stored_card_zip(path), _expert_config(path), "ppo-expert", None
    else:
        payload = _read_pt(path)
        stored, config, kind = _stored_card_pt(payload), dict(payload["config"]), "driving-policy"
        meta = payload.get("metadata") or {}
        command = meta.get("command")
        stored.setdefault("data", meta.get("data"))
        if "recipe" not in stored and isinstance(meta.get("config"), dict):
            stored["recipe"] = meta["config"].get("recipe")
        config = {k: config[k] for k in ("env", "features", "features_kwargs", "core", "core_kwargs", "d_model",
                                         "window", "action_space") if k in config}
    evaluations = [e for e in stored.get("evaluations", []) if isinstance(e, dict)]
    return Card(path=str(path), kind=kind, file_sha256=file_sha256(path), weights_sha256=w,
                summary=stored.get("summary", ""), recipe=stored.get("recipe"), teacher=stored.get("teacher"),
                data=stored.get("data"), config=config, evaluations=evaluations, command=command,
                extra={k: v for k, v in (stored.get("extra") or {}).items()})


def update_card(path: str | Path, *, summary: str | None = None, recipe: str | None = None,
                teacher: str | None = None, data: str | None = None, evaluations: list[tuple[dict, str]] = (),
                extra: dict | None = None) -> Card:
    """Write card fields into a policy file, its weights untouched; returns the new card.

    The file is rewritten atomically (a temporary file, then a rename). An evaluation replaces a
    stored one of the same tracks.

    Args:
        path: a ``.pt`` of ``agent train`` or an expert ``.zip``.
        summary, recipe, teacher, data: card fields (None: keep what is stored).
        evaluations: ``(result, source)`` pairs: an ``agent evaluate --json`` object and its file name.
        extra: more ``key: value`` facts for the card.

    Raises:
        CardError: an evaluation of other weights (its ``weights_sha256`` differs from the
            file's), or one that records no ``weights_sha256``; or a file that is not a policy.
    """
    path = Path(path)
    w = weights_sha256(path)
    rows = []
    for result, source in evaluations:
        row = summarize_evaluation(result, source)
        if row["weights_sha256"] is None:
            raise CardError(f"{source} records no weights_sha256: evaluate the file again with `agent evaluate --json` "
                            "(which records it) so the card cannot show another policy's scores")
        if row["weights_sha256"] != w:
            raise CardError(f"{source} evaluated weights {row['weights_sha256'][:12]}, but {path} holds weights "
                            f"{w[:12]}: it is an evaluation of another policy")
        rows.append(row)
    card = _stored_card_zip(path) if path.suffix == ".zip" else _stored_card_pt(_read_pt(path))
    for key, value in (("summary", summary), ("recipe", recipe), ("teacher", teacher), ("data", data)):
        if value is not None:
            card[key] = value
    if extra:
        card["extra"] = {**card.get("extra", {}), **extra}
    kept = [e for e in card.get("evaluations", []) if e.get("tracks") not in {r["tracks"] for r in rows}]
    card["evaluations"] = kept + rows
    card = json_ready(card)
    if path.suffix == ".zip":
        buf = io.BytesIO()
        with _open_zip(path) as src, zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                if info.filename != ZIP_CARD_MEMBER:
                    dst.writestr(info, _read_member(src, info.filename, path))
            dst.writestr(ZIP_CARD_MEMBER, json.dumps(card, indent=1))
        write_atomic(path, buf.getbuffer(), what="policy file with its card")
    else:
        payload = _read_pt(path)
        payload["metadata"] = {**(payload.get("metadata") or {}), "card": card}
        buf = io.BytesIO()
        torch.save(payload, buf)
        write_atomic(path, buf.getbuffer(), what="policy file with its card")
    new = read_card(path)
    if new.weights_sha256 != w:  # cannot happen unless the write was corrupted
        raise CardError(f"{path}: its weights changed while its card was written")
    return new


def read_evaluation(path: str | Path) -> dict:
    """An ``agent evaluate --json`` file as a dict.

    Raises:
        CardError: unreadable or not a JSON object.
    """
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CardError(f"cannot read the evaluation {path}: {exc}") from exc
    if not isinstance(obj, dict):
        raise CardError(f"{path} is not an `agent evaluate --json` result (not a JSON object)")
    return obj


def ci_text(row: dict) -> str:
    """``"921.3 [918.7, 923.9]"``: a card row's mean and 95 % CI."""
    return f"{row['mean']:.1f} [{row['ci95'][0]:.1f}, {row['ci95'][1]:.1f}]"


__all__ = ["Card", "CardError", "EVAL_SEED_BASE", "GOOD_RETURN", "MAX_MEMBER_BYTES", "ZIP_CARD_MEMBER",
           "ci_text", "file_sha256", "identity", "mean_ci", "read_card", "read_evaluation", "summarize_evaluation",
           "update_card", "weights_sha256"]

