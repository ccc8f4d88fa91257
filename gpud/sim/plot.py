"""``gpud simulate --plot FILE.png``: utilization, queue length and per-account share over
time, one column per policy.

Columns share their axes (the same days, the same queue scale), so policies compare at a
glance; each account's band of the share panel has its configured share (the report's
``series.targets``, among the accounts that submitted) as a dashed line at the band's top;
one legend for the figure sits below the panels, off the data.

matplotlib is an optional extra (``pip install 'gpud[plot]'``): it is imported only here,
only when a plot is asked for, and its absence is a one-line error before anything runs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PlotError", "check_available", "figure", "plot"]

MAX_ACCOUNTS = 8     # more accounts are drawn as one "others" band


class PlotError(RuntimeError):
    """A plot that cannot be drawn; the message is one line."""


def check_available() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotError("--plot needs matplotlib: pip install 'gpud[plot]' "
                        "(or pip install matplotlib)") from None


def plot(reports: dict[str, dict[str, Any]], path: str) -> None:
    """Draw each report's ``series`` (a column per policy) into ``path``."""
    fig = figure(reports)
    import matplotlib.pyplot as plt

    try:
        fig.savefig(path, dpi=100)
    except OSError as e:
        raise PlotError(f"{path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)


def figure(reports: dict[str, dict[str, Any]]) -> Any:
    """The matplotlib figure ``plot`` saves (the caller closes it)."""
    check_available()
    import matplotlib

    matplotlib.use("Agg")      # files only: no display needed, none opened
    import matplotlib.pyplot as plt

    names = list(reports)
    fig, axes = plt.subplots(3, len(names), figsize=(5 * len(names), 9.6), squeeze=False,
                             sharex=True, sharey="row")
    colours: dict[str, Any] = {}
    handles: dict[str, Any] = {}
    for c, name in enumerate(names):
        r = reports[name]
        s = r.get("series") or {}
        days = [t / 86400 for t in s.get("t", [])]
        gpus = r["cluster"]["gpus"]
        util = [a / gpus * 100 for a in s.get("allocated", [])]
        top, mid, low = axes[0][c], axes[1][c], axes[2][c]
        top.plot(days, util, lw=0.8)
        top.set_ylim(0, 105)
        top.set_title(name)
        top.set_ylabel("GPUs allocated (%)")
        mid.plot(days, s.get("pending", []), lw=0.8, color="tab:red")
        mid.set_ylabel("jobs waiting")
        accounts = s.get("accounts", {})
        order = sorted(accounts, key=lambda a: -sum(accounts[a]))
        bands = [(a, accounts[a]) for a in order[:MAX_ACCOUNTS]]
        rest = order[MAX_ACCOUNTS:]
        if rest:
            bands.append(("others", [sum(v) for v in zip(*(accounts[a] for a in rest))]))
        if bands and days:
            totals = [sum(v) or 1.0 for v in zip(*(b for _, b in bands))]
            cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
            for a, _ in bands:
                colours.setdefault(a, cycle[len(colours) % len(cycle)])
            polys = low.stackplot(days, *[[x / t * 100 for x, t in zip(b, totals)] for _, b in bands],
                                  colors=[colours[a] for a, _ in bands])
            handles.update((a, p) for (a, _), p in zip(bands, polys))
            targets = s.get("targets") or {}
            level = 0.0
            for a, _ in bands:       # each band's configured share, stacked as the bands are
                share = (targets.get(a, 0.0) if a != "others"
                         else sum(targets.get(x, 0.0) for x in rest)) * 100
                if share > 0:
                    level += share
                    low.axhline(level, color=colours[a], ls="--", lw=1.2)
        low.set_ylim(0, 100)
        low.set_ylabel("share of GPUs in use (%)")
        low.set_xlabel("days")
    if handles:
        from matplotlib.lines import Line2D

        labels = list(handles) + ["configured share"]
        lines = list(handles.values()) + [Line2D([], [], color="grey", ls="--")]
        fig.legend(lines, labels, loc="lower center", ncol=min(len(labels), 6), fontsize="small",
                   frameon=False)
        fig.tight_layout(rect=(0, 0.06, 1, 1))    # room for the legend below the panels
    else:
        fig.tight_layout()
    return fig
