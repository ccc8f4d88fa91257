"""`gpud standalone`: head, one worker and an embedded MQTT broker in one process.

For a single GPU box and for a first try: no Mosquitto, no key distribution.  The key and
the socket live in the state directory; the printed ``GPUD_SOCKET=…`` line points gpuctl
at this cluster.

The head and its own worker speak in the process (``gpud.bus.split``): their messages
never leave it, so they are not sealed.  The embedded broker serves everyone else
(relays, other workers pointed at it), sealed and opened as always.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from dataclasses import replace
from typing import Any, Callable

from .config import Config
from .keys import generate_key

log = logging.getLogger("gpud.standalone")


async def run_standalone(cfg: Config, *, port: int = 0, loader: Callable[[], Config] | None = None) -> int:
    profile = os.environ.get("GPUD_PROFILE")
    if not profile:
        return await _run(cfg, port=port, loader=loader)
    # For benchmarks: cProfile of the event loop's thread, written when the box stops.
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
    try:
        return await _run(cfg, port=port, loader=loader)
    finally:
        prof.disable()
        prof.dump_stats(profile)


async def _run(cfg: Config, *, port: int, loader: Callable[[], Config] | None) -> int:
    from .bus.broker import EmbeddedBroker  # amqtt is only needed here
    from .head.daemon import Head
    from .head.service import run_head
    from .keys import KeyFileError, load_keys
    from .worker.daemon import Worker, run_worker

    os.makedirs(cfg.state_dir, mode=0o755, exist_ok=True)
    if not os.path.exists(cfg.key_file):
        generate_key(cfg.key_file)
    try:
        key = load_keys(cfg.key_file)
    except KeyFileError as e:
        print(f"gpud standalone: error: {e}", file=sys.stderr)
        return 1
    heads: list[Head] = []
    workers: list[Worker] = []
    async with EmbeddedBroker(port=port) as broker:
        cfg = replace(cfg, broker=replace(cfg.broker, url=broker.url))
        head_bus, worker_bus = local_buses(cfg, key)
        stopping = asyncio.Event()

        def stop() -> None:
            if stopping.is_set():
                log.warning("stopping again: exiting now")
                raise SystemExit(1)
            stopping.set()
            for w in workers:
                w.stop()
            for h in heads:
                h.stop()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop)
        url = broker.url

        def reload_config() -> Config:  # the embedded broker's url is not in the file
            new = loader() if loader is not None else cfg
            return replace(new, broker=replace(new.broker, url=url))

        loop.add_signal_handler(signal.SIGHUP, lambda: [_reload(h) for h in heads])
        head_task = asyncio.create_task(run_head(cfg, install_signals=False, on_head=heads.append, loader=reload_config, bus=head_bus), name="head")
        while not heads and not head_task.done():
            await asyncio.sleep(0.01)
        if head_task.done():
            return head_task.result()
        ready = asyncio.create_task(heads[0].ready.wait())
        await asyncio.wait({head_task, ready}, return_when=asyncio.FIRST_COMPLETED)
        if head_task.done():
            return head_task.result()
        print(f"GPUD_SOCKET={cfg.head.socket}", flush=True)
        print(f"gpud standalone: cluster {cfg.cluster!r} ready; export GPUD_SOCKET={cfg.head.socket}",
              file=sys.stderr, flush=True)
        worker_task = asyncio.create_task(
            run_worker(cfg, install_signals=False, on_worker=workers.append, bus=worker_bus), name="worker")
        done, _ = await asyncio.wait({head_task, worker_task}, return_when=asyncio.FIRST_COMPLETED)
        # Either one ending ends the box: stop the other one too.
        if not stopping.is_set():
            stopping.set()
            for w in workers:
                w.stop()
            for h in heads:
                h.stop()
        codes = await asyncio.gather(head_task, worker_task)
    return max(codes)


def local_buses(cfg: Config, key: bytes) -> tuple[Any, Any]:
    """The head's bus (its worker in the process, everyone else over the broker at
    ``cfg.broker.url``) and its worker's (in the process only)."""
    from .bus.base import HEAD_EVENTS, node_cmd, topic_prefix
    from .bus.inbox import Inbox
    from .bus.memory import MemoryBroker, MemoryBus
    from .bus.mqtt import MAX_INBOX
    from .bus.split import SplitBus
    from .head.daemon import HEAD_SENDER
    from .head.service import make_bus
    from .worker.daemon import worker_sender, worker_subscriptions, worker_will

    name = cfg.worker_name()
    inbox = Inbox(key, topic_prefix(cfg.cluster), max_skew=120.0, limit=MAX_INBOX)
    remote = make_bus(cfg, key, inbox=inbox)     # `gpud head`'s, into the shared inbox
    hub = MemoryBroker(record=False, signed=False)   # only this process reaches it
    local = MemoryBus(hub, cfg.cluster, HEAD_SENDER, key, subscriptions=[HEAD_EVENTS, "node/+/status"],
                      inbox=inbox)
    worker = MemoryBus(hub, cfg.cluster, worker_sender(name), key, subscriptions=worker_subscriptions(name),
                       will=worker_will(name))
    return SplitBus(local, remote, inbox, local_topics=[node_cmd(name)]), worker


def _reload(head) -> None:
    try:
        head.reload("SIGHUP")
    except ValueError:
        pass  # ConfigError: Head.reload logged every problem and kept the running config
