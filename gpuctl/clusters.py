"""Several clusters from one gpuctl: ``gpuctl -M NAME[,NAME...]|all VERB ...``.

Theory of operation
-------------------
The clusters are named in the ``[clusters]`` table of the config file gpuctl reads anyway
(``--config``, ``$GPUD_CONFIG``, ``/etc/gpud/gpud.toml``), one ``NAME = "SOCKET"`` line
each: the socket of that cluster's head, or of a relay for it on this host.  ``-M`` picks
some of them (``all``: every one, in the table's order); a name not in the table is the
user's mistake (exit 2), before anything is sent.

The verbs use the clusters in three ways:

* listing verbs (squeue, sinfo, sacct) run once per cluster through ``per_cluster``.  Each
  run is the verb unchanged against that cluster's head; what it printed is shown under a
  ``CLUSTER: NAME`` line, as Slurm does, and ``--json`` documents are merged into one, each
  record gaining ``"cluster"``.  A cluster that cannot be reached costs one warning line and
  the others still answer; only when none answers is it an error.
* sbatch with several clusters asks each for a ``--test-only`` estimate and submits where
  the job would start earliest (``pick_cluster``; a tie goes to the cluster named first).
* every other verb acts on one cluster: ``-M NAME`` points it there, several names are a
  usage error.

Stdlib and click only, and read only when ``-M`` is given: gpuctl starts on every call.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import math
import os
import re
from typing import Any, Callable

import click

from gpud.protocol import DEFAULT_CONFIG, ProtocolError, RemoteError

from .client import Client, HeadUnavailable

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SOCKET_HINT = "(is gpud running? set GPUD_SOCKET or --socket)"   # gpuctl.client's
_HOW = 'add a [clusters] table to it with one NAME = "/path/to/gpud.sock" line per cluster'


class ClusterError(ValueError):
    """``-M`` or the ``[clusters]`` table is wrong; the message says what to write instead."""


# -- which clusters ---------------------------------------------------------------------------

def config_file(config_path: str | None) -> str:
    return config_path or os.environ.get("GPUD_CONFIG") or DEFAULT_CONFIG


def configured(config_path: str | None) -> dict[str, str]:
    """NAME -> socket from the config file's ``[clusters]`` table, in the file's order."""
    path = config_file(config_path)
    try:
        with open(path, "rb") as f:
            import tomllib

            data = tomllib.load(f)
    except FileNotFoundError:
        raise ClusterError(f"-M: no config file {path} to name the clusters; {_HOW}") from None
    except OSError as e:
        raise ClusterError(f"-M: cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ClusterError(f"-M: {path} is not valid TOML ({e}); run gpud check-config") from None
    table = data.get("clusters")
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise ClusterError(f"-M: clusters in {path} must be a table; {_HOW}")
    for name, sock in table.items():
        if not _NAME.match(name) or not isinstance(sock, str) or not sock:
            raise ClusterError(f"-M: bad entry {name!r} in the [clusters] table of {path}: write "
                               f'NAME = "/path/to/gpud.sock" with a name of letters, digits, ".", "_" and "-"')
    return dict(table)


def select(spec: str, config_path: str | None) -> list[tuple[str, str]]:
    """(name, socket) for each cluster ``-M`` names, in the order named, each once."""
    words = [w.strip() for w in spec.split(",") if w.strip()]
    if not words:
        raise ClusterError("-M: give cluster names (a,b) or all")
    table = configured(config_path)
    if not table:
        raise ClusterError(f"-M: {config_file(config_path)} names no clusters; {_HOW}")
    if any(w.lower() == "all" for w in words):
        return list(table.items())
    out: list[tuple[str, str]] = []
    for w in words:
        if w not in table:
            raise ClusterError(f"-M: no cluster named {w!r} in {config_file(config_path)}; "
                               f"its [clusters] table names {', '.join(table)}")
        if (w, table[w]) not in out:
            out.append((w, table[w]))
    return out


# -- listing verbs: once per cluster ----------------------------------------------------------

def per_cluster(verb: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a listing verb's callback (under ``@click.pass_context``) to run it on every
    cluster ``-M`` names; without ``-M`` it runs once, as before."""

    @functools.wraps(verb)
    def run(ctx: click.Context, *args: Any, **kwargs: Any) -> Any:
        from .commands.common import session

        sess = session(ctx)
        if sess.targets is None:
            return verb(ctx, *args, **kwargs)
        return fan_out(ctx, sess, lambda: verb(ctx, *args, **kwargs), bool(kwargs.get("as_json")))

    return run


def fan_out(ctx: click.Context, sess: Any, run: Callable[[], Any], as_json: bool) -> None:
    """Run ``run`` with the session bound to each cluster in turn; print the answers."""
    from .commands.common import CommandFailed

    verb = ctx.info_name or "gpuctl"
    answers: list[tuple[str, str]] = []
    refused = unreachable = 0
    for name, _ in sess.targets:
        out = io.StringIO()
        sess.bound = name
        try:
            with contextlib.redirect_stdout(out):
                run()
        except HeadUnavailable as e:
            if len(sess.targets) == 1:      # the one cluster asked for: a plain error
                raise CommandFailed(unreachable_text(e), prog=verb) from None
            click.echo(f"{verb}: warning: cluster {name}: {unreachable_text(e)}", err=True)
            unreachable += 1
            continue
        except (RemoteError, ProtocolError) as e:
            if len(sess.targets) == 1:
                raise CommandFailed(str(e), prog=verb) from None
            click.echo(f"{verb}: error: cluster {name}: {e}", err=True)
            refused += 1
            continue
        finally:
            sess.bound = None
        answers.append((name, out.getvalue()))
    if not answers and unreachable and not refused:
        raise CommandFailed(f"no cluster answered ({', '.join(n for n, _ in sess.targets)})", prog=verb)
    if as_json:
        click.echo(merge_json(answers))
    else:
        for i, (name, text) in enumerate(answers):
            if i:
                click.echo("")
            click.echo(f"CLUSTER: {name}")
            click.echo(text, nl=False)
    if refused:
        ctx.exit(1)


def merge_json(answers: list[tuple[str, str]]) -> str:
    """One ``{"jobs": [...]}`` (or ``"nodes"``) document from each cluster's, records tagged."""
    merged: dict[str, Any] = {}
    for name, text in answers:
        if not text.strip():
            continue
        for key, value in json.loads(text).items():
            if isinstance(value, list):
                merged.setdefault(key, []).extend(
                    {"cluster": name, **r} if isinstance(r, dict) else r for r in value)
            else:
                merged.setdefault(key, value)
    return json.dumps(merged, indent=2, ensure_ascii=False)


def unreachable_text(e: HeadUnavailable) -> str:
    """The client's message, its hint turned from --socket (which -M excludes) to the table."""
    return str(e).replace(_SOCKET_HINT, "(is its head, or a relay for it, running on this host?)")


# -- sbatch: where the job would start earliest -----------------------------------------------

def earliest(estimates: list[tuple[str, dict[str, Any]]]) -> tuple[str, dict[str, Any]] | None:
    """The cluster whose estimate starts first; a job that would not start soon counts as
    never; ties, never included, go to the cluster named first."""
    best: tuple[float, str, dict[str, Any]] | None = None
    for name, est in estimates:
        start = est.get("start_time")
        key = math.inf if start is None else float(start)
        if best is None or key < best[0]:
            best = (key, name, est)
    return None if best is None else (best[1], best[2])


def estimates(sess: Any, spec: dict[str, Any], verb: str = "sbatch") -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """Each cluster's ``--test-only`` answer for ``spec``, and the refusals (``cluster C: ...``).
    An unreachable cluster is one warning line and left out."""
    trial = dict(spec, test_only=True)
    answers: list[tuple[str, dict[str, Any]]] = []
    refusals: list[str] = []
    for name, _ in sess.targets:
        try:
            answers.append((name, sess.client_for(name).submit_request(trial)))
        except HeadUnavailable as e:
            click.echo(f"{verb}: warning: cluster {name}: {unreachable_text(e)}", err=True)
        except (RemoteError, ProtocolError) as e:
            refusals.append(f"cluster {name}: {e}")
    return answers, refusals


def pick_cluster(sess: Any, spec: dict[str, Any]) -> tuple[str, Client]:
    """The cluster to submit ``spec`` to, and its client: the only one named, or the one
    where the job would start earliest."""
    from .commands.common import CommandFailed

    if len(sess.targets) == 1:
        name = sess.targets[0][0]
        return name, sess.client_for(name)
    answers, refusals = estimates(sess, spec)
    best = earliest(answers)
    if best is None:
        raise CommandFailed(refusals[0] if refusals else
                            f"no cluster answered ({', '.join(n for n, _ in sess.targets)})")
    return best[0], sess.client_for(best[0])


def test_everywhere(sess: Any, spec: dict[str, Any], describe: Callable[[dict[str, Any]], str]) -> None:
    """``sbatch --test-only`` on several clusters: each cluster's estimate, and nothing
    submitted; refusals are error lines (exit 1 when no cluster could say)."""
    from .commands.common import CommandFailed, error_line

    answers, refusals = estimates(sess, spec)
    for message in refusals:
        error_line(message)
    for name, est in answers:
        click.echo(f"{describe(est)} on cluster {name}", err=True)
    if not answers:
        raise CommandFailed(f"no cluster could estimate the job ({', '.join(n for n, _ in sess.targets)})")
