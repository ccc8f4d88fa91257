"""Broker accounts: who each daemon logs in as, and the files a locked-down Mosquitto reads.

One broker user per connection, because the shipped broker (etc/mosquitto/gpud.conf) sets
``use_username_as_clientid``: the user name *is* the session, so nobody can take over
another daemon's session without its password, and two connections with one user name
would keep kicking each other off.

=====================  ====================================================================
user                   may
=====================  ====================================================================
``head``               read and write every topic of the cluster
``node-NAME``          read ``node/NAME/cmd`` and ``head/status``; write ``head/events``
                       and ``node/NAME/status``
``node-NAME-relay``    the worker's ``relay_socket``: write ``head/requests``, read
                       ``relay/NAME/replies`` and ``head/status``
``relay-NAME``         ``gpud relay --name NAME``: the same, for its own replies
=====================  ====================================================================

A daemon finds its login in ``[broker]``: ``username`` with ``password`` or
``password_file``, or else ``credentials_dir``, where ``gpud broker-credentials`` left one
file per user holding that user's password; the daemon picks its own by the table above.

``write_broker_files`` makes Mosquitto's password file (PBKDF2-SHA512, the ``$7$`` format
of ``mosquitto_passwd``) and ACL file, and the per-user password files; an existing
user's password is kept, so adding a node changes nobody else's.
"""

from __future__ import annotations

import base64
import grp
import hashlib
import os
import secrets
from dataclasses import dataclass
from typing import Any, Iterable

from ..keys import read_secret, write_private
from .base import HEAD_EVENTS, HEAD_REQUESTS, HEAD_STATUS, node_cmd, node_status, relay_replies, topic_prefix

HEAD_USER = "head"
_PBKDF2_ITERATIONS = 101      # mosquitto_passwd's own; the passwords are 192 random bits anyway


def node_user(name: str) -> str:
    return f"node-{name}"


def node_relay_user(name: str) -> str:
    return f"node-{name}-relay"


def relay_user(name: str) -> str:
    return f"relay-{name}"


def login(broker: Any, role_user: str, *, suffix: str = "") -> tuple[str | None, str | None]:
    """(username, password) for a daemon whose own broker user is ``role_user``.

    ``suffix``: this daemon's second connection (a worker's relay) when ``username`` is set
    explicitly.  (None, None): log in anonymously.  KeyFileError: an unsafe or missing file.
    """
    if broker.username is not None:
        password = broker.password
        if password is None and broker.password_file is not None:
            password = read_secret(broker.password_file, "broker password file")
        return broker.username + suffix, password
    if broker.credentials_dir is not None:
        path = os.path.join(broker.credentials_dir, role_user)
        return role_user, read_secret(path, f"broker password file for user {role_user}")
    return None, None


# -- the broker's files --------------------------------------------------------------------------

@dataclass(frozen=True)
class Account:
    user: str
    read: tuple[str, ...]
    write: tuple[str, ...]


def accounts(cluster: str, nodes: Iterable[str] = (), relays: Iterable[str] = ()) -> list[Account]:
    """The broker users of a cluster and the topics (full names) each may read and write."""
    p = topic_prefix(cluster)
    nodes, relays = sorted(set(nodes)), sorted(set(relays))
    clash = set(nodes) & set(relays)
    if clash:
        raise ValueError(f"relay name {sorted(clash)[0]!r} is also a node's: their replies would share "
                         "a topic; give the relay another --name")
    out = [Account(HEAD_USER, read=(p + "#",), write=(p + "#",))]
    for n in nodes:
        out.append(Account(node_user(n), read=(p + node_cmd(n), p + HEAD_STATUS),
                           write=(p + HEAD_EVENTS, p + node_status(n))))
        out.append(Account(node_relay_user(n), read=(p + relay_replies(n), p + HEAD_STATUS),
                           write=(p + HEAD_REQUESTS,)))
    for r in relays:
        out.append(Account(relay_user(r), read=(p + relay_replies(r), p + HEAD_STATUS),
                           write=(p + HEAD_REQUESTS,)))
    return out


def acl_text(accts: Iterable[Account]) -> str:
    lines = ["# Written by gpud broker-credentials: one user per daemon connection.",
             "# A user not listed here may do nothing; anonymous clients are refused (gpud.conf).", ""]
    for a in accts:
        lines.append(f"user {a.user}")
        for t in a.read:
            lines.append(f"topic {'readwrite' if t in a.write else 'read'} {t}")
        for t in a.write:
            if t not in a.read:
                lines.append(f"topic write {t}")
        lines.append("")
    return "\n".join(lines)


def password_hash(password: str, *, salt: bytes | None = None) -> str:
    """Mosquitto's ``$7$`` password hash (PBKDF2-HMAC-SHA512), as mosquitto_passwd writes it."""
    salt = salt if salt is not None else secrets.token_bytes(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, _PBKDF2_ITERATIONS)
    return f"$7${_PBKDF2_ITERATIONS}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def write_broker_files(accts: list[Account], *, directory: str, passwd_file: str, acl_file: str) -> list[str]:
    """Write every user's password file into ``directory`` (kept if present), then the
    broker's password and ACL files.  Returns the users created now."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    created, passwords = [], {}
    for a in accts:
        path = os.path.join(directory, a.user)
        if os.path.lexists(path):
            passwords[a.user] = read_secret(path, f"broker password file for user {a.user}")
            continue
        passwords[a.user] = secrets.token_urlsafe(24)
        write_private(path, passwords[a.user] + "\n", 0o600)
        created.append(a.user)
    # Mosquitto reads both after dropping to its own user: group mosquitto, when there is one.
    gid = _group("mosquitto")
    mode = 0o640 if gid is not None else 0o600
    write_private(passwd_file, "".join(f"{u}:{password_hash(pw)}\n" for u, pw in passwords.items()), mode, gid=gid)
    write_private(acl_file, acl_text(accts), mode, gid=gid)
    return created


def _group(name: str) -> int | None:
    if os.geteuid() != 0:
        return None
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


