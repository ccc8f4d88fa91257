"""``gpuctl sinfo``: nodes, summarised by state and GPU model, one per line with -N, or where
they sit with --topology (rack, switch, NVLink islands, NUMA nodes: gpuctl.topology).

``-s`` summarises by partition as Slurm does (NODES(A/I/O/T)) and adds how fragmented the
free GPUs are: free whole GPUs, how many 8-GPU single-node requests they could serve now and
the share of free GPUs no such request can use (the head's PARTITION records carry these,
computed by gpud.sched.fragmentation, the same numbers as ``/metrics``).

``-o`` takes Slurm's %-fields (``%P %.5a %.10l %.6D %.6t %N``); nodes whose shown values
agree share a line, as in Slurm.  Partition fields (%P, %a, %l) ask the head for its
partitions, so a node in two partitions appears under each.
"""

from __future__ import annotations

import click
from gpud.units import format_duration

from .. import columns as cols
from .. import format as fmt
from ..clusters import per_cluster
from .common import session, split_list

_PARTITION_LETTERS = frozenset("PRal")


@click.command("sinfo")
@click.option("-N", "--Node", "per_node", is_flag=True, help="One line per node.")
@click.option("-G", "--gpus", "per_gpu", is_flag=True,
              help="One line per GPU (its sharing mode, use and jobs) and per MIG slice.")
@click.option("-s", "--summarize", "summarize", is_flag=True,
              help="One line per partition: nodes allocated/idle/other/total, free GPUs, "
                   "8-GPU requests they could serve and the fragmentation index.")
@click.option("--topology", "topology", is_flag=True,
              help="One line per node: its rack and switch, its GPUs' NVLink islands and NUMA nodes.")
@click.option("-o", "--format", "format_", metavar="FORMAT", help="Slurm's %-fields, e.g. '%P %.6D %t %N'.")
@click.option("-p", "--partition", "partitions", metavar="PART[,PART...]", multiple=True,
              help="Only nodes of these partitions.")
@click.option("-t", "--states", "states", metavar="STATE[,STATE...]", multiple=True,
              help="Only nodes in these states (idle, mix, alloc, drain, drng, drained, down, ...).")
@click.option("-R", "--list-reasons", "reasons", is_flag=True,
              help="Why nodes are down or drained: reason, user, time and nodes.")
@click.option("-l", "--long", "long_", is_flag=True, help="Slurm's long layout (long state names, and more with -N).")
@click.option("--json", "as_json", is_flag=True, help='Print {"nodes": [...]} as JSON.')
@click.option("-h", "--noheader", is_flag=True, help="Leave out the header line.")
@click.pass_context
@per_cluster
def command(ctx: click.Context, per_node: bool, per_gpu: bool, summarize: bool, topology: bool,
            format_: str | None, partitions: tuple[str, ...], states: tuple[str, ...], reasons: bool, long_: bool,
            as_json: bool, noheader: bool) -> None:
    """Show the cluster's nodes and their GPUs."""
    if format_ is None and reasons:
        format_ = cols.SINFO_REASONS
    elif format_ is None and long_:
        format_ = cols.SINFO_NODES_LONG if per_node else cols.SINFO_LONG
    if summarize:
        clash = [o for o, on in (("-N", per_node), ("-G", per_gpu), ("--topology", topology),
                                 ("-o", format_ is not None)) if on]
        if clash:
            raise click.UsageError(f"-s summarises by partition and cannot be combined with {clash[0]}; "
                                   "drop one of them", ctx)
    try:
        layout = cols.parse_percent(format_, cols.SINFO, "--format") if format_ else None
    except cols.FormatError as e:
        raise click.UsageError(str(e), ctx) from None
    wanted_states = _states(ctx, states)
    client = session(ctx).client
    nodes = client.nodes()
    if wanted_states:
        nodes = [n for n in nodes if {fmt.node_state(n), fmt.node_state_long(n)} & wanted_states]
    if reasons:     # sinfo(1) -R: nodes "in the down, drained, fail or failing state"
        nodes = [dict(n, reason="; ".join(why)) for n in nodes if (why := node_reasons(n))]
    wanted = set(split_list(partitions))
    parts = None
    if wanted or summarize or (layout and any(c.field is cols.SINFO[k] for c in layout for k in _PARTITION_LETTERS)):
        parts = client.show("partition")["partitions"]
        if wanted:
            parts = [p for p in parts if p["name"] in wanted]
            members = {n for p in parts for n in p.get("node_names") or ()}
            nodes = [n for n in nodes if n.get("name") in members]
    if summarize:
        if as_json:
            click.echo(fmt.to_json("partitions", parts or []))
            return
        out = summary_table(nodes, parts or [], header=not noheader)
        if out:
            click.echo(out)
        return
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


# sinfo -t's names, as Slurm's: a short or long state name, or drain for drained and draining
_STATE_NAMES = {"alloc": "alloc", "allocated": "alloc", "mix": "mix", "mixed": "mix", "idle": "idle",
                "down": "down", "drng": "drng", "draining": "drng", "drained": "drain", "unk": "unk",
                "unknown": "unk", "comp": "comp", "completing": "comp"}


def _states(ctx: click.Context, values: tuple[str, ...]) -> set[str]:
    out: set[str] = set()
    for word in (w.lower() for w in split_list(values)):
        if word == "drain":
            out |= {"drain", "drng"}
        elif word in _STATE_NAMES:
            out.add(_STATE_NAMES[word])
        else:
            raise click.UsageError(f"invalid node state {word!r}: use idle, mix, alloc, drain, drng, drained, down "
                                   "or unk", ctx)
    return out


def _shows_partition(layout: list[cols.Column]) -> bool:
    return any(c.field is cols.SINFO[k] for c in layout for k in _PARTITION_LETTERS)


# Slurm's NODES(A/I/O/T): allocated (some or all of it), idle, other (down, drained, unknown)
_ALLOCATED = frozenset({"alloc", "mix", "comp"})


def summary_table(nodes: list[dict], parts: list[dict], *, header: bool = True) -> str:
    """``sinfo -s``: one line per partition with its nodes by state and its fragmentation."""
    by_name = {n.get("name"): n for n in nodes}
    size = next((p["servable_size"] for p in parts if p.get("servable_size")), 8)
    rows = []
    for p in parts:
        members = [by_name[x] for x in p.get("node_names") or () if x in by_name]
        states = [fmt.node_state(n) for n in members]
        alloc = sum(s in _ALLOCATED for s in states)
        idle = sum(s == "idle" for s in states)
        gpus_alloc = sum(int(n.get("gpus_alloc") or 0) for n in members)
        gpus_total = sum(int(n.get("gpus_total") or len(n.get("gpus") or [])) for n in members)
        frag = p.get("fragmentation")
        rows.append((p["name"] + ("*" if p.get("default") else ""),
                     "up" if p.get("state", "UP") == "UP" else "down",
                     "infinite" if p.get("max_time") is None else format_duration(p["max_time"]),
                     f"{alloc}/{idle}/{len(members) - alloc - idle}/{len(members)}",
                     f"{gpus_alloc}/{gpus_total}", _or_dash(p.get("gpus_free")),
                     _or_dash(p.get("gpus_servable")), "-" if frag is None else f"{frag:.2f}",
                     fmt.compress_hostlist(str(n.get("name")) for n in members) or "-"))
    return fmt.table(("PARTITION", "AVAIL", "TIMELIMIT", "NODES(A/I/O/T)", "GPUS(A/T)", "GPUS_FREE",
                      f"SERVABLE({size})", "FRAG", "NODELIST"), rows, right=(1, 2, 3, 4, 5, 6, 7),
                     header=header)


def _or_dash(v: object) -> str:
    """A head from before the fragmentation fields sends none: a dash, not a zero."""
    return "-" if v is None else str(v)


def node_reasons(n: dict) -> list[str]:
    """Why a node is listed by ``sinfo -R``: its drain or down reason, and jobs that run
    unconfined there (the worker's ``[worker] cgroups`` could not be used)."""
    out = []
    if str(n.get("state")) in ("DOWN", "DRAIN"):
        out.append(str(n.get("reason") or "none"))
    labels = n.get("labels") or {}
    if labels.get("confinement") == "none":
        out.append(f"Confinement=none: {labels.get('confinement_reason') or 'unknown'}")
    return out
