"""A user's entity graph as a file people's tools open: node-link JSON, GraphML or GEXF.

The one place graph files are written: :meth:`hybridmem.Memory.export_graph` calls
:func:`graph_bytes` on what :meth:`hybridmem.Memory.graph` returns, and the CLI (``hybridmem
graph export``) and the REST service (``GET /v1/users/{user_id}/graph``) both call that, so a
file is the same whichever face wrote it. The formats and their media types are
:data:`hybridmem.models.GRAPH_FORMATS`.

Node-link JSON keeps the graph's values whole (sets as sorted lists, times as ISO 8601), and
``nx.node_link_graph(data, edges="edges")`` reads it back. GraphML and GEXF hold scalars only, so
there a time is ISO 8601 text and a set, list or mapping (aliases, memory ids, evidence) is JSON
text.
"""

from __future__ import annotations

import io
import json
from datetime import datetime

import networkx as nx

from hybridmem.errors import InvalidInputError
from hybridmem.models import GRAPH_FORMATS

__all__ = ["check_format", "graph_bytes"]


def _json_value(value: object) -> object:
    """``json.dumps``'s fallback for the graph's values: sets as sorted lists, times as ISO."""
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _scalar(value: object) -> str | int | float | bool:
    """A value GraphML and GEXF can hold: scalars as they are, a time as ISO 8601, anything
    else (aliases, memory ids, evidence) as JSON text."""
    if isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    return json.dumps(value, default=_json_value, sort_keys=True, ensure_ascii=False)


def _scalar_graph(graph: nx.DiGraph[str]) -> nx.DiGraph[str]:
    """The graph with every attribute made a scalar (see :func:`_scalar`)."""
    flat: nx.DiGraph[str] = nx.DiGraph()
    flat.graph.update({k: _scalar(v) for k, v in graph.graph.items()})
    flat.add_nodes_from((n, {k: _scalar(v) for k, v in a.items()})
                        for n, a in graph.nodes(data=True))
    flat.add_edges_from((u, v, {k: _scalar(x) for k, x in a.items()})
                        for u, v, a in graph.edges(data=True))
    return flat


def check_format(fmt: object) -> str:
    """``fmt`` if it names a format of :data:`~hybridmem.models.GRAPH_FORMATS`;
    :class:`InvalidInputError` naming them otherwise."""
    if not isinstance(fmt, str) or fmt not in GRAPH_FORMATS:
        raise InvalidInputError(f"graph format must be one of {', '.join(GRAPH_FORMATS)}, "
                                f"not {fmt!r}")
    return fmt


def graph_bytes(graph: nx.DiGraph[str], fmt: str = "node-link") -> bytes:
    """``graph`` (as :meth:`hybridmem.Memory.graph` returns it) in the format ``fmt``, UTF-8;
    :class:`InvalidInputError` naming the formats for any other ``fmt``."""
    check_format(fmt)
    if fmt == "node-link":
        data = nx.node_link_data(graph, edges="edges")
        text = json.dumps(data, default=_json_value, indent=2, ensure_ascii=False)
        return (text + "\n").encode("utf-8")
    buffer = io.BytesIO()
    if fmt == "graphml":
        nx.write_graphml(_scalar_graph(graph), buffer, encoding="utf-8")
    else:
        nx.write_gexf(_scalar_graph(graph), buffer, encoding="utf-8")
    return buffer.getvalue()
