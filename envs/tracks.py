"""Which CarRacing tracks (seeds) each job uses, defined once (no heavy imports, so command-line
parsers can read it).

- training demonstrations: tracks 0 onwards (``agent collect --seed``);
- the PPO expert's held-out checkpoint selection: ``EXPERT_EVAL_SEED_BASE`` onwards;
- DAgger's student rollouts: ``DAGGER_SEED_BASE`` onwards;
- evaluation ("unseen tracks"): ``EVAL_SEED_BASE`` onwards, never used for training or for
  choosing settings by any command of this project.
"""

#: Tracks at or above this seed are never trained on; evaluation and ``drive`` default to them.
EVAL_SEED_BASE = 1_000_000
#: The PPO expert chooses its checkpoint on tracks from here (disjoint from training and evaluation).
EXPERT_EVAL_SEED_BASE = EVAL_SEED_BASE // 2
#: DAgger round r, episode i drives track DAGGER_SEED_BASE + r * episodes_per_round + i.
DAGGER_SEED_BASE = 500_000

__all__ = ["DAGGER_SEED_BASE", "EVAL_SEED_BASE", "EXPERT_EVAL_SEED_BASE"]
