"""agent: record demonstrations, train and evaluate NAC driving policies, and watch them drive.

The workflow, one direction (docs/design.md, "Layout and data flow"):

  agent expert train   PPO expert on CarRacing's privileged state      -> runs/expert/*.zip
  agent collect        the teacher (or you, --keyboard) drives; frames -> recordings/nac-drive/NAME-v0 (Minari)
  agent train          behaviour cloning (+ DAgger) of CNN + NAC        -> a policy .pt
                       (--config recipes/nac.toml: a shipped policy's recipe)
  agent evaluate       closed-loop returns on unseen tracks             -> JSON
                       (--env udacity: offline steering error; --udacity.floor: the recordings' keyboard-noise floor)
  agent info           a policy file's model card: recipe, teacher, data, scores with 95 % CIs, sha256
  agent compare        every temporal core trained and driven alike      -> table, figure (results/)
  drive                watch a policy drive, with its saliency map and NAC neuron traces live
  agent explain        how faithful its saliency is, where it looks, what its NAC traces encode -> report
  agent plot-traces    Figure-4-style plots of the traces from drive --dump-traces
  agent wiring         a picture of the policy's NCP wiring
  agent convert-policy a format-1 policy file in the current format
  agent average-policies  the weight average of policies of one start (a model soup)
  agent lodo-table     the leave-one-driver-out tables of finished folds (Udacity), no training
  agent lodo-compare   two leave-one-driver-out settings fold by fold, with seed-aware intervals
  agent lodo-consensus what the other drivers steer at the most alike views, scored as a LODO setting (no training)
  agent bench ...      NAC layer, runner, bridge and rollout benchmarks

`agent COMMAND --help` explains each command's options.
"""

# One module per command (agent/cli/<command>.py, each with main(argv) -> exit code); what they share is
# agent.cli.common. The modules are imported when their command runs, so `agent --help` stays quick.

from __future__ import annotations

import difflib
import importlib
import sys

from agent.cli.common import CLIError
from agent.train.config import ConfigError

#: each command: (its module, or module:function, that takes the arguments after the command name)
COMMANDS = {
    "expert": "agent.cli.expert",
    "collect": "agent.cli.collect",
    "train": "agent.cli.train",
    "evaluate": "agent.cli.evaluate",
    "info": "agent.cli.info",
    "compare": "agent.cli.compare",
    "explain": "agent.cli.explain",
    "drive": "agent.cli.drive",
    "bench": "agent.cli.bench",
    "plot-traces": "agent.cli.tools:plot_traces",
    "wiring": "agent.cli.tools:wiring",
    "convert-policy": "agent.cli.tools:convert_policy",
    "average-policies": "agent.cli.tools:average_policies",
    "lodo-table": "agent.cli.lodo:table_main",
    "lodo-compare": "agent.cli.lodo:compare_main",
    "lodo-consensus": "agent.cli.lodo:consensus_main",
}


def command(name: str):
    """The ``main(argv) -> int`` of a command.

    Raises:
        CLIError: an unknown command (with the closest names).
    """
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=2)
        hint = f"; did you mean {' or '.join(close)}?" if close else f"; choose one of {', '.join(COMMANDS)}"
        raise CLIError(f"unknown command {name!r}{hint}")
    module, _, function = COMMANDS[name].partition(":")
    return getattr(importlib.import_module(module), function or "main")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``agent``. Returns the exit code: 2 for a user error and 1 for a failed file
    operation, each printed as one line; 130 after Ctrl-C."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: agent COMMAND [OPTIONS]\n\n{__doc__.strip()}")
        return 0 if argv else 2
    name = argv[0]
    try:
        return command(name)(argv[1:])
    except (CLIError, ConfigError, FileNotFoundError, FileExistsError, ValueError) as exc:
        print(f"agent {name}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, a permission, a broken pipe: one line, never a traceback
        print(f"agent {name}: error: {exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"agent {name}: interrupted", file=sys.stderr)
        return 130


def drive_main(argv: list[str] | None = None) -> int:
    """Entry point of ``drive`` (the same as ``agent drive``)."""
    return main(["drive", *(sys.argv[1:] if argv is None else argv)])


__all__ = ["CLIError", "COMMANDS", "command", "drive_main", "main"]
