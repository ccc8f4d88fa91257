"""``gpuctl sshare``: shares, usage and fair-share factors through the account tree."""

from __future__ import annotations

import click

from .. import format as fmt
from .common import session, split_list


@click.command("sshare")
@click.option("-u", "--users", "users", metavar="USER[,USER...]", multiple=True,
              help="Only these users' rows (accounts are always shown).")
@click.option("-a", "--all", "all_users", is_flag=True, help="Every user row (the default).")
@click.option("--json", "as_json", is_flag=True, help='Print {"rows": [...]} as JSON.')
@click.option("-h", "--noheader", is_flag=True, help="Leave out the header line.")
@click.pass_context
def command(ctx: click.Context, users, all_users: bool, as_json: bool, noheader: bool) -> None:
    """Show fair-share: shares, raw and effective usage, and each user's factor."""
    result = session(ctx).client.call("sshare", users=split_list(users) or None)
    if as_json:
        click.echo(fmt.to_json("rows", result["rows"]))
        return
    rows = []
    for r in result["rows"]:
        indent = " " * r["depth"]
        fs = "" if r["fairshare"] is None else f"{r['fairshare']:.6f}"
        rows.append([indent + r["account"], r["user"] or "", f"{r['shares']:g}", f"{r['norm_shares']:.6f}",
                     f"{r['raw_usage']:.0f}", f"{r['effective_usage']:.6f}", fs])
    out = fmt.table(["Account", "User", "RawShares", "NormShares", "RawUsage", "EffectvUsage", "FairShare"],
                    rows, right=range(2, 7), header=not noheader)
    if out:
        click.echo(out)
