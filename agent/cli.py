"""Command line: ``agent <command>`` and ``drive`` (the same as ``agent drive``)."""

from __future__ import annotations

import argparse
import sys


def _add_expert(sub) -> None:
    p = sub.add_parser("expert", help="train or evaluate the PPO expert (privileged state)",
                       description="The PPO expert that records demonstrations: stable-baselines3 PPO on "
                                   "CarRacing's privileged-state view, pixel rendering skipped while training.")
    esub = p.add_subparsers(dest="expert_command", required=True)
    t = esub.add_parser("train", help="train the expert with PPO",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                        description="Train a PPO expert on privileged CarRacing state. The checkpoint with the "
                                    "best return on held-out tracks is written to --out; TensorBoard logs go "
                                    "to --tensorboard.")
    t.add_argument("--env", default="carracing", choices=["carracing"], help="simulator")
    t.add_argument("--timesteps", type=int, default=3_000_000, help="PPO agent steps")
    t.add_argument("--seed", type=int, default=0, help="seed of PPO and of the training tracks")
    t.add_argument("--out", default="policies/carracing-expert.zip", help="where to write the expert")
    t.add_argument("--n-envs", type=int, default=8, help="parallel envs in the PPO rollout")
    t.add_argument("--action-repeat", type=int, default=1, help="repeat each expert action this many frames")
    t.add_argument("--device", default="auto", help="torch device for PPO updates (auto: cuda if available)")
    t.add_argument("--tensorboard", default="runs/expert", help="TensorBoard log folder ('' for none)")
    t.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")


def _cmd_expert(args) -> int:
    import torch

    from agent.expert import ExpertConfig, train_expert

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = ExpertConfig(timesteps=args.timesteps, seed=args.seed, n_envs=args.n_envs,
                       action_repeat=args.action_repeat, device=args.device)
    train_expert(cfg, args.out, tensorboard_dir=args.tensorboard or None)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_expert(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {"expert": _cmd_expert}
    return handlers[args.command](args)


def drive_main(argv: list[str] | None = None) -> int:
    return main(["drive", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
