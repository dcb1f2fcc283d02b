"""``agent info``: a policy file's model card, read from the file (agent.eval.card); and the card's edits."""
from __future__ import annotations

from dataclasses import dataclass


import tyro

from agent.actors.loading import resolve_policy_path
from agent.cli.common import CLIError
from agent.eval.card import CardError, read_card, read_evaluation, update_card

DESCRIPTION = """Print the model card of policy files: what each is, its recipe, its teacher and data,
its scores on the unseen track sets with 95 % confidence intervals, and its sha256.

The card is stored in the file itself. To add to it (the weights are untouched; the file is
rewritten, so --overwrite is needed): --attach E.json (an `agent evaluate --json` result of the
same weights), --summary, --recipe, --teacher, --data. --markdown prints the cards as
policies/README.md holds them."""


@dataclass(frozen=True)
class InfoArgs:
    """agent info POLICY [POLICY ...]"""

    policies: tyro.conf.Positional[tuple[str, ...]]
    """policy files (.pt or expert .zip; a bare name is looked up in policies/)"""
    markdown: bool = False
    """print the cards as Markdown (the form of policies/README.md)"""
    attach: tuple[str, ...] = ()
    """`agent evaluate --json` results of these weights to store on the card"""
    summary: str | None = None
    """one paragraph: what the policy is and what it is for"""
    recipe: str | None = None
    """the recipe file that remakes it, e.g. recipes/nac.toml"""
    teacher: str | None = None
    """the expert that labelled its data"""
    data: str | None = None
    """the data it was trained on, in words"""
    overwrite: bool = False
    """allow the card's edits to rewrite the file"""


def main(argv: list[str]) -> int:
    """Run ``agent info ARGV``; returns the exit code."""
    args = tyro.cli(InfoArgs, args=argv, prog="agent info", description=DESCRIPTION)
    edits = bool(args.attach) or any(v is not None for v in (args.summary, args.recipe, args.teacher, args.data))
    if edits and len(args.policies) != 1:
        raise CLIError("card edits (--attach, --summary, --recipe, --teacher, --data) apply to one policy file")
    if edits and not args.overwrite:
        raise CLIError("editing the card rewrites the policy file (its weights untouched): pass --overwrite")
    blocks = []
    for name in args.policies:
        path = resolve_policy_path(name)
        try:
            if edits:
                evaluations = [(read_evaluation(e), str(e)) for e in args.attach]
                card = update_card(path, summary=args.summary, recipe=args.recipe, teacher=args.teacher,
                                   data=args.data, evaluations=evaluations)
            else:
                card = read_card(path)
        except CardError as exc:
            raise CLIError(str(exc)) from exc
        blocks.append("\n".join(card.lines(markdown=args.markdown)).rstrip())
    print("\n\n".join(blocks))
    return 0


__all__ = ["DESCRIPTION", "InfoArgs", "main"]


