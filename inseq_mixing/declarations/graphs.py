"""Contribution graphs beside any method's result: while :func:`collecting_graphs` is active, every
:meth:`~.base.Declaration.run` also builds the route (:mod:`inseq_mixing.methods.graph`) of each prediction its
request explains, from the request's one traced forward pass. Front ends turn this on for ``model.attribute(...,
contribution_graphs=True)`` and put the graphs, as plain data, in the output's ``info["contribution_graphs"]`` (one
list per sequence, one graph per explained position, in order). Not a method: no declaration here.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

#: The keyword of ``attribute`` that asks for the graphs: ``True``, or ``{"threshold": τ, "heads": bool}``.
GRAPH_KEYWORD = "contribution_graphs"

#: What an output's ``info`` says where a request's graphs cannot be drawn (a pooled read-out).
POOLED_NOTE = (
    "no contribution graphs: the model's read-out pools several positions (a mean over patches or frames), and a "
    "route starts at one position's last state"
)


@dataclass
class GraphCollector:
    """The graphs found so far (one list per batch row, in the order the requests came), and the settings."""

    threshold: float
    heads: bool
    graphs: list[list[dict]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, request: Any, positions: Any = None) -> None:
        """The graphs of every explained position (``positions``, default the request's) of every row of
        ``request``."""
        from ..methods.graph import contribution_graph, graph_edges

        head = request.spec.head
        positions = (request.positions if positions is None else positions).cpu()
        rows = positions.shape[0]
        if head is not None and "mean" in head.pooling:
            self.graphs += [[] for _ in range(rows)]
            self.notes.append(POOLED_NOTE)
            return
        trace = request.trace
        edges = graph_edges(trace).cpu()  # one host copy for all the routes of the batch
        masks = {"decoder": trace.decoder.mask}
        if trace.encoder is not None:
            masks["encoder"] = trace.encoder.mask
        for row in range(rows):
            explained = positions[row].nonzero().flatten().tolist()
            self.graphs.append([
                contribution_graph(edges, masks, row, position, self.threshold, self.heads).to_dict()
                for position in explained
            ])  # fmt: skip


_ACTIVE: contextvars.ContextVar[GraphCollector | None] = contextvars.ContextVar("contribution_graphs", default=None)


def graph_settings(value: Any) -> dict | None:
    """The settings the ``contribution_graphs`` keyword gives (None: no graphs), checked.

    Raises:
        ValueError: Anything but a boolean or a dictionary of ``threshold`` and ``heads``.
    """
    from ..methods.graph import DEFAULT_THRESHOLD

    if value is None or value is False:
        return None
    settings = {"threshold": DEFAULT_THRESHOLD, "heads": True}
    if value is True:
        return settings
    if not isinstance(value, dict) or set(value) - set(settings):
        raise ValueError(
            f"{GRAPH_KEYWORD}={value!r}: give True, or a dictionary with 'threshold' (an importance in "
            "[0, 1), default 0.04) and 'heads' (one edge per head: True, default; per token: False)."
        )
    settings.update(value)
    if not 0 <= float(settings["threshold"]) < 1:
        raise ValueError(f"{GRAPH_KEYWORD}: threshold={settings['threshold']} must be in [0, 1).")
    return settings


@contextlib.contextmanager
def collecting_graphs(value: Any) -> Iterator[GraphCollector | None]:
    """Collect the graphs of every request run inside, as the ``contribution_graphs`` keyword's ``value`` asks
    (checked by :func:`graph_settings` before anything runs; no-op for None or False)."""
    settings = graph_settings(value)
    if settings is None:
        yield None
        return
    collector = GraphCollector(threshold=float(settings["threshold"]), heads=bool(settings["heads"]))
    token = _ACTIVE.set(collector)
    try:
        yield collector
    finally:
        _ACTIVE.reset(token)


def graphs_collected() -> bool:
    """Whether a graph collection is active (a trace taken now must keep what ALTI reads)."""
    return _ACTIVE.get() is not None


def record_graphs(request: Any, positions: Any = None) -> None:
    """Called by :meth:`~.base.Declaration.run`: add the request's graphs where a collection is active."""
    collector = _ACTIVE.get()
    if collector is not None:
        collector.add(request, positions)


def store_graphs(info: dict, collector: GraphCollector | None) -> None:
    """Put the collected graphs (and any note) in an output's ``info``."""
    if collector is None:
        return
    info[GRAPH_KEYWORD] = collector.graphs
    if collector.notes:
        info[f"{GRAPH_KEYWORD}_note"] = collector.notes[0]
