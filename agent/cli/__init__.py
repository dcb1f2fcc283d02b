"""agent: record demonstrations, train and evaluate NAC driving policies, and watch them drive.

The workflow, one direction (DESIGN.md section 2):

  agent expert train   PPO expert on CarRacing's privileged state     -> policies/carracing-expert.zip
  agent collect        the expert (or you, --keyboard) drives; frames -> recordings/nac-drive/NAME-v0 (Minari)
  agent train          behaviour cloning (+ DAgger) of CNN + NAC       -> policies/nac.pt
  agent evaluate       closed-loop returns on unseen tracks            -> JSON
                       (--env udacity: offline steering error; --floor: the recordings' keyboard-noise floor)
  agent compare        every temporal core trained and driven alike     -> table, figure (results/)
  drive                watch a policy drive, with Grad-CAM and NAC neuron traces live
  agent plot-traces    Figure-4-style plots of the traces from drive --dump-traces
  agent wiring         a picture of the policy's NCP wiring
  agent bench nac      NAC layer speed and memory against the authors' torch-nac
  agent bench drive    runner FPS and latency with and without the overlays
  agent bench bridge   Udacity bridge round trip, with and without the policy and overlays
  agent bench rollouts env steps/s with 1, 2, 4 envs at once (--envs) for the expert and the student
"""

# One module per command (agent/cli/<command>.py: add_parser(subparsers) and run(args)); what they share is
# agent.cli.common. The docstring above is `agent --help`'s description.

from __future__ import annotations

import argparse
import sys

from agent.cli import bench, collect, compare, drive, evaluate, expert, tools, train
from agent.cli.common import CLIError

#: each command: (add its parser to the subparsers, run it on the parsed arguments -> exit code)
COMMANDS = {
    "expert": (expert.add_parser, expert.run),
    "collect": (collect.add_parser, collect.run),
    "train": (train.add_parser, train.run),
    "evaluate": (evaluate.add_parser, evaluate.run),
    "compare": (compare.add_parser, compare.run),
    "drive": (drive.add_parser, drive.run),
    "bench": (bench.add_parser, bench.run),
    "plot-traces": (tools.add_plot_traces, tools.run_plot_traces),
    "wiring": (tools.add_wiring, tools.run_wiring),
    "convert-policy": (tools.add_convert_policy, tools.run_convert_policy),
    "average-policies": (tools.add_average_policies, tools.run_average_policies),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add, _ in COMMANDS.values():
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``agent``. Returns the exit code (2 for a user error, printed as one line)."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command][1](args)
    except (CLIError, FileNotFoundError, FileExistsError, ValueError) as exc:
        print(f"agent {args.command}: error: {exc}", file=sys.stderr)
        return 2


def drive_main(argv: list[str] | None = None) -> int:
    """Entry point of ``drive`` (the same as ``agent drive``)."""
    return main(["drive", *(sys.argv[1:] if argv is None else argv)])


__all__ = ["CLIError", "COMMANDS", "build_parser", "drive_main", "main"]
