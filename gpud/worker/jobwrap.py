"""The job wrapper: the first process of every job, between the worker and the job's bash.

Theory of operation
-------------------
The executor starts ``python3 -I -S jobwrap.py <job dir>`` in a new session, so the wrapper
leads the job's session and process group: whatever the job starts stays in that group
(unless it makes a session of its own), and the worker stops a job by signalling the group.

The wrapper keeps the worker's privileges and runs with a clean environment.  The job's
environment never reaches a root process, where LD_PRELOAD and friends would load user code
as root.  It reads ``exec.json`` from the job directory and forks; the child becomes the job's
user (supplementary groups, gid, uid), changes to the working directory, opens the output
files (so the user's permission checks apply and the files belong to the user) and execs
``bash <script>`` with the job's environment.  A setup failure comes back as one line over a
close-on-exec pipe, which simply closes when the exec succeeds.

The wrapper outlives the worker: it waits for bash and writes the exact wait status to
``status`` (atomically), so a restarted worker learns how a job ended although it was not its
parent.  Then it SIGKILLs its own process group, which ends whatever the job left running in
the background, the wrapper itself included.

Signals sent to the group (cancel, time limit, ``scancel --signal``) reach the wrapper too.
It catches them with a handler that only notes them: unlike SIG_IGN, a handler is reset by
exec, so the job's processes keep the default dispositions.  A signal that came before the
child existed (a cancel right after the launch) is raised again in the child before it does
anything else; the caught signals stay blocked from that check until the child has reset its
handlers, so none is swallowed on the way.  Only SIGKILL ends the wrapper early, and then the
worker knows why.

The wrapper also enforces the worker's lease (gpud/worker/lease.py) on its own: when
``exec.json`` names a lease file it waits for bash in ``sigtimedwait`` until just before the
lease's end, reads the file again, and SIGKILLs the job at the end if no renewal came
(status ``lease_expired``).  So a worker daemon that is stopped, hung or cut off cannot leave
a job running past its lease, which is what lets the head start the job elsewhere.

Started as ``jobwrap.py --serve`` (what the executor does), it is a fork server instead:
a small process, in a session of its own, that reads job directories from a Unix socket on
its stdin and forks one wrapper per directory.  Each child starts its own session, points
stdin and stdout at /dev/null and stderr at ``wrapper.log``, and runs exactly as above.  The
server answers with the child's pid and a pidfd for it (SCM_RIGHTS), taken before the child
can be reaped, so the worker watches that very process without a pid-reuse race.  Forking
this small, already started interpreter costs a millisecond where starting Python costs
tens, and the children share nothing with the worker.  The server reaps its children and
exits when the worker closes the socket; the wrappers live on, as they always did.

Stdlib only and no gpud imports: it runs with ``-S``, whatever the worker's environment.
"""

import json
import os
import signal
import socket
import sys
import time

# Signals whose default action would end the wrapper before it can record the job's status.
CAUGHT = tuple(
    getattr(signal, name) for name in (
        "SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGPIPE",
        "SIGXCPU", "SIGXFSZ", "SIGVTALRM", "SIGPROF", "SIGTSTP", "SIGTTIN", "SIGTTOU",
    ) if hasattr(signal, name)
)
MAX_ERROR = 2000
LEASE_REREAD = 0.2        # s before the lease's end that the wrapper reads its file again
LEASE_UNKNOWN_POLL = 5.0  # s between reads while the file is missing or unreadable


class SetupError(Exception):
    """The job could not be started; the message is shown to the user as is."""


RECEIVED = []  # signals that reached the wrapper, in order


def _note(signum, frame):
    RECEIVED.append(signum)


def write_atomic(path, text):
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.rename(tmp, path)


def write_pid(path):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)


def open_output(path, append=False):
    # --open-mode=append keeps what earlier runs (a requeue, a previous array task) wrote
    mode = os.O_APPEND if append else os.O_TRUNC
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | mode, 0o666)
    except OSError as e:
        raise SetupError(f"cannot open output file {path}: {e.strerror}") from None


def _load_rlimits():
    # -I keeps this file's directory off sys.path: load the shared module by its path
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rlimits.py")
    spec = importlib.util.spec_from_file_location("gpud_worker_rlimits", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rlimits = _load_rlimits()   # once, so the fork server's children have it already


def set_limits(limits):
    """The submitter's resource limits ({"NOFILE": [soft, hard]}, -1: unlimited), each
    clamped to the wrapper's own hard limit: user data can lower a limit, never raise one."""
    todo, unknown = rlimits.plan(limits)
    for name in unknown:
        sys.stderr.write(f"job wrapper: no {name} limit here; ignored\n")
    rlimits.apply(todo, lambda line: sys.stderr.write(f"job wrapper: {line}\n"))


def become_job(spec):
    """In the child: turn into the job's bash.  Returns only by raising SetupError."""
    for path in spec.get("cgroup_procs") or ():   # first: nothing of the job runs outside
        try:
            write_pid(path)
        except OSError as e:
            raise SetupError(f"cannot join the job's cgroup {os.path.dirname(path)}: {e.strerror}") from None
    cpus = spec.get("cpus")
    if cpus:  # bound here, in the child, so the wrapper and the worker keep every CPU
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as e:  # a CPU gone offline or outside our cpuset: run unbound
            sys.stderr.write(f"job wrapper: cannot bind to CPUs {cpus}: {e.strerror}; running unbound\n")
    set_limits(spec.get("rlimits") or {})   # as root: a job's limits are its submitter's
    if spec["switch_user"]:
        try:
            os.setgroups(spec["groups"])
            os.setgid(spec["gid"])
            os.setuid(spec["uid"])
        except OSError as e:
            raise SetupError(f"cannot become user {spec['user']}: {e.strerror}") from None
    work_dir = spec["work_dir"]
    try:
        os.chdir(work_dir)
    except OSError as e:
        raise SetupError(f"cannot change to working directory {work_dir}: {e.strerror}") from None
    append = spec.get("open_mode") == "append"
    out = open_output(spec["stdout"], append)
    err = out if spec["stderr"] == spec["stdout"] else open_output(spec["stderr"], append)
    script = spec["script"]
    try:
        os.close(os.open(script, os.O_RDONLY))
    except OSError as e:
        raise SetupError(f"cannot read the job script {script}: {e.strerror}") from None
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in {null, out, err} - {0, 1, 2}:
        os.close(fd)
    shell = spec["shell"]
    try:
        os.execve(shell, [shell, script], spec["env"])
    except OSError as e:
        raise SetupError(f"cannot run {shell}: {e.strerror}") from None


def run(spec):
    """Start the job, wait for it, and return what ``status`` should say."""
    r, w = os.pipe()  # both ends close-on-exec
    go_r, go_w = os.pipe()
    signal.pthread_sigmask(signal.SIG_BLOCK, CAUGHT)
    early = list(RECEIVED)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.close(go_w)
            for sig in CAUGHT:
                signal.signal(sig, signal.SIG_DFL)
            for sig in early:  # pending until the unblock, then acted on by the default action
                os.kill(os.getpid(), sig)
            os.read(go_r, 1)   # the parent has passed on what came between the block and the fork
            os.close(go_r)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, CAUGHT)
            become_job(spec)
            message = "the job's shell returned without running"
        except SetupError as e:
            message = str(e)
        except BaseException as e:  # noqa: BLE001 - the parent must hear about anything
            message = f"job setup failed: {type(e).__name__}: {e}"
        os.write(w, message.encode(errors="replace")[:MAX_ERROR])
        os._exit(127)
    # A signal that came after the block but before the fork is pending here only (a child
    # does not inherit pending signals): pass it on while the child still blocks, so that one
    # it also got directly merges with it instead of arriving twice.
    os.close(go_r)
    for sig in sorted(signal.sigpending() & set(CAUGHT)):
        os.kill(pid, sig)
    try:
        os.write(go_w, b".")
    except BrokenPipeError:   # the child was SIGKILLed already; waitpid says so below
        pass
    os.close(go_w)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, CAUGHT)
    os.close(w)
    chunks = []
    while True:
        chunk = os.read(r, MAX_ERROR)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    status, lapsed = _wait(pid, spec.get("lease_file"))
    if lapsed:
        return {"exit_code": 0, "signal": signal.SIGKILL, "core": False, "lease_expired": True}
    if chunks:
        return {"error": b"".join(chunks).decode(errors="replace").strip()}
    if os.WIFSIGNALED(status):
        return {"exit_code": 0, "signal": os.WTERMSIG(status), "core": os.WCOREDUMP(status)}
    return {"exit_code": os.waitstatus_to_exitcode(status), "signal": None, "core": False}


def _lease_end(path):
    """The monotonic time the worker's lease ends (gpud/worker/lease.py); None: unknown."""
    try:
        with open(path, encoding="ascii") as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return None


def _wait(pid, lease_file):
    """Wait for the job's shell: (its wait status, whether the lease lapsed first).

    With a lease file the wrapper enforces the lease itself, so a job never outlives it even
    when the worker daemon is stopped or hung: it sleeps in sigtimedwait on SIGCHLD until
    shortly before the lease's end, reads the file again (a renewal moves the end), and
    SIGKILLs the job at the end if none came.  SIGCHLD is blocked only here, after the fork,
    so the job's own signal mask is untouched."""
    if not lease_file:
        return os.waitpid(pid, 0)[1], False
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
    try:
        end = None
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status, False
            now = time.monotonic()
            if end is None or end - now <= LEASE_REREAD:
                end = _lease_end(lease_file)
                if end is not None and now >= end:
                    try:   # the shell first; main() then SIGKILLs the rest of the group
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    return os.waitpid(pid, 0)[1], True
            if end is None:
                timeout = LEASE_UNKNOWN_POLL
            else:
                left = end - now
                timeout = left - LEASE_REREAD if left > 2 * LEASE_REREAD else left
            signal.sigtimedwait([signal.SIGCHLD], min(60.0, max(0.001, timeout)))
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])


def main(argv):
    for sig in CAUGHT:
        signal.signal(sig, _note)
    job_dir = argv[1]
    write_atomic(os.path.join(job_dir, "wrapper.pid"), f"{os.getpid()}\n")
    try:
        with open(os.path.join(job_dir, "exec.json"), encoding="utf-8") as f:
            result = run(json.load(f))
    except Exception as e:  # noqa: BLE001 - recorded for the worker, never lost silently
        result = {"error": f"job wrapper failed: {type(e).__name__}: {e}"}
    write_atomic(os.path.join(job_dir, "status"), json.dumps(result) + "\n")
    if os.getpgrp() == os.getpid():  # only ever kill a group this wrapper leads
        os.killpg(0, signal.SIGKILL)
    return 0


def _reap(signum, frame):
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _forked(job_dir, ready):
    """In a child of the server: become a wrapper started on ``job_dir``; never returns.
    Closing ``ready`` tells the server that the session exists and signals are noted (a
    stop sent to the group as soon as the worker has the pid is kept, never lost)."""
    code = 1
    try:
        for sig in CAUGHT:
            signal.signal(sig, _note)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the wrapper waits for its own child
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
        os.setsid()
        os.close(ready)
        null = os.open(os.devnull, os.O_RDWR)
        log = os.open(os.path.join(job_dir, "wrapper.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(null, 0)   # also closes the server's socket in this process
        os.dup2(null, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        code = main([sys.argv[0], job_dir])
    except BaseException:  # noqa: BLE001 - never back into the server's loop
        try:
            import traceback
            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)


def serve(fd=0):
    """The fork server's loop on the SOCK_SEQPACKET socket ``fd``: one job directory in, one
    answer out: the pid with its pidfd, or a line saying why there is none."""
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGCHLD, _reap)
    while True:
        data = sock.recv(4096)
        if not data:
            return 0   # the worker went away
        job_dir = os.fsdecode(data)
        # No reaping between the fork and the pidfd: the pid is this child's until then.
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
        try:
            r, w = os.pipe()
            try:
                pid = os.fork()
                if pid == 0:
                    os.close(r)
                    _forked(job_dir, w)
                os.close(w)
                w = None
                os.read(r, 1)  # end of file: the child leads its session (or is gone)
                try:
                    pidfd = os.pidfd_open(pid)
                except OSError:  # unwatchable: it must not run (the worker starts it again)
                    os.killpg(pid, signal.SIGKILL)
                    raise
            finally:
                os.close(r)
                if w is not None:
                    os.close(w)
        except OSError as e:
            sock.send(f"error: {e.strerror or e}".encode(errors="replace")[:MAX_ERROR])
            continue
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
        try:
            socket.send_fds(sock, [str(pid).encode()], [pidfd])
        finally:
            os.close(pidfd)


if __name__ == "__main__":
    sys.exit(serve() if sys.argv[1:] == ["--serve"] else main(sys.argv))
