"""What every verb shares: the head connection, one-line failures, list arguments."""

from __future__ import annotations

from typing import Any

import click

from ..client import Client


class Session:
    """The global options, and a Client opened only when a verb first needs the head."""

    def __init__(self, socket_path: str | None = None, config_path: str | None = None) -> None:
        self.socket_path = socket_path
        self.config_path = config_path
        self._client: Client | None = None
        # -M (gpuctl.clusters): (name, socket) per named cluster, None without -M; the
        # cluster a listing verb is asking now; a client per cluster.
        self.targets: list[tuple[str, str]] | None = None
        self.bound: str | None = None
        self._clients: dict[str, Client] = {}

    @property
    def client(self) -> Client:
        if self.targets is not None:
            return self.client_for(self._one_cluster())
        if self._client is None:
            self._client = Client(self.socket_path, config_path=self.config_path)
        return self._client

    def client_for(self, cluster: str) -> Client:
        if cluster not in self._clients:
            self._clients[cluster] = Client(dict(self.targets or ())[cluster])
        return self._clients[cluster]

    def _one_cluster(self) -> str:
        assert self.targets is not None
        if self.bound is not None:
            return self.bound
        if len(self.targets) == 1:
            return self.targets[0][0]
        ctx = click.get_current_context(silent=True)
        verb = ctx.info_name if ctx is not None else "this verb"
        raise click.UsageError(f"{verb} acts on one cluster at a time: name one with -M NAME, not "
                               f"{','.join(n for n, _ in self.targets)}", ctx)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        for c in self._clients.values():
            c.close()


class CommandFailed(click.ClickException):
    """A failure that is not the user's typing: printed as ``VERB: error: MESSAGE``, exit 1."""

    exit_code = 1

    def __init__(self, message: str, prog: str | None = None) -> None:
        super().__init__(message)
        if prog is None:
            ctx = click.get_current_context(silent=True)
            prog = ctx.info_name if ctx is not None else None
        self.prog = prog or "gpuctl"


def session(ctx: click.Context) -> Session:
    # ensure_object: a verb invoked on its own (tests, embedding) gets default settings.
    return ctx.ensure_object(Session)


def error_line(message: str) -> None:
    """Print one ``VERB: error: ...`` line without stopping (scancel's per-job refusals)."""
    ctx = click.get_current_context(silent=True)
    prog = ctx.info_name if ctx is not None else "gpuctl"
    click.echo(f"{prog}: error: {message}", err=True)


def split_list(values: tuple[str, ...] | list[str]) -> list[str]:
    """``-u a,b -u c`` -> ["a", "b", "c"]."""
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def job_ids(values: Any, option: str) -> list[int]:
    """Job ids from ``1,2 3``; a usage error for anything that is not a positive number."""
    out = []
    for word in split_list(values):
        if not word.isdigit() or int(word) <= 0:
            raise click.UsageError(f"invalid job id {word!r} for {option}: use positive numbers like 42")
        out.append(int(word))
    return out


def job_refs(values: Any, option: str) -> list[int | str]:
    """Job ids as Slurm writes them: ``42``, ``42_7`` (one array task), ``42_[1-3,7]``."""
    from gpud.syntax import SyntaxProblem, parse_array, parse_job_ref

    out: list[int | str] = []
    for word in (w.strip() for w in _bracket_safe(values)):
        try:
            if word.endswith("]") and "_[" in word:
                base, _, tasks = word[:-1].partition("_[")
                job_id, _ = parse_job_ref(base)
                out += [f"{job_id}_{t}" for t in parse_array(tasks).tasks]
                continue
            job_id, task = parse_job_ref(word)
        except SyntaxProblem:
            raise click.UsageError(f"invalid job id {word!r} for {option}: use numbers like 42, "
                                   "42_7 for an array task or 42_[1-3] for several") from None
        out.append(job_id if task is None else f"{job_id}_{task}")
    return out


def _bracket_safe(values: Any) -> list[str]:
    """Split on commas outside brackets: ``1_[1,2],3`` -> ``1_[1,2]``, ``3``."""
    out = []
    for item in values:
        depth, cur = 0, ""
        for ch in item:
            depth += ch == "["
            depth -= ch == "]"
            if ch == "," and depth == 0:
                out.append(cur)
                cur = ""
            else:
                cur += ch
        out.append(cur)
    return [v for v in out if v.strip()]
