"""``gpuctl sinfo``: nodes, summarised by state and GPU model, one per line with -N, or where
they sit with --topology (rack, switch, NVLink islands, NUMA nodes: gpuctl.topology).

``-o`` takes Slurm's %-fields (``%P %.5a %.10l %.6D %.6t %N``); nodes whose shown values
agree share a line, as in Slurm.  Partition fields (%P, %a, %l) ask the head for its
partitions, so a node in two partitions appears under each.
"""

from __future__ import annotations

import click

from .. import columns as cols
from .. import format as fmt
from ..clusters import per_cluster
from .common import session, split_list

_PARTITION_LETTERS = frozenset("PRal")


@click.command("sinfo")
@click.option("-N", "--Node", "per_node", is_flag=True, help="One line per node.")
@click.option("-G", "--gpus", "per_gpu", is_flag=True,
              help="One line per GPU (its sharing mode, use and jobs) and per MIG slice.")
@click.option("--topology", "topology", is_flag=True,
              help="One line per node: its rack and switch, its GPUs' NVLink islands and NUMA nodes.")
@click.option("-o", "--format", "format_", metavar="FORMAT", help="Slurm's %-fields, e.g. '%P %.6D %t %N'.")
@click.option("-p", "--partition", "partitions", metavar="PART[,PART...]", multiple=True,
              help="Only nodes of these partitions.")
@click.option("--json", "as_json", is_flag=True, help='Print {"nodes": [...]} as JSON.')
@click.option("-h", "--noheader", is_flag=True, help="Leave out the header line.")
@click.pass_context
@per_cluster
def command(ctx: click.Context, per_node: bool, per_gpu: bool, topology: bool, format_: str | None,
            partitions: tuple[str, ...], as_json: bool, noheader: bool) -> None:
    """Show the cluster's nodes and their GPUs."""
    try:
        layout = cols.parse_percent(format_, cols.SINFO, "--format") if format_ else None
    except cols.FormatError as e:
        raise click.UsageError(str(e), ctx) from None
    client = session(ctx).client
    nodes = client.nodes()
    wanted = set(split_list(partitions))
    parts = None
    if wanted or (layout and any(c.field is cols.SINFO[k] for c in layout for k in _PARTITION_LETTERS)):
        parts = client.show("partition")["partitions"]
        if wanted:
            parts = [p for p in parts if p["name"] in wanted]
            members = {n for p in parts for n in p.get("node_names") or ()}
            nodes = [n for n in nodes if n.get("name") in members]
    if as_json:
        click.echo(fmt.to_json("nodes", nodes))
        return
    if layout is not None:
        rows = cols.sinfo_rows(nodes, parts if parts is not None and _shows_partition(layout) else None,
                               layout, per_node)
        out = cols.render(layout, rows, 0.0, header=not noheader)
    elif per_gpu:
        out = fmt.sinfo_gpus_table(nodes, header=not noheader)
    elif topology:
        from ..topology import sinfo_table

        out = sinfo_table(nodes, header=not noheader)
    else:
        table = fmt.sinfo_nodes_table if per_node else fmt.sinfo_summary_table
        out = table(nodes, header=not noheader)
    if out:
        click.echo(out)


def _shows_partition(layout: list[cols.Column]) -> bool:
    return any(c.field is cols.SINFO[k] for c in layout for k in _PARTITION_LETTERS)
