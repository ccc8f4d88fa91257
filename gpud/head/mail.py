"""``--mail-type`` notices: which move calls for one, and running ``[head] mail_command``.

The recipients are user text, so the mail program is run the way Slurm runs its MailProg but
with every door closed: ``COMMAND -s SUBJECT -- RECIPIENT...`` (the ``--`` ends options, so an
address can never be read as one: GNU mailutils' ``--exec`` runs commands), no shell, a fixed
environment (no LD_PRELOAD, PATH or MAILRC from whoever started the head), a new session, and,
when the head runs as root, as the unprivileged ``gpud`` user (``nobody`` where there is none).
The addresses were checked at submit by ``syntax.parse_mail_users`` and are checked again here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd

from ..model import JobState
from ..syntax import SyntaxProblem, parse_mail_users

log = logging.getLogger("gpud.head")

MAIL_TIMEOUT = 30.0                 # s a mail command may take before it is killed
MAIL_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8", "HOME": "/"}
UNPRIVILEGED_USERS = ("gpud", "nobody")


def mail_event(old: JobState, new: JobState, mail_type: str, is_task: bool) -> str | None:
    """The notification a move calls for under ``--mail-type`` (None: none)."""
    kinds = set(mail_type.split(","))
    if "NONE" in kinds or (is_task and "ARRAY_TASKS" not in kinds and "ALL" not in kinds):
        return None
    every = "ALL" in kinds
    if new is JobState.RUNNING and old is JobState.PENDING and (every or "BEGIN" in kinds):
        return "Began"
    if new is JobState.PENDING and old.active and (every or "REQUEUE" in kinds):
        return "Requeued"
    if new.terminal:
        if new is JobState.TIMEOUT and (every or "TIME_LIMIT" in kinds):
            return "Reached time limit"
        if new is not JobState.COMPLETED and (every or "FAIL" in kinds):
            return "Failed"
        if every or "END" in kinds:
            return "Ended"
    return None


def mail_argv(command: str, subject: str, recipients: str) -> list[str]:
    """The argument list for one notice; SyntaxProblem if a recipient is not a plain address."""
    return [command, "-s", subject, "--", *parse_mail_users(recipients)]


def unprivileged_ids() -> tuple[int, int] | None:
    """(uid, gid) the mail program runs as when the head is root; None: as the head itself."""
    if os.geteuid() != 0:
        return None
    for name in UNPRIVILEGED_USERS:
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            continue
        return pw.pw_uid, pw.pw_gid
    return 65534, 65534


async def send(command: str, subject: str, recipients: str, job_id: str) -> None:
    """Run the mail program once; failures are logged, never raised."""
    try:
        argv = mail_argv(command, subject, recipients)
    except SyntaxProblem as e:
        log.warning("not mailing for job %s: %s", job_id, e)
        return
    ids = unprivileged_ids()
    extra = {} if ids is None else {"user": ids[0], "group": ids[1], "extra_groups": []}
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL, env=MAIL_ENV, cwd="/", start_new_session=True, **extra)
    except OSError as e:
        log.warning("could not send mail for job %s with %s: %s", job_id, command, e)
        return
    try:
        code = await asyncio.wait_for(proc.wait(), MAIL_TIMEOUT)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        log.warning("mail command %s took over %.0f s for job %s; killed", command, MAIL_TIMEOUT, job_id)
        return
    if code:
        log.warning("mail command %s exited %d for job %s", command, code, job_id)
