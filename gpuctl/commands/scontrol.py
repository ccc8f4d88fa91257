"""``gpuctl scontrol``: look at and change jobs, nodes and the head, as Slurm's scontrol does.

    scontrol show job|node|partition [ID|NAME]...     scontrol show config
    scontrol hold|uhold|release|requeue ID...
    scontrol update job ID Key=Value...               (or: update JobId=ID Key=Value...)
    scontrol update node NAME State=DRAIN Reason=...  (or: update NodeName=NAME ...)
    scontrol reconfigure

Words are parsed here, Slurm's way (case-insensitive commands and keys, ``Key=Value``
pairs); the head decides who may do what.  Exit status: 0 done; 1 the head refused (each
refusal is its own ``scontrol: error:`` line) or could not be reached; 2 a mistake in the
command.
"""

from __future__ import annotations

import json
from typing import Any

import click

from .. import format as fmt
from .common import CommandFailed, error_line, job_refs, session

USAGE = ("use: show job|node|partition|config [ID], hold|uhold|release|requeue ID..., "
         "update job ID Key=Value..., update node NAME State=DRAIN|RESUME [Reason=...], reconfigure")
_JOB_ACTIONS = ("hold", "uhold", "release", "requeue")


@click.command("scontrol", context_settings={"ignore_unknown_options": True})
@click.option("-o", "--oneliner", is_flag=True, help="Each record of show on one line.")
@click.option("--json", "as_json", is_flag=True, help="Print what show finds as JSON.")
@click.argument("words", nargs=-1, type=click.UNPROCESSED, metavar="COMMAND [ARGS]...")
@click.pass_context
def command(ctx: click.Context, oneliner: bool, as_json: bool, words: tuple[str, ...]) -> None:
    """Show or change jobs, nodes and partitions; reconfigure the head."""
    if not words:
        raise click.UsageError(f"no command given; {USAGE}", ctx)
    verb, rest = words[0].lower(), list(words[1:])
    if verb == "show":
        _show(ctx, rest, oneliner, as_json)
    elif verb in _JOB_ACTIONS:
        ids = _ids(ctx, rest, verb)
        client = session(ctx).client
        result = (client.hold(ids, user=True) if verb == "uhold" else getattr(client, verb)(ids))
        _errors(result)
    elif verb == "update":
        _update(ctx, rest)
    elif verb in ("reconfigure", "reconfig"):
        if rest:
            raise click.UsageError("reconfigure takes no arguments", ctx)
        result = session(ctx).client.call("reconfigure")
        for note in result.get("restart_needed") or ():
            click.echo(f"scontrol: warning: needs a restart to take effect: {note}", err=True)
    else:
        raise click.UsageError(f"unknown command {words[0]!r}; {USAGE}", ctx)


def _ids(ctx: click.Context, words: list[str], what: str) -> list[int | str]:
    values = [w.split("=", 1)[1] if w.lower().startswith("jobid=") else w for w in words]
    if not values:
        raise click.UsageError(f"{what} needs job ids", ctx)
    return job_refs(values, what)


def _errors(result: dict[str, Any]) -> None:
    errors = [str(e) for e in result.get("errors") or ()]
    for e in errors[:-1]:
        error_line(e)
    if errors:
        raise CommandFailed(errors[-1])


# -- update -------------------------------------------------------------------------------------

def _pairs(ctx: click.Context, words: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for w in words:
        key, eq, value = w.partition("=")
        if not eq or not key:
            raise click.UsageError(f"expected Key=Value, not {w!r}", ctx)
        out[key] = value
    return out


def _update(ctx: click.Context, words: list[str]) -> None:
    if not words:
        raise click.UsageError(f"update what? {USAGE}", ctx)
    first = words[0].lower()
    client = session(ctx).client
    if first in ("job", "node"):
        if len(words) < 2:
            raise click.UsageError(f"update {first} needs a {'job id' if first == 'job' else 'node name'}", ctx)
        target, pairs = words[1], _pairs(ctx, words[2:])
    else:
        pairs = _pairs(ctx, words)
        key = next((k for k in pairs if k.lower() in ("jobid", "nodename")), None)
        if key is None:
            raise click.UsageError("update needs JobId=ID or NodeName=NAME (or: update job ID ...)", ctx)
        first = "job" if key.lower() == "jobid" else "node"
        target = pairs.pop(key)
    if not pairs:
        raise click.UsageError("nothing to update: give Key=Value pairs", ctx)
    if first == "job":
        _errors(client.update_job(job_refs([target], "update"), **pairs))
        return
    lower = {k.lower(): v for k, v in pairs.items()}
    unknown = set(lower) - {"state", "reason"}
    if unknown:
        raise click.UsageError(f"cannot update {sorted(unknown)[0]!r} of a node; use State= and Reason=", ctx)
    if "state" not in lower:
        raise click.UsageError("update node needs State=DRAIN or State=RESUME", ctx)
    _errors(client.update_node(target, lower["state"], lower.get("reason")))


# -- show ---------------------------------------------------------------------------------------

def _show(ctx: click.Context, words: list[str], oneliner: bool, as_json: bool) -> None:
    if not words:
        raise click.UsageError("show what? use show job, node, partition or config", ctx)
    kind, rest = words[0].lower(), words[1:]
    if "=" in kind:   # show JobId=12, NodeName=gpu01
        key, _, value = words[0].partition("=")
        kind, rest = {"jobid": "job", "nodename": "node", "partitionname": "partition"}.get(key.lower(), kind), \
            [value] + rest
    kind = {"jobs": "job", "nodes": "node", "partitions": "partition"}.get(kind, kind)
    client = session(ctx).client
    if kind == "config":
        result = client.call("show_config")
        if as_json:
            click.echo(json.dumps(result, indent=2))
            return
        click.echo(f"Configuration of the gpud head (from {result.get('path') or 'defaults'})")
        for key, value in _flatten(result.get("config") or {}):
            click.echo(f"{key} = {value}")
        return
    if kind == "job":
        records = client.show("job", ids=_ids(ctx, rest, "show job") if rest else None)["jobs"]
        text = [job_record(j) for j in records]
    elif kind == "node":
        records = client.show("node", names=rest or None)["nodes"]
        text = [node_record(n) for n in records]
    elif kind == "partition":
        records = client.show("partition", names=rest or None)["partitions"]
        text = [partition_record(p) for p in records]
    else:
        raise click.UsageError(f"cannot show {words[0]!r}; use job, node, partition or config", ctx)
    if as_json:
        click.echo(json.dumps({f"{kind}s": records}, indent=2, ensure_ascii=False))
        return
    if not text:
        click.echo(f"No {kind}s in the system")
        return
    for lines in text:
        click.echo(" ".join(lines) if oneliner else "\n   ".join(lines))
        if not oneliner:
            click.echo("")


def _flatten(d: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """Nested config tables as ``section.key`` pairs."""
    out = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out += _flatten(v, key + ".")
        else:
            out.append((key, v if isinstance(v, str) else json.dumps(v)))
    return out


def _t(ts: Any) -> str:
    from gpud.syntax import format_time

    return format_time(ts)


def _v(value: Any, none: str = "(null)") -> str:
    return none if value is None or value == "" else str(value)


def job_record(j: dict[str, Any]) -> list[str]:
    """``scontrol show job``: one record as lines of Key=Value pairs."""
    from gpud.units import format_duration, format_size_mb

    ident = f"JobId={j.get('job_id')}"
    if j.get("array_job_id") is not None:
        ident += f" ArrayJobId={j['array_job_id']} ArrayTaskId={j.get('array_task_id')}"
        if j.get("array_throttle"):
            ident += f" ArrayTaskThrottle={j['array_throttle']}"
    state = str(j.get("state"))
    runtime = fmt.elapsed(j, _now())
    gpus = int(j.get("gpus") or 0)     # the job's, over all its nodes
    nodes, tasks = int(j.get("nodes") or 1), max(1, int(j.get("ntasks_per_node") or 1))
    cpus, mem = int(j.get("cpus") or 0), int(j.get("mem_mb") or 0)   # on each node
    # As Slurm's: NumCPUs and TRES are the job's totals, MinCPUsNode and MinMemoryNode per node.
    tres = (f"cpu={cpus * nodes},mem={format_size_mb(mem * nodes)},node={nodes}"
            + (f",billing={j['billing']:g}" if j.get("billing") else "") + (f",gres/gpu={gpus}" if gpus else ""))
    hold = j.get("hold")
    return [
        f"{ident} JobName={j.get('name')}",
        f"UserId={j.get('user')}({j.get('uid')}) GroupId={j.get('gid')}",
        f"Priority={int(j.get('priority') or 0)} Nice={j.get('nice', 0)} Account={j.get('account')} "
        f"QOS={j.get('qos')}" + (f" Hold={hold}" if hold else ""),
        f"JobState={state} Reason={j.get('reason') or 'None'} Dependency={_v(j.get('dependency'))}",
        f"Requeue={1 if j.get('requeue', True) else 0} Restarts={j.get('requeue_count', 0)} BatchFlag=1 "
        f"ExitCode={fmt.exit_code(j)}",
        *([f"LastRequeue={j['last_requeue']}"] if j.get("last_requeue") else []),
        f"RunTime={format_duration(runtime)} TimeLimit={format_duration(j.get('time_limit'))}",
        f"SubmitTime={_t(j.get('submit_time'))} EligibleTime={_t(j.get('begin_time') or j.get('submit_time'))}",
        f"StartTime={_t(j.get('start_time') or j.get('expected_start'))} EndTime={_t(j.get('end_time'))} "
        f"Deadline={_t(j.get('deadline'))}",
        f"Partition={j.get('partition')}",
        f"ReqNodeList={_v(j.get('req_nodelist'))} ExcNodeList={_v(j.get('exc_nodelist'))}",
        f"NodeList={_v(j.get('nodelist') or j.get('node'))}" + (f" BatchHost={j['node']}" if j.get("node") else ""),
        f"NumNodes={nodes} NumCPUs={cpus * nodes} NumTasks={nodes * tasks} CPUs/Task={cpus // tasks} "
        f"Gres={'gpu' + (':' + j['gpu_type'] if j.get('gpu_type') else '') + f':{gpus}' if gpus else '(null)'}",
        f"TRES={tres}",
        f"MinCPUsNode={cpus} MinMemoryNode={format_size_mb(mem)} "
        f"GPUs={','.join(map(str, j.get('gpu_indices') or [])) or '(null)'}",
        f"Features={_v(j.get('constraint'))} OverSubscribe={'NO' if j.get('exclusive') else 'OK'}",
        f"WorkDir={j.get('work_dir')}",
        f"StdErr={_v(j.get('stderr_path') or j.get('stderr') or j.get('stdout'), 'gpud-%j.out')} "
        f"StdOut={_v(j.get('stdout_path') or j.get('stdout'), 'gpud-%j.out')}",
        f"Comment={_v(j.get('comment'))} MailType={_v(j.get('mail_type'), 'NONE')} "
        f"MailUser={_v(j.get('mail_user') or (j.get('user') if j.get('mail_type') else None))}",
        *([f"TresPerNode=gres:gpu:{gpus // nodes}"] if gpus else []),
    ]


def node_record(n: dict[str, Any]) -> list[str]:
    from gpud.units import format_size_mb

    from .. import topology

    models: dict[str, int] = {}
    for g in n.get("gpus") or []:
        models[str(g.get("model"))] = models.get(str(g.get("model")), 0) + 1
    gres = ",".join(f"gpu:{m}:{c}" for m, c in sorted(models.items())) or "(null)"
    return [
        f"NodeName={n.get('name')} State={n.get('state')}",
        f"CPUTot={n.get('cpus')} CPUAlloc={n.get('cpus_alloc', 0)} RealMemory={n.get('mem_mb')} "
        f"AllocMem={n.get('mem_alloc_mb', 0)} ({format_size_mb(n.get('mem_mb'))})",
        *topology.feature_lines(n),
        f"Gres={gres} GresUsed=gpu:{n.get('gpus_alloc', 0)}",
        f"Partitions={','.join(n.get('partitions') or []) or '(null)'}",
        *topology.node_lines(n),
        f"LastSeen={_t(n.get('last_seen'))} Reason={_v(n.get('reason'))}",
        f"Confinement={(n.get('labels') or {}).get('confinement') or 'none'}",
        *(f"Event={_t(e.get('time'))} {e.get('old_state') or 'NEW'}->{e.get('state')} {e.get('event')}"
          + (f": {e['reason']}" if e.get("reason") else "") for e in n.get("events") or []),
    ]


def partition_record(p: dict[str, Any]) -> list[str]:
    from gpud.units import format_duration

    nodes = fmt.compress_hostlist(p.get("node_names") or []) or "(null)"
    return [
        f"PartitionName={p.get('name')} Default={'YES' if p.get('default') else 'NO'} State={p.get('state', 'UP')}",
        f"Nodes={nodes} TotalNodes={len(p.get('node_names') or [])} TotalCPUs={p.get('cpus_total', 0)} "
        f"TotalGPUs={p.get('gpus_total', 0)}",
        f"DefaultTime={format_duration(p.get('default_time'))} MaxTime={format_duration(p.get('max_time'))} "
        f"PriorityTier={p.get('priority', 0)}",
        f"JobsPending={p.get('jobs_pending', 0)} JobsRunning={p.get('jobs_running', 0)}",
    ]


def _now() -> float:
    import time

    return time.time()
