"""Draw docs/dataflow.png, the README's picture of the data flow: ``python docs/dataflow.py``."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

STAGES = [
    ("envs", "envs/carracing.py\nenvs/udacity/", "#dbeafe"),
    ("recordings", "agent collect (Minari)\nUdacity driving_log.csv", "#dcfce7"),
    ("windows", "data/windows.py\nT-frame windows", "#fef9c3"),
    ("trainer", "agent/train/bc.py\n+ dagger.py", "#fde68a"),
    ("policies", "DrivingPolicy .pt\nfeatures > core > head", "#fbcfe8"),
    ("drive / evaluate", "agent/drive/, agent/eval/\nwindow, mp4, JSON", "#e9d5ff"),
]


def main(out: Path = Path(__file__).with_name("dataflow.png")) -> Path:
    fig, ax = plt.subplots(figsize=(14, 2.6), dpi=110)
    ax.set_xlim(0, len(STAGES) * 2.3)
    ax.set_ylim(0, 2.6)
    ax.axis("off")
    for i, (name, detail, color) in enumerate(STAGES):
        x = 0.15 + i * 2.3
        ax.add_patch(FancyBboxPatch((x, 0.45), 1.85, 1.6, boxstyle="round,pad=0.05", fc=color, ec="#334155"))
        ax.text(x + 0.925, 1.65, name, ha="center", va="center", fontsize=12, weight="bold")
        ax.text(x + 0.925, 0.95, detail, ha="center", va="center", fontsize=8.5, family="monospace")
        if i:
            ax.add_patch(FancyArrowPatch((x - 0.42, 1.25), (x - 0.05, 1.25), arrowstyle="-|>", mutation_scale=18,
                                         color="#334155"))
    ax.add_patch(FancyArrowPatch((2.3 * 4 + 0.6, 0.42), (2.3 * 3 + 1.5, 0.42), connectionstyle="arc3,rad=0.45",
                                 arrowstyle="-|>", mutation_scale=14, color="#b45309", ls="--"))
    ax.text(2.3 * 4 + 0.1, 0.02, "DAgger: the student drives (agent/actors/rollout.py), the expert relabels",
            ha="center", fontsize=8.5, color="#b45309")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(main())
