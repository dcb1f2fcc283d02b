"""nac-drive: interpretable imitation-learned driving with a Neuronal Attention Circuit (NAC).

``from agent import NAC`` gives the layer (arXiv 2512.10282); :mod:`agent.nn.policy` the CNN + NAC
driving policy; :mod:`agent.cli` the ``agent`` and ``drive`` commands.
"""

from agent.nn.nac import NAC, NACCache, NACIntermediates

__all__ = ["NAC", "NACCache", "NACIntermediates"]
__version__ = "0.1.0"
