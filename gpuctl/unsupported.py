"""Slurm's sbatch options that gpud does not support, and how to step around them.

Theory of operation
-------------------
A script written for Slurm often carries options that mean nothing here (``--hint``,
``--reservation``, ``--gpu-bind``...).  Refusing the whole script
for them would make every migration a rewrite; ignoring them silently would hide a change
of meaning.  So an option in ``UNSUPPORTED`` is dropped with a one-line warning that names
it (and, with ``--strict``, refused), both in ``#SBATCH`` lines and on the command line.
An option that is in neither this table nor ``gpuctl.options.OPTIONS`` is a typo and an
error, as in Slurm.

``ARITY`` says how each option takes its value, so that dropping it also drops its value
and nothing else: ``value`` (``--opt V``, ``--opt=V``, ``-xV``), ``flag``, or ``optional``
(a value only as ``--opt=V``).

``split_command_line`` takes sbatch's argument list apart before click sees it: the
unsupported options before the script's path are removed and reported; everything from
the script's path on belongs to the script.  A supported flag given one of Slurm's values
that gpud does not implement (``VALUE_REFUSED``: ``--exclusive=user``) is refused there,
in one line, rather than by click's generic "does not take a value".
"""

from __future__ import annotations

import sys
TYPE_CHECKING = False   # typing costs gpuctl's start-up; annotations are strings anyway
if TYPE_CHECKING:
    from typing import Callable, Iterable

# long option -> (short option, arity, hint)
UNSUPPORTED: dict[str, tuple[str | None, str, str]] = {
    "--acctg-freq": (None, "value", ""),
    "--batch": (None, "value", ""),
    "--bb": (None, "value", ""),
    "--bbf": (None, "value", ""),
    "--burst-buffer": (None, "value", ""),
    "--cluster-constraint": (None, "value", ""),
    "--clusters": ("-M", "value", "name clusters before the verb: gpuctl -M a,b sbatch ..."),
    "--container": (None, "value", ""),
    "--container-id": (None, "value", ""),
    "--contiguous": (None, "flag", ""),
    "--core-spec": ("-S", "value", ""),
    "--cores-per-socket": (None, "value", ""),
    "--cpu-freq": (None, "value", ""),
    "--delay-boot": (None, "value", ""),
    "--distribution": ("-m", "value", ""),
    "--export-file": (None, "value", "use --export VAR=VALUE"),
    "--extra-node-info": ("-B", "value", ""),
    "--get-user-env": (None, "optional", "the job gets the submitting environment (see --export)"),
    "--gid": (None, "value", "jobs run with the submitter's groups"),
    "--gpu-bind": (None, "value", "CUDA_VISIBLE_DEVICES lists exactly the job's GPUs"),
    "--gpu-freq": (None, "value", ""),
    "--gpus-per-socket": (None, "value", ""),
    "--hint": (None, "value", ""),
    "--ignore-pbs": (None, "flag", ""),
    "--input": ("-i", "value", "jobs read /dev/null"),
    "--licenses": ("-L", "value", ""),
    "--mcs-label": (None, "value", ""),
    "--mem-bind": (None, "value", ""),
    "--mincpus": (None, "value", "use --cpus-per-task"),
    "--network": (None, "value", ""),
    "--no-kill": ("-k", "optional", ""),
    "--nodefile": ("-F", "value", ""),
    "--ntasks-per-core": (None, "value", ""),
    "--ntasks-per-gpu": (None, "value", ""),
    "--ntasks-per-socket": (None, "value", ""),
    "--overcommit": ("-O", "flag", ""),
    "--oversubscribe": ("-s", "flag", ""),
    "--power": (None, "value", ""),
    "--prefer": (None, "value", ""),
    "--priority": (None, "value", "use --nice, or scontrol update as an admin"),
    "--profile": (None, "value", ""),
    "--propagate": (None, "optional", ""),
    "--reboot": (None, "flag", ""),
    "--reservation": (None, "value", ""),
    "--sockets-per-node": (None, "value", ""),
    "--spread-job": (None, "flag", ""),
    "--thread-spec": (None, "value", ""),
    "--threads-per-core": (None, "value", ""),
    "--time-min": (None, "value", ""),
    "--tmp": (None, "value", ""),
    "--tres-per-task": (None, "value", ""),
    "--uid": (None, "value", "jobs run as their submitter"),
    "--use-min-nodes": (None, "flag", ""),
    "--verbose": ("-v", "flag", ""),
    "--wait-all-nodes": (None, "value", ""),
    "--wckey": (None, "value", ""),
}
SHORT = {short: long for long, (short, _, _) in UNSUPPORTED.items() if short}
# Supported flags whose Slurm value forms (``--exclusive=user``) mean something gpud does not do.
VALUE_REFUSED: dict[str, str] = {
    "--exclusive": "gpud's --exclusive keeps every other job off the job's nodes; give it without a value",
}


def lookup(name: str) -> str | None:
    """The long name of an unsupported option spelled ``name`` (long or short), or None."""
    if name in UNSUPPORTED:
        return name
    return SHORT.get(name)


def warning(long: str) -> str:
    hint = UNSUPPORTED[long][2]
    return f"{long} is not supported by gpud and was ignored" + (f" ({hint})" if hint else "")


def takes_value(long: str) -> str:
    return UNSUPPORTED[long][1]


def value_refused(long: str, value: str) -> str:
    return f"{long}={value} is not supported: {VALUE_REFUSED[long]}"


def split_command_line(args: Iterable[str], value_options: set[str],
                       long_option: Callable[[str], str] | None = None) -> tuple[list[str], list[str]]:
    """(arguments for click, warnings): unsupported options before the script path removed.

    ``value_options``: our own options that take a value, so a value is not taken for the
    script's path.  ``long_option``: the option a long name spells (``gpuctl.options.long_option``:
    aliases and abbreviations); long options are passed on under that name.
    """
    out: list[str] = []
    warnings: list[str] = []
    words = list(args)
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--" or not word.startswith("-") or word == "-":
            out += words[i:]
            break
        name, has_value = (word.split("=", 1)[0], True) if word.startswith("--") and "=" in word else (word, False)
        if long_option is not None and word.startswith("--"):
            word, name = _spelled_out(word, name, long_option)
        short_attached = not word.startswith("--") and len(word) > 2
        if short_attached:
            name = word[:2]
        if has_value and name in VALUE_REFUSED:
            # Under click, refuse it here with its own message; a parser without click (the
            # fast path) sees a flag with a value, which it leaves to click.
            click = sys.modules.get("click")
            ctx = click.get_current_context(silent=True) if click else None
            if ctx is not None:
                raise click.UsageError(value_refused(name, word.split("=", 1)[1]), ctx)
        long = lookup(name)
        if long is not None:
            warnings.append(warning(long))
            arity = takes_value(long)
            i += 2 if arity == "value" and not has_value and not short_attached else 1
            continue
        out.append(word)
        if name in value_options and not has_value and not short_attached:
            if i + 1 < len(words):
                out.append(words[i + 1])
            i += 2
            continue
        i += 1
    return out, warnings


def _spelled_out(word: str, name: str, long_option: Callable[[str], str]) -> tuple[str, str]:
    """``word`` with its long option's name in full (``--part=gpu``: ``--partition=gpu``), and that name.
    An ambiguous abbreviation is refused under click; a parser without click (the fast path)
    sees it unchanged, as an option it does not know, and leaves it to click."""
    try:
        full = long_option(name)
    except ValueError as e:   # ScriptError
        click = sys.modules.get("click")
        ctx = click.get_current_context(silent=True) if click else None
        if ctx is not None:
            raise click.UsageError(str(e), ctx) from None
        return word, name
    return full + word[len(name):], full
