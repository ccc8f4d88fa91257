"""``gpuctl sprio``: each pending job's priority and the weighted factors it is made of."""

from __future__ import annotations

import click

from .. import format as fmt
from .common import session, split_list

FACTORS = ("age", "fairshare", "job_size", "qos", "partition", "nice")


@click.command("sprio")
@click.option("-j", "--jobs", "jobs", metavar="ID[,ID...]", multiple=True, help="Only these jobs.")
@click.option("-u", "--user", "users", metavar="USER[,USER...]", multiple=True, help="Only these users' jobs.")
@click.option("-w", "--weights", "weights", is_flag=True, help="Print the configured factor weights.")
@click.option("--json", "as_json", is_flag=True, help='Print {"jobs": [...]} as JSON.')
@click.option("-h", "--noheader", is_flag=True, help="Leave out the header line.")
@click.pass_context
def command(ctx: click.Context, jobs, users, weights: bool, as_json: bool, noheader: bool) -> None:
    """Show the priority factors of pending jobs (from the last scheduler pass)."""
    try:
        ids = [int(j) for j in split_list(jobs)] if jobs else None
    except ValueError:
        raise click.BadParameter("job ids must be numbers", param_hint="'-j'") from None
    result = session(ctx).client.call("sprio", job_ids=ids, users=split_list(users) or None)
    if as_json:
        click.echo(fmt.to_json("jobs", result["jobs"]))
        return
    if weights:
        w = result.get("weights", {})
        click.echo(fmt.table(["WEIGHTS", *(f.upper() for f in FACTORS[:-1])],
                             [["", *(f"{w.get(f, 0):g}" for f in FACTORS[:-1])]], header=not noheader))
        return
    rows = [[j["job_id"], j["partition"], j["user"], j["account"], f"{j['priority']:.0f}",
             *(f"{j['factors'].get(f, 0.0):.0f}" for f in FACTORS)] for j in result["jobs"]]
    out = fmt.table(["JOBID", "PARTITION", "USER", "ACCOUNT", "PRIORITY", "AGE", "FAIRSHARE", "JOBSIZE",
                     "QOS", "PARTITION_PRIO", "NICE"], rows, right=range(4, 11), header=not noheader)
    if out:
        click.echo(out)
