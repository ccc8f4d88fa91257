"""``gpuctl squeue``: pending and running jobs, Slurm's columns, formats, or ``--json``.

Without ``-o``/``-O``/``-l``/``--start`` the table is gpud's (with a GPUS column); with them,
Slurm's layouts (``gpuctl.columns``).  Pending tasks of an array show as one line
(``123_[4-99%10]``) unless ``-r``; ``-j 123`` lists the whole array, ``-j 123_4`` one task.

Theory of operation
-------------------
squeue runs in loops and scripts, so its time is mostly start-up and the size of the
answer.  Two things keep both small:

* The head does the heavy part of the listing.  It is asked to ``fold`` pending arrays
  (in squeue's order, exactly as ``gpuctl.columns.collapse_arrays`` would) whenever the
  listing would fold them anyway, to filter by partition and account, and, for gpud's own
  table, to send only the ``fields`` the table shows, as ``rows`` of values rather than
  records that repeat every key: 100,000 pending tasks in ten arrays come back as ten
  short rows, and 10,000 separate jobs in a third of the bytes.  A head that does not know
  these arguments ignores them; its answer then lacks ``"folded"`` (or ``"rows"``) and
  everything is done here as before.
* ``fast_main`` runs the common invocations (the default table with -u, -j, -t, -p, -A,
  --me, -r, -h) without click or the format tables, for a hook in gpuctl's entry point;
  it returns None for anything else, and the click command below handles it.  Both go
  through ``Query`` and ``listing``, so they print the same thing.

This module loads neither click nor ``gpuctl.columns`` when imported: the click command
is built on first access to ``command`` (module ``__getattr__``).
"""

from __future__ import annotations

import os
import sys
import time

from .. import format as fmt

TYPE_CHECKING = False   # typing costs gpuctl's start-up; annotations are strings anyway
if TYPE_CHECKING:
    from typing import Any

_STATES = {**{code: name for name, code in fmt.STATE_CODES.items()}, **{n: n for n in fmt.STATE_CODES}}
clock = time.time  # replaceable in tests
_FINISHED = frozenset(fmt.STATE_CODES) - {"PENDING", "RUNNING", "COMPLETING"}
# Every field gpud's own table (format.squeue_table) and the filtering, ordering and
# folding here read; the head sends only these for it (tests/test_squeue_scale.py checks).
TABLE_FIELDS = ("job_id", "display_id", "name", "user", "uid", "account", "partition", "state", "reason",
                "node", "nodelist", "gpus", "start_time", "end_time", "priority",
                "array_job_id", "array_task_id", "array_throttle")


class QueryError(ValueError):
    """A mistake in the command line (exit 2); the message says what to type instead."""


def split_list(values: tuple[str, ...] | list[str]) -> list[str]:
    """``-u a,b -u c`` -> ["a", "b", "c"] (as gpuctl.commands.common, without click)."""
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def parse_states(values: tuple[str, ...] | list[str]) -> tuple[list[str] | None, bool]:
    """(state names or None for any, whether finished jobs are wanted) from ``-t`` values."""
    words = [w.upper() for w in split_list(values)]
    if not words:
        return None, False
    if "ALL" in words:
        return None, True
    states = []
    for w in words:
        if w not in _STATES:
            raise QueryError(
                f"invalid job state {w!r}: use names or codes like PENDING, PD, RUNNING, R, or all")
        states.append(_STATES[w])
    return sorted(set(states)), any(s in _FINISHED for s in states)


def select_refs(records: list[dict], refs: list[int | str]) -> list[dict]:
    """Records named by ``refs`` (``42`` also means every task of array 42; ``42_7`` one task)."""
    ids = {r for r in refs if isinstance(r, int)}
    tasks = {tuple(int(x) for x in r.split("_")) for r in refs if isinstance(r, str)}
    return [j for j in records if j.get("job_id") in ids or j.get("array_job_id") in ids
            or (j.get("array_job_id"), j.get("array_task_id")) in tasks]


class Query:
    """One squeue invocation, parsed: what to ask the head and how to show the answer."""

    def __init__(self, *, refs: list[int | str], states: list[str] | tuple[str, ...], users: list[str],
                 partitions: list[str], accounts: list[str], me: bool = False, layout: Any = None,
                 names: list[str] = (), nodes: list[str] = (), qos: list[str] = (),
                 long_: bool = False, start: bool = False, sort: str | None = None,
                 expand_arrays: bool = False, as_json: bool = False, noheader: bool = False) -> None:
        self.refs = refs
        self.wanted, self.finished = parse_states(states)
        if start:
            self.wanted, self.finished = ["PENDING"], False
        self.users, self.me = users, me
        self.partitions, self.accounts = set(partitions), set(accounts)
        self.names, self.qos = set(names), set(qos)
        self.nodes: set[str] = set()
        if nodes:
            from gpud.hostlist import expand

            try:
                self.nodes = set(expand(",".join(nodes)))
            except ValueError as e:
                raise QueryError(f"--nodelist: {e}") from None
        self.layout, self.long_, self.start, self.sort = layout, long_, start, sort
        self.expand_arrays, self.as_json, self.noheader = expand_arrays, as_json, noheader

    def request(self) -> dict[str, Any]:
        """The ``jobs`` op's arguments (gpud.protocol)."""
        args: dict[str, Any] = {}
        ids = sorted({int(str(r).split("_")[0]) for r in self.refs})
        if ids:
            args["job_ids"] = ids
        if self.users:
            args["users"] = list(self.users)
        if self.wanted is not None:
            args["states"] = list(self.wanted)
        if self.finished:
            args["all"] = True
        if self.partitions:
            args["partitions"] = sorted(self.partitions)
        if self.accounts:
            args["accounts"] = sorted(self.accounts)
        # folding on the head is squeue's order then collapse_arrays: only when nothing
        # else reorders or selects tasks in between
        if not (self.expand_arrays or self.as_json or self.start or self.sort or self.finished
                or any(isinstance(r, str) for r in self.refs)):
            args["fold"] = True
        if self.layout is None and not self.as_json:
            args["fields"] = list(TABLE_FIELDS) + (["qos"] if self.qos else [])
            if args.get("fold"):
                args["rows"] = True
        return args


def listing(client: Any, q: Query) -> str:
    """What squeue prints (no trailing newline; "" for nothing).  QueryError for a bad -S;
    RemoteError, HeadUnavailable or ProtocolError from the head."""
    args = q.request()
    if q.me:
        args["users"] = args.get("users", []) + [str(client.ping()["user"])]
    result = client.call("jobs", **args)
    records = _records(result)
    folded = result.get("folded") is True
    if q.refs:
        records = select_refs(records, q.refs)
    if q.partitions:
        records = [j for j in records if j.get("partition") in q.partitions]
    if q.accounts:
        records = [j for j in records if j.get("account") in q.accounts]
    if q.names:
        records = [j for j in records if j.get("name") in q.names]
    if q.qos:
        records = [j for j in records if j.get("qos") in q.qos]
    if q.nodes:
        from .scancel import job_nodes

        records = [j for j in records if q.nodes & job_nodes(j)]
    now = clock()
    if not folded:
        records = fmt.squeue_order(records)
    if q.start:
        records = sorted(records, key=lambda j: (j.get("expected_start") or float("inf"), j.get("job_id") or 0))
    if q.sort:
        cols = _columns()
        try:
            records = cols.sort_records(records, q.sort, now)
        except cols.FormatError as e:
            raise QueryError(str(e)) from None
    if q.as_json:
        return fmt.to_json("jobs", records)
    if not q.expand_arrays and not folded:
        records = _columns().collapse_arrays(records)
    if q.layout is None:
        return fmt.squeue_table(records, now, header=not q.noheader)
    out = _columns().render(q.layout, records, now, header=not q.noheader)
    if q.long_ and not q.noheader:
        out = time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(now)) + "\n" + out
    return out


def _records(result: dict) -> list[dict]:
    """The listing's JOB records, from ``rows`` of ``fields`` or from ``jobs``."""
    rows = result.get("rows")
    if rows is None:
        return list(result.get("jobs", []))
    fields = result.get("fields")
    if (not isinstance(fields, list) or not isinstance(rows, list)
            or not all(isinstance(f, str) for f in fields)
            or not all(isinstance(r, list) and len(r) == len(fields) for r in rows)):
        from gpud.protocol import ProtocolError

        raise ProtocolError("malformed job listing from gpud head")
    return [dict(zip(fields, r)) for r in rows]


def _columns() -> Any:
    """gpuctl.columns (the format tables), loaded only when a listing needs it."""
    from .. import columns

    return columns


# -- the click command ------------------------------------------------------------------------

def _layout(format_: str | None, format_long: str | None, long_: bool, start: bool) -> Any:
    from .. import columns as cols

    if format_:
        return cols.parse_percent(format_, cols.SQUEUE, "--format")
    if format_long:
        return cols.parse_named(format_long, cols.SQUEUE_NAMES, cols.SQUEUE, "--Format")
    if start:
        return cols.parse_percent(cols.SQUEUE_START, cols.SQUEUE, "--start")
    if long_:
        return cols.parse_percent(cols.SQUEUE_LONG, cols.SQUEUE, "--long")
    return None


def _click_command() -> Any:
    import click

    from .. import columns as cols
    from ..clusters import per_cluster
    from .common import job_refs, session

    @click.command("squeue")
    @click.option("-u", "--user", "users", metavar="USER[,USER...]", multiple=True,
                  help="Only jobs of these users.")
    @click.option("-j", "--jobs", "jobs", metavar="ID[,ID...]", multiple=True,
                  help="Only these jobs (42, 42_7, 42_[1-3]).")
    @click.option("-t", "--states", "states", metavar="STATE[,STATE...]", multiple=True,
                  help="Only jobs in these states (names or codes; 'all' adds finished jobs).")
    @click.option("-p", "--partition", "partitions", metavar="PART[,PART...]", multiple=True,
                  help="Only jobs in these partitions.")
    @click.option("-A", "--account", "accounts", metavar="ACCOUNT[,ACCOUNT...]", multiple=True,
                  help="Only jobs charged to these accounts.")
    @click.option("--me", is_flag=True, help="Only my jobs.")
    @click.option("-n", "--name", "names", metavar="NAME[,NAME...]", multiple=True, help="Only jobs with these names.")
    @click.option("-w", "--nodelist", "nodes", metavar="HOSTLIST", multiple=True,
                  help="Only jobs on these nodes (gpu[01-04]).")
    @click.option("-q", "--qos", "qos", metavar="QOS[,QOS...]", multiple=True, help="Only jobs of these QOS.")
    @click.option("-o", "--format", "format_", metavar="FORMAT",
                  help="Slurm's %-fields, e.g. '%.18i %.9P %j %R'.")
    @click.option("-O", "--Format", "format_long", metavar="FIELDS",
                  help="Named fields, e.g. jobid:10,name:30,state.")
    @click.option("-l", "--long", "long_", is_flag=True, help="Slurm's long layout (state, time limit).")
    @click.option("--start", is_flag=True, help="Pending jobs with their expected start times.")
    @click.option("-S", "--sort", "sort", metavar="KEYS", help="Sort by %-letters, e.g. -p,i ('-' descending).")
    @click.option("-r", "--array", "expand_arrays", is_flag=True, help="One line per array task.")
    @click.option("--json", "as_json", is_flag=True, help='Print {"jobs": [...]} as JSON.')
    @click.option("-h", "--noheader", is_flag=True, help="Leave out the header line.")
    @click.pass_context
    @per_cluster
    def command(ctx: click.Context, users: tuple[str, ...], jobs: tuple[str, ...], states: tuple[str, ...],
                partitions: tuple[str, ...], accounts: tuple[str, ...], me: bool, names: tuple[str, ...],
                nodes: tuple[str, ...], qos: tuple[str, ...], format_: str | None,
                format_long: str | None, long_: bool, start: bool, sort: str | None, expand_arrays: bool,
                as_json: bool, noheader: bool) -> None:
        """List pending and running jobs (all users unless -u or --me)."""
        try:
            refs = job_refs(jobs, "--jobs")
            q = Query(refs=refs, states=states, users=split_list(users), partitions=split_list(partitions),
                      accounts=split_list(accounts), me=me, names=split_list(names), nodes=list(nodes),
                      qos=split_list(qos), long_=long_, start=start, sort=sort,
                      expand_arrays=expand_arrays, as_json=as_json, noheader=noheader)
            q.layout = _layout(format_, format_long, long_, start)
            out = listing(session(ctx).client, q)
        except (QueryError, cols.FormatError) as e:
            raise click.UsageError(str(e), ctx) from None
        if out:
            click.echo(out)

    return command


def __getattr__(name: str) -> Any:
    # ``command`` is built on first use, so that importing this module for fast_main costs
    # neither click nor the format tables.
    if name == "command":
        cmd = globals()["command"] = _click_command()
        return cmd
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- the fast path ----------------------------------------------------------------------------

_GLOBAL_VALUES = {"--socket": "socket", "--config": "config"}
_VALUES = {"-u": "users", "--user": "users", "-j": "jobs", "--jobs": "jobs", "-t": "states",
           "--states": "states", "-p": "partitions", "--partition": "partitions", "-A": "accounts",
           "--account": "accounts", "-n": "names", "--name": "names", "-w": "nodes", "--nodelist": "nodes",
           "-q": "qos", "--qos": "qos"}
_FLAGS = {"--me": "me", "-r": "expand_arrays", "--array": "expand_arrays", "-h": "noheader",
          "--noheader": "noheader"}


def fast_main(argv: list[str]) -> int | None:
    """Run ``gpuctl [--socket P] [--config P] squeue [OPTIONS]`` without click when the
    options are ones the default table takes; the exit status, or None (nothing done, no
    output) for anything else, which the click command then handles in full."""
    parsed = _fast_parse(argv)
    if parsed is None:
        return None
    glob, opts = parsed
    words = split_list(opts["jobs"])
    if not all(w.isdigit() and w[0] != "0" for w in words):
        return None                         # 42_7, 42_[1-3] and mistakes: the full parser
    try:
        q = Query(refs=[int(w) for w in words], states=opts["states"], users=split_list(opts["users"]),
                  partitions=split_list(opts["partitions"]), accounts=split_list(opts["accounts"]),
                  names=split_list(opts["names"]), nodes=opts["nodes"], qos=split_list(opts["qos"]), me=opts["me"], expand_arrays=opts["expand_arrays"], noheader=opts["noheader"])
    except QueryError:
        return None                         # the click command prints the usage error
    from ..client import Client, HeadUnavailable
    from gpud.protocol import ProtocolError, RemoteError

    client = None
    try:     # failures framed as gpuctl.main frames them for the click command
        client = Client(glob.get("socket"), config_path=glob.get("config"))
        out = listing(client, q)
        if out:
            _write(sys.stdout, out)
        return 0
    except (RemoteError, HeadUnavailable, ProtocolError) as e:
        _write(sys.stderr, f"squeue: error: {' '.join(str(e).split())}")
        return 1
    except (KeyboardInterrupt, EOFError):
        _write(sys.stderr, "\ngpuctl: interrupted")
        return 130
    except BrokenPipeError:     # ``| head``: no complaint, exit 1
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
    finally:
        if client is not None:
            client.close()


def _write(stream: Any, text: str) -> None:
    if "\x1b" in text:    # click.echo strips escape sequences when not on a terminal
        import click

        click.echo(text, err=stream is sys.stderr)
        return
    stream.write(text + "\n")
    stream.flush()


def _fast_parse(argv: list[str]) -> tuple[dict[str, str], dict[str, Any]] | None:
    """(global options, squeue options) for the simple spellings click would accept the
    same way; None for anything else (other verbs, -M, --help, unknown or odd forms)."""
    glob: dict[str, str] = {}
    i = 0
    while i < len(argv) and argv[i] != "squeue":
        name, eq, value = argv[i].partition("=")
        if name not in _GLOBAL_VALUES:
            return None
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
                return None
            i += 1
            value = argv[i]
        glob[_GLOBAL_VALUES[name]] = value
        i += 1
    if i >= len(argv):
        return None
    opts: dict[str, Any] = {"users": [], "jobs": [], "states": [], "partitions": [], "accounts": [],
                            "names": [], "nodes": [], "qos": [],
                            "me": False, "expand_arrays": False, "noheader": False}
    rest = argv[i + 1:]
    k = 0
    while k < len(rest):
        arg = rest[k]
        if arg in _FLAGS:
            opts[_FLAGS[arg]] = True
        elif arg in _VALUES:
            if k + 1 >= len(rest) or rest[k + 1].startswith("-"):
                return None
            k += 1
            opts[_VALUES[arg]].append(rest[k])
        elif arg.startswith("--") and arg.partition("=")[0] in _VALUES and "=" in arg:
            name, _, value = arg.partition("=")
            opts[_VALUES[name]].append(value)
        elif len(arg) > 2 and arg[:2] in _VALUES and not arg.startswith("--"):
            opts[_VALUES[arg[:2]]].append(arg[2:])      # -ubob
        elif len(arg) > 2 and arg[0] == "-" and arg[1] != "-" and all(f"-{c}" in ("-h", "-r") for c in arg[1:]):
            for c in arg[1:]:
                opts[_FLAGS[f"-{c}"]] = True            # -hr
        else:
            return None
        k += 1
    return glob, opts
