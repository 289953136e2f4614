"""``ferryq lanes``: the busiest lanes, and the rules (limit, policy on a dead job,
rate) of a lane or a prefix of lanes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

import click
from rich.text import Text

from ferryq import _render
from ferryq import lanes as lane_rules
from ferryq.cli.options import FiniteFloat, json_option
from ferryq.cli.output import emit_json, out, show
from ferryq.cli.settings import get_app


@click.group()
def lanes() -> None:
    """Ordered lanes: the busiest, and the limits per lane or prefix."""


@lanes.command("ls")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@json_option
@click.pass_context
def lanes_ls(ctx: click.Context, limit: int, as_json: bool) -> None:
    """Lanes with unfinished jobs, busiest first, then halted lanes."""
    found = get_app(ctx, read_only=True).lanes(limit=limit)
    if as_json:
        emit_json([asdict(info) for info in found])
    elif not found:
        out.print("no lanes with unfinished jobs", style="dim")
    else:
        show(_render.lanes_table(found))
        if len(found) == limit:
            out.print(f"the {limit} busiest lanes: add --limit for more", style="dim")


@lanes.command("limit")
@click.argument("pattern", required=False)
@click.argument("limit", type=int, required=False)
@click.option("--on-dead", type=click.Choice(lane_rules.ON_DEAD),
              help="With LIMIT: halt the lane behind a dead job, or go on. Left out, a "
                   "rule keeps its policy; a new rule continues.")  # fmt: skip
@click.option("--clear", is_flag=True, help="Remove the rule for PATTERN.")
@json_option
@click.pass_context
def lanes_limit(
    ctx: click.Context, pattern: str | None, limit: int | None, on_dead: str | None,
    clear: bool, as_json: bool,
) -> None:  # fmt: skip
    """Show, set or clear the limit of a lane (post:42) or a prefix (tenant:*).

    \b
    ferryq lanes limit                    every rule
    ferryq lanes limit tenant:acme        the rule lane tenant:acme follows
    ferryq lanes limit 'tenant:*' 3       at most 3 running jobs in each tenant lane
    ferryq lanes limit 'tenant:*' --clear back to the next rule, or the default of 1

    Jobs not started yet follow a change at once.
    """
    check_lane_limit_usage(pattern, limit, on_dead, clear)
    app = get_app(ctx, read_only=limit is None and not clear)
    if pattern is None:
        print_rules(app.lane_limits(), as_json)
    elif clear:
        lane_rules.check_rule(pattern, lane_rules.DEFAULT_LIMIT, "continue")
        cleared = app.clear_lane_limit(pattern)
        if as_json:
            emit_json({"pattern": pattern, "cleared": cleared})
        elif cleared:
            out.print(Text(f"cleared the rule for {pattern}"))
        else:
            out.print(Text(f"no rule for {pattern}: nothing changed", style="dim"))
    elif limit is not None:
        rule = app.set_lane_limit(pattern, limit, on_dead)
        if as_json:
            emit_json(asdict(rule))
        else:
            out.print(Text(f"{rule.pattern}: {_render.rule_text(rule)}"))
    else:
        lane_rules.check_rule(pattern, lane_rules.DEFAULT_LIMIT, "continue")
        rule = lane_rules.rule_for(app.lane_limits(), pattern)
        default = rule == lane_rules.DEFAULT_RULE
        if as_json:
            emit_json({"pattern": pattern, "rule": asdict(rule), "default": default})
        else:
            source = "the default" if default else f"rule {rule.pattern}"
            out.print(Text(f"{pattern}: {_render.rule_text(rule)} ({source})"))


@lanes.command("rate")
@click.argument("pattern")
@click.argument("n", type=int, required=False)
@click.option("--per", type=FiniteFloat(min=lane_rules.MIN_PER), default=1.0, show_default=True,
              help="With N: the window, in seconds.")  # fmt: skip
@click.option("--clear", is_flag=True, help="Take the rate off PATTERN's rule.")
@json_option
@click.pass_context
def lanes_rate(
    ctx: click.Context, pattern: str, n: int | None, per: float, clear: bool, as_json: bool
) -> None:
    """Set or clear the rate of a lane (api:acme) or a prefix (api:*).

    \b
    ferryq lanes rate 'api:*' 10           at most 10 starts a second in each api lane
    ferryq lanes rate 'api:*' 100 --per 60 at most 100 starts in any minute
    ferryq lanes rate 'api:*' --clear      no rate; the limit and policy stay

    Every worker on every machine counts against one window per lane. The rule keeps
    its limit and policy; a new rule has limit 1. `ferryq lanes limit` shows rates.
    """
    if clear == (n is not None):
        raise click.UsageError("give N or --clear")
    app = get_app(ctx)
    if clear:
        rule = app.clear_lane_rate(pattern)
        if as_json:
            emit_json({"pattern": pattern, "cleared": rule is not None})
        elif rule is not None:
            out.print(Text(f"{rule.pattern}: {_render.rule_text(rule)}"))
        else:
            out.print(Text(f"no rule for {pattern}: nothing changed", style="dim"))
        return
    assert n is not None
    rule = app.set_lane_rate(pattern, n, per)
    if as_json:
        emit_json(asdict(rule))
    else:
        out.print(Text(f"{rule.pattern}: {_render.rule_text(rule)}"))


def check_lane_limit_usage(
    pattern: str | None, limit: int | None, on_dead: str | None, clear: bool
) -> None:
    if clear and limit is not None:
        raise click.UsageError("give LIMIT or --clear, not both")
    if pattern is None and clear:
        raise click.UsageError("--clear needs a PATTERN")
    if on_dead is not None and limit is None:
        raise click.UsageError("--on-dead goes with LIMIT")


def print_rules(rules: Sequence[lane_rules.LaneRule], as_json: bool) -> None:
    rules = sorted(rules, key=lambda rule: rule.pattern)  # the stores promise no order
    if as_json:
        emit_json([asdict(rule) for rule in rules])
    elif not rules:
        out.print(f"no lane rules: every lane runs {lane_rules.DEFAULT_LIMIT} job at a time")
    else:
        show(_render.rules_table(rules))
