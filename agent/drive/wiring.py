"""A picture of a policy's NCP wiring (``agent wiring``), drawn by ncps itself.

The NAC backbone (docs/design.md section 3, item 5) is an ``ncps.wirings.AutoNCP`` wiring: the 2d
entries of each pair input u_ij = [q_i ; k_j] are its sensory neurons, then inter, command and
motor neurons (the motor neurons feed the phi and omega heads). ncps draws it with networkx and
matplotlib (``Wiring.draw_graph``); this adds the title, the legend and the counts.
"""

from __future__ import annotations

from pathlib import Path

from agent.atomic import save_figure


def wiring_summary(wiring) -> dict[str, int]:
    """Neuron and synapse counts of an ncps wiring: sensory, inter, command, motor, synapses."""
    import numpy as np

    groups = {"inter": 0, "command": 1, "motor": 2}
    counts = {"sensory": int(wiring.input_dim)}
    for name, layer in groups.items():
        counts[name] = len(wiring.get_neurons_of_layer(layer))
    counts["synapses"] = int(np.count_nonzero(wiring.adjacency_matrix) + np.count_nonzero(wiring.sensory_adjacency_matrix))
    return counts


def draw_wiring(policy, out: str | Path, title: str = "", size: tuple[int, int] = (1200, 900), dpi: int = 100,
                layout: str = "shell") -> Path:
    """Draw the NAC backbone wiring of ``policy`` (``policy.nac.wiring``) to a PNG of ``size`` pixels.

    Raises:
        ValueError: the policy has no NAC layer with an ncps wiring; an unknown layout.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wiring = getattr(getattr(policy, "nac", None), "wiring", None)
    if wiring is None or not hasattr(wiring, "draw_graph"):
        raise ValueError(f"{type(policy).__name__} has no NAC layer with an NCP wiring to draw "
                         "(the PPO expert is a plain MLP)")
    counts = wiring_summary(wiring)
    fig = plt.figure(figsize=(size[0] / dpi, size[1] / dpi), dpi=dpi)
    handles = wiring.draw_graph(layout=layout, draw_labels=True,
                                neuron_colors={"command": "tab:cyan"})
    plt.legend(handles=handles, loc="upper left", fontsize=9)
    plt.title(title or (f"NAC backbone wiring (AutoNCP): {counts['sensory']} sensory (pair input [q; k]), "
                        f"{counts['inter']} inter, {counts['command']} command, {counts['motor']} motor neurons, "
                        f"{counts['synapses']} synapses"), fontsize=10)
    plt.axis("off")
    return save_figure(fig, out, dpi=dpi, what="wiring figure")


__all__ = ["draw_wiring", "wiring_summary"]
