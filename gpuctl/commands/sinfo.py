"""``gpuctl sinfo``: nodes, summarised by state and GPU model, or one per line with -N."""

from __future__ import annotations

import click

from .. import format as fmt
from .common import session


@click.command("sinfo")
@click.option("-N", "--Node", "per_node", is_flag=True, help="One line per node.")
@click.option("--json", "as_json", is_flag=True, help='Print {"nodes": [...]} as JSON.')
@click.option("-h", "--noheader", is_flag=True, help="Leave out the header line.")
@click.pass_context
def command(ctx: click.Context, per_node: bool, as_json: bool, noheader: bool) -> None:
    """Show the cluster's nodes and their GPUs."""
    nodes = session(ctx).client.nodes()
    if as_json:
        click.echo(fmt.to_json("nodes", nodes))
        return
    table = fmt.sinfo_nodes_table if per_node else fmt.sinfo_summary_table
    out = table(nodes, header=not noheader)
    if out:
        click.echo(out)
