"""``agent explain``: what a CarRacing policy looks at and what its NAC traces encode, as one report.

For each policy, on closed-loop deterministic drives of the given tracks (the steps spread evenly
over each episode, :func:`agent.drive.faithfulness.collect_samples`):

1. **Faithfulness** of the saliency maps (:func:`agent.drive.faithfulness.faithfulness_report`):
   ROAD (Rong et al., ICML 2022) and the confidence change of pytorch-grad-cam, per CAM method and
   convolution, against the RandomCAM, Sobel and road-mask baselines, with the cascading
   randomisation sanity check (Adebayo et al., NeurIPS 2018).
2. **Where the student looks** (:func:`agent.drive.regions.region_shares`): each region's share
   (car, dashboard, road edge, road, grass, other) of the mass of the live map (the runner's
   default, HiResCAM at the first convolution) and of the paper's Grad-CAM at the last
   convolution, beside the region's share of the area. This is the NAC paper's Figure 6 claim
   (Razzaq et al., arXiv 2512.10282, Appendix D.3.3: NAC keeps its focus on the road) in numbers;
   several policies in one call give one row each.
3. **What the traces encode** (NAC cores only; :func:`agent.drive.encoding.encoding_report`): per
   action the distributions of phi, omega and the attention logits per head, and cross-validated
   linear probes of the action from each head's traces against a probe from the CNN features
   (the paper's Figure 4 claim).

Writes ``explain.json``, ``explain.md`` (a page linking the figures) and ``regions.png`` in the
output folder, and each policy's ``faithfulness.*`` and ``encoding.*`` in a subfolder named after it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import tyro

from agent.atomic import save_figure
from agent.drive.regions import REGIONS, region_shares, shares_markdown
from agent.drive.saliency import SaliencyOverlay, resolve_saliency_layer
from agent.drive.stats import format_interval, json_default
from agent.train.config import ConfigError
from envs.tracks import EVAL_SEED_BASE

DESCRIPTION = """Write a report of what CarRacing policies look at and what their NAC traces encode.

For each policy, on drives of --tracks: how faithful each saliency method is (ROAD and the
confidence change of pytorch-grad-cam, the sanity check of cascading randomisation), which share of
the map's mass lies on the road, its edge, the grass and the car (beside each region's share of the
area), and, for NAC cores, what phi, omega and the attention logits encode about the action (linear
probes against the CNN features). Several policies give one row each in the regions table.
Writes explain.json, explain.md and figures to --out."""

#: The maps whose region shares are measured: (label, method key, layer) - the live default and the paper's.
REGION_MAPS = (("live: HiResCAM", "hirescam", "auto"), ("paper: Grad-CAM", "gradcam", "last"))
#: The CAM methods scored for faithfulness by default (the live candidates; the baselines are added).
DEFAULT_METHODS = ("HiResCAM", "LayerCAM", "GradCAM")


@dataclass(frozen=True)
class ExplainConfig:
    """agent explain POLICY [POLICY ...]: the options; checked once when built.

    Raises:
        ConfigError: a value out of range (tyro reports it), or from :meth:`check`: an existing
            report without ``--overwrite``.
    """

    policies: tyro.conf.Positional[tuple[str, ...]]
    """policy files (a bare name is looked up in policies/); CarRacing, discrete actions"""
    tracks: tuple[int, ...] = (EVAL_SEED_BASE, EVAL_SEED_BASE + 1, EVAL_SEED_BASE + 2)
    """tracks driven (CarRacing seeds; the default: the first unseen evaluation tracks)"""
    steps: int = 300
    """steps measured per policy, spread evenly over the tracks' episodes"""
    max_steps: int = 1000
    """episode cap (CarRacing's own: 1000 steps)"""
    faithfulness: bool = True
    """score the saliency methods with ROAD (the slow part: about 0.3 s per step, method and layer on one core)"""
    methods: tuple[str, ...] = DEFAULT_METHODS
    """pytorch-grad-cam classes scored for faithfulness (the RandomCAM, SobelCAM and road baselines are added)"""
    layers: tuple[str, ...] = ()
    """convolutions scored (conv1 ...); empty: all"""
    sanity_steps: int = 16
    """steps of the cascading-randomisation sanity check (0: none)"""
    traces: bool = True
    """the trace-encoding study (NAC cores only)"""
    out: str = "runs/explain"
    """the report's folder"""
    overwrite: bool = False
    """replace an existing report in --out"""
    threads: int = 1
    """torch threads"""

    def __post_init__(self):
        if not self.policies:
            raise ConfigError("give at least one policy, e.g. agent explain nac.pt")
        if not self.tracks:
            raise ConfigError("--tracks needs at least one track")
        if self.steps < 2 * len(self.tracks):
            raise ConfigError(f"--steps must be at least 2 per track ({2 * len(self.tracks)}), got {self.steps}")
        if self.max_steps < 2:
            raise ConfigError(f"--max-steps must be >= 2, got {self.max_steps}")
        if self.sanity_steps < 0 or self.threads < 1:
            raise ConfigError("--sanity-steps must be >= 0 and --threads >= 1")
        stems = [Path(p).stem for p in self.policies]
        if len(set(stems)) != len(stems):
            raise ConfigError(f"policies need different file names (their subfolders of --out): {', '.join(stems)}")

    def check(self) -> "ExplainConfig":
        """Refuse to replace an earlier report without ``--overwrite``; returns self."""
        if not self.overwrite and (Path(self.out) / "explain.json").exists():
            raise ConfigError(f"{Path(self.out) / 'explain.json'} already exists; choose another --out or pass "
                              "--overwrite")
        return self


def live_maps(policy, samples, method: str, layer: str) -> list[np.ndarray]:
    """The maps the runner would draw for ``samples``: :class:`agent.drive.saliency.SaliencyOverlay` with
    ``method`` at ``layer``, for the action each sample took.

    Returns:
        one (H, W) float32 map in [0, 1] per sample, over the raw frame.
    """
    maps = []
    with SaliencyOverlay(policy, tuple(getattr(policy.config, "action_names", ())), method=method, layer=layer) as ov:
        for s in samples:
            out = torch.zeros((1, int(s.action) + 1))
            out[0, int(s.action)] = 1.0  # the overlay's target is the argmax: the action taken
            maps.append(ov.compute(s.frame, s.state_before, out, s.t).cam)
    return maps


def explain_policy(name: str, cfg: ExplainConfig, out: Path, say=print) -> dict:
    """The report of one policy (see the module docstring); its files go to ``out``.

    Raises:
        FileNotFoundError: no such policy. ValueError: a policy without discrete CarRacing actions.
    """
    from agent.actors.loading import load_policy, resolve_policy_path
    from agent.drive.faithfulness import BASELINES, collect_samples, faithfulness_report
    from agent.eval.card import weights_sha256

    path = resolve_policy_path(name)
    policy = load_policy(path).eval()
    if getattr(policy, "output_kind", None) != "discrete":
        raise ValueError(f"{path.name}: agent explain measures CarRacing policies with discrete actions "
                         f"(output_kind 'discrete'), this one's is {getattr(policy, 'output_kind', None)!r}")
    t0 = time.perf_counter()
    per_track = int(np.ceil(cfg.steps / len(cfg.tracks)))
    samples = collect_samples(policy, cfg.tracks, per_track, max_steps=cfg.max_steps)
    say(f"{path.name}: {len(samples)} steps from {len(cfg.tracks)} track(s) in {time.perf_counter() - t0:.0f} s")
    readable = policy.features.readable(samples[0].frame.shape[:2]) if hasattr(policy.features, "readable") else None
    regions = {}
    for label, method, layer in REGION_MAPS:
        lname = resolve_saliency_layer(policy, layer)[0]
        maps = live_maps(policy, samples, method, layer)
        regions[f"{label} @ {lname}"] = region_shares([s.frame for s in samples], maps, readable)
    rep = {"policy": str(path), "weights_sha256": weights_sha256(path), "core": policy.config.core,
           "steps": len(samples), "tracks": [int(t) for t in cfg.tracks], "regions": regions}
    if cfg.faithfulness:
        f = faithfulness_report(path, cfg.tracks, len(samples), list(cfg.methods) + list(BASELINES),
                                list(cfg.layers) or None, out, sanity_steps=cfg.sanity_steps,
                                sanity_layers=list(cfg.layers) or None, samples=samples, progress=say)
        rep["faithfulness"] = {"rows": [{k: v for k, v in r.items() if k not in ("road_per_step", "steps_index")}
                                        for r in f["rows"]], "reference": f.get("reference")}
    if cfg.traces:
        if getattr(policy, "nac", None) is None:
            rep["encoding"] = {"skipped": f"the {policy.config.core} core has no NAC traces"}
        else:
            from agent.drive.encoding import encoding_report

            enc = encoding_report(path, cfg.tracks, cfg.steps, out, progress=say)
            rep["encoding"] = {k: enc[k] for k in ("steps", "probes", "carriers", "figure4") if k in enc}
    rep["seconds"] = time.perf_counter() - t0
    return rep


def regions_figure(reports: dict, path: Path) -> Path:
    """A bar chart: per region, its share of the area (grey) and of each policy's map mass (95 % CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [(f"{pol}: {lab}", res) for pol, rep in reports.items() for lab, res in rep["regions"].items()]
    shown = [r for r in REGIONS if r not in ("dashboard", "other")]
    x = np.arange(len(shown))
    width = 0.8 / (len(series) + 1)
    fig, ax = plt.subplots(figsize=(5.5 + 1.6 * len(shown), 4.5), dpi=110)
    first = series[0][1]["regions"]
    ax.bar(x, [100 * first[r]["pooled_area"] for r in shown], width, color="0.75", label="share of the area")
    for i, (lab, res) in enumerate(series, start=1):
        m = [res["regions"][r]["mass"] for r in shown]
        means = np.array([100 * v["mean"] for v in m])
        err = np.array([[100 * (v["mean"] - v["lo"]), 100 * (v["hi"] - v["mean"])] for v in m]).T
        ax.bar(x + i * width, means, width, yerr=np.nan_to_num(err), capsize=2, label=f"{lab}: share of the map")
    ax.set_xticks(x + width * len(series) / 2, shown)
    ax.set_ylabel("% (mean over steps, 95 % CI)")
    ax.set_title("Where the policy looks: saliency mass by region, beside the region's area")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, never over them
    fig.tight_layout()
    return save_figure(fig, path, what="saliency figure")


def write_explain_report(cfg: ExplainConfig, say=print) -> dict:
    """Run :func:`explain_policy` for every policy of ``cfg`` and write the report to ``cfg.out``.

    Returns:
        the report (what ``explain.json`` holds): the options, and per policy its regions,
        faithfulness rows and encoding results.
    """
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.threads)
    reports = {}
    for name in cfg.policies:
        stem = Path(name).stem
        reports[stem] = explain_policy(name, cfg, out / stem, say)
    report = {"options": asdict(cfg), "torch": torch.__version__, "policies": reports}
    fig = regions_figure(reports, out / "regions.png")
    (out / "explain.json").write_text(json.dumps(report, indent=1, default=json_default) + "\n")
    (out / "explain.md").write_text(explain_markdown(report, fig.name))
    say(f"wrote {out / 'explain.md'}, {out / 'explain.json'}, {fig}")
    return report


def explain_markdown(report: dict, figure: str = "regions.png") -> str:
    """The report as a markdown page: the regions table, each policy's faithfulness table and encoding."""
    o = report["options"]
    pols = report["policies"]
    lines = [f"# agent explain: {', '.join(pols)}", "",
             f"Tracks {', '.join(map(str, o['tracks']))}; {o['steps']} steps per policy, spread over the episodes; "
             f"torch {report['torch']}. Rerun: `agent explain {' '.join(o['policies'])} --tracks "
             f"{' '.join(map(str, o['tracks']))} --steps {o['steps']} --out OUT`.", "",
             "## Where the policy looks", "",
             "Each region's share of the saliency mass (mean over steps, 95 % CI), beside its share of the area, "
             "and their ratio (× > 1: more attention than its size). Regions: the car, the road edge (2 px either "
             "side of the road's boundary, and the kerbs), the road, the grass; the dashboard strip counts only "
             "where the CNN reads it.", "",
             shares_markdown({f"{p}, {lab}": res for p, rep in pols.items() for lab, res in rep["regions"].items()}),
             f"![saliency mass by region]({figure})", ""]
    for p, rep in pols.items():
        lines += [f"## {p}", "", f"Weights sha256 `{rep['weights_sha256'][:8]}`, core {rep['core']}, "
                                 f"{rep['steps']} steps.", ""]
        if "faithfulness" in rep:
            lines += [f"### Faithfulness (ROAD, logit-margin units; reference {rep['faithfulness']['reference']})", "",
                      "| method | layer | steps | ROAD combined [95 % CI] | empty maps | ms / frame | sanity |",
                      "|---|---|---|---|---|---|---|"]
            for r in rep["faithfulness"]["rows"]:
                if r.get("error"):
                    lines.append(f"| {r['method']} | {r['layer']} | - | skipped: {r['error'][:80]} | | | |")
                    continue
                road, san = r["road"], r.get("sanity")
                san_s = "-" if not san else ("passes" if san["passes"] else "fails" if san["passes"] is False
                                             else "n/a")
                lines.append(f"| {r['method']} | {r['layer']} | {r['steps']} | {format_interval(road, 2, signed=True)} | "
                             f"{100 * r['empty_share']:.0f} % | {r['ms_per_frame']:.1f} | {san_s} |")
            lines += ["", f"Per percentile and the sanity tables: [{p}/faithfulness.md]({p}/faithfulness.md).", ""]
        enc = rep.get("encoding")
        if enc:
            if "skipped" in enc:
                lines += [f"Trace encoding: skipped ({enc['skipped']}).", ""]
            else:
                lines += ["### What the traces encode", "", f"See [{p}/encoding.md]({p}/encoding.md).", ""]
    return "\n".join(lines)


__all__ = ["DEFAULT_METHODS", "DESCRIPTION", "ExplainConfig", "REGION_MAPS", "explain_markdown",
           "explain_policy", "live_maps", "regions_figure", "write_explain_report"]
