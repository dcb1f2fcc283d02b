"""The small commands: `agent plot-traces`, `agent wiring`, `agent convert-policy`, `agent average-policies`."""

from __future__ import annotations

from pathlib import Path

from agent.actors.loading import load_policy
from agent.cli.common import argparse_main, FMT, CLIError
from agent.drive.traces import plot_traces as plot_trace_file  # the name plot_traces is this command's main
from agent.drive.wiring import draw_wiring, wiring_summary
from agent.nn.legacy import convert_policy_file
from agent.train.soup import average_policies as average_policy_files  # average_policies: the command's main


def add_plot_traces(sub) -> None:
    p = sub.add_parser("plot-traces", help="plot NAC traces dumped by drive --dump-traces (the paper's Figure 4)",
                       formatter_class=FMT,
                       description="Read a trace file written by `drive --dump-traces` and draw omega, the logits, "
                                   "phi and the attention weights (mean over the kept keys) over the run, each step "
                                   "coloured by the action taken, with their distribution per action beside them, "
                                   "as in the paper's Figure 4 (arXiv 2512.10282).")
    p.add_argument("traces", help="the .npz written by drive --dump-traces")
    p.add_argument("--out", required=True, help="the PNG to write")
    p.add_argument("--head", type=int, default=None, help="plot this head (0-based) instead of the mean over heads")
    p.add_argument("--size", type=int, nargs=2, default=[1600, 1000], metavar=("W", "H"), help="PNG size in pixels")


def run_plot_traces(args) -> int:
    if min(args.size) < 200:
        raise CLIError(f"--size must be at least 200 x 200 pixels, got {args.size[0]} x {args.size[1]}")
    out = plot_trace_file(args.traces, args.out, head=args.head, size=tuple(args.size))
    print(f"wrote {out}")
    return 0


def add_wiring(sub) -> None:
    p = sub.add_parser("wiring", help="draw a policy's NCP wiring (the NAC backbone) as a PNG", formatter_class=FMT,
                       description="Draw the AutoNCP wiring of the policy's NAC backbone with ncps (networkx + "
                                   "matplotlib): the pair-input sensory neurons, inter, command and motor neurons, "
                                   "excitatory (green) and inhibitory (red) synapses.")
    p.add_argument("--policy", default="nac.pt", help="policy file (a bare name is looked up in policies/)")
    p.add_argument("--out", required=True, help="the PNG to write")
    p.add_argument("--layout", default="shell", choices=["shell", "circular", "kamada", "spring", "spectral", "spiral"],
                   help="networkx layout")


def run_wiring(args) -> int:
    policy = load_policy(args.policy)
    if getattr(policy, "nac", None) is None:
        raise CLIError(f"{args.policy} has no NAC core (its core: {getattr(policy.config, 'core', 'none')}); "
                       "only nac-* cores have an NCP wiring to draw")
    out = draw_wiring(policy, args.out, layout=args.layout)
    counts = wiring_summary(policy.nac.wiring)
    print(f"wrote {out}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    return 0


def add_convert_policy(sub) -> None:
    p = sub.add_parser("convert-policy", help="convert a format-1 policy file to the current format",
                       formatter_class=FMT,
                       description="Policy files written before the policy classes were unified (format 1: kinds "
                                   "'nac-drive-policy' and 'nac-udacity-policy') are rewritten as the one "
                                   "DrivingPolicy format (2). The weights are unchanged, so the converted policy "
                                   "acts identically. (load_policy also converts format-1 files in memory.)")
    p.add_argument("src", help="the format-1 policy file")
    p.add_argument("dst", help="where to write the converted file (may equal src)")


def run_convert_policy(args) -> int:
    policy = convert_policy_file(args.src, args.dst)
    print(f"converted {args.src} -> {args.dst}: {policy.config.env}, {policy.config.features} + {policy.config.core} "
          f"(window {policy.config.window}) + {policy.head.kind} head")
    return 0


def add_average_policies(sub) -> None:
    p = sub.add_parser("average-policies", help="average the weights of policies trained from one start (a model soup)",
                       formatter_class=FMT,
                       description="Writes one policy whose weights are the (weighted) mean of the given policy "
                                   "files' (a uniform 'model soup', Wortsman et al. 2022). Meant for DAgger runs "
                                   "that started from the same behaviour-cloning checkpoint with different seeds: "
                                   "the result is one network of the same size and speed. Every file must have the "
                                   "same configuration. Evaluate the result closed loop (agent evaluate) before "
                                   "trusting it: runs that drifted apart average into a worse policy.")
    p.add_argument("policies", nargs="+", help="two or more .pt policy files (names in policies/ work too)")
    p.add_argument("--weights", type=float, nargs="+", default=None,
                   help="one non-negative weight per policy (normalised to sum 1; default uniform)")
    p.add_argument("--out", required=True, help="the averaged policy file to write")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")


def run_average_policies(args) -> int:
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise CLIError(f"{out} already exists; choose another --out or pass --overwrite")
    soup = average_policy_files(args.policies, args.weights)
    soup.save(out, metadata={"stage": "weight average (model soup)", "averaged": [str(p) for p in args.policies],
                             "weights": args.weights})
    print(f"averaged {len(args.policies)} policies -> {out} ({soup.config.core}, window {soup.config.window}, "
          f"{sum(p.numel() for p in soup.parameters())} parameters)")
    return 0


plot_traces = argparse_main("plot-traces", add_plot_traces, run_plot_traces)
wiring = argparse_main("wiring", add_wiring, run_wiring)
convert_policy = argparse_main("convert-policy", add_convert_policy, run_convert_policy)
average_policies = argparse_main("average-policies", add_average_policies, run_average_policies)
