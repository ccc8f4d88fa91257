"""Socket operations on the head's configuration: reconfigure (admins only) and show_config.

``reconfigure`` re-reads the config file, as SIGHUP does (``Head.reload``): a valid file is
applied without touching running jobs and the answer lists the changes that need a restart;
an invalid one is refused with its first ``FILE:LINE: message`` and the running config kept.
``show_config`` returns the running config as gpud.toml would spell it, password hidden.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import config as config_mod
from ..config import ConfigError
from ..ctlsocket import Caller, RequestError
from .ops_jobs import is_admin

if TYPE_CHECKING:
    from .daemon import Head


async def op_reconfigure(head: "Head", caller: Caller, args: dict) -> dict:
    if not is_admin(head, caller):
        raise RequestError("Access/permission denied: only root and the users in [head] admins "
                           "may reconfigure")
    try:
        notes = head.reload(f"{caller.user} (uid {caller.uid})")
    except ConfigError as e:
        more = len(e.lines) - 1
        tail = f" (and {more} more: run gpud check-config)" if more else ""
        raise RequestError(f"reconfigure refused, running configuration kept: {e.lines[0]}{tail}") from None
    return {"path": head.cfg.path, "restart_needed": notes}


async def op_show_config(head: "Head", caller: Caller, args: dict) -> dict:
    shown = config_mod.to_dict(head.cfg, redact=True)
    shown["head"]["database"] = head.cfg.database   # the effective path, default or not
    return {"path": head.cfg.path, "config": shown}


OPS = {"reconfigure": op_reconfigure, "show_config": op_show_config}
