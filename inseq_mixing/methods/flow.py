r"""Attention flow (Abnar & Zuidema, ACL 2020), exact, on a recorded forward pass.

Paper: Samira Abnar, Willem Zuidema. "Quantifying Attention Flow in Transformers". ACL 2020.
https://aclanthology.org/2020.acl-main.385/

The model is a layered graph: node :math:`(\ell, i)` is position :math:`i` after layer :math:`\ell` (:math:`\ell = 0`:
the input tokens), with an edge down to :math:`(\ell - 1, j)` of capacity :math:`\hat A^\ell_{ij}`, the rollout's
layer map :math:`\hat A^\ell = \mathrm{rownorm}(0.5 \cdot \mathrm{mean}_h A^\ell + 0.5 \cdot I)`
(:func:`.norm_based.rollout_layer_maps`). The flow of input token :math:`j` into position :math:`i` of layer
:math:`\ell` is the maximum flow from :math:`(\ell, i)` to :math:`(0, j)`; the paper's maps divide each node's flows
by their sum, so a row sums to 1 (as the authors' code does).

**Solver.** One maximum flow per (node, input token) pair, as the definition asks, solved by SciPy's
``scipy.sparse.csgraph.maximum_flow`` (Dinic's algorithm, compiled) on the sub-graph of the layers at and below the
node's, instead of the authors' one ``networkx`` Edmonds–Karp call per pair on the whole graph. SciPy takes integer
capacities: each is scaled by :math:`2^{29}` and rounded, so every rounded cut is within :math:`E/2^{30}` of the true
one (:math:`E` its number of edges), and so is each maximum flow (min-cut theorem on both graphs); the flows are
returned divided back. Causal models skip the pairs :math:`j > i` (no path: the flow is 0).

Learned attention sinks (GPT-OSS; our extension, as for the rollout): a row's attention over the tokens sums to less
than 1, the rest going to a sink that passes nothing on, so the capacities are not renormalised. One more maximum
flow per node, to all input tokens at once (a super-sink behind them), is the share of the node that reaches the
tokens; its flows are normalised to that share instead of 1, and the rest is the sink's,
``positions["sink_share"]`` (rows plus share sum to 1).

Our extension (the paper treats encoders): encoder–decoders use the graph the joint rollout multiplies through
(:mod:`.rollout`): decoder node :math:`(\ell, t)` has edges to the decoder's :math:`(\ell - 1, t')` with capacity
:math:`C^\ell_y` and to the encoder's last layer :math:`(L_{enc}, s)` with capacity :math:`C^\ell_x` (the
cross-attention's share, its residual column scaling the self-attention); a decoder node's flows go to the source
tokens (encoder layer 0) and the target tokens (decoder layer 0) and are normalised together.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..trace import ModelTrace
from .alti import joint_layer_blocks
from .results import LayerMaps

#: Capacities are scaled by this before rounding to the integers SciPy's solver takes (residual capacities stay below
#: 2^31: an edge's capacity plus its flow is at most 2 · 2^29 = 2^30).
CAPACITY_SCALE = 2**29


@dataclass
class FlowGraph:
    """One batch row's layered graph, capacities dense per layer (what the solver and a reference read).

    Attributes:
        layers: ``[L](T, K)`` capacities (NumPy arrays, on the host) from the states after layer ``l`` (rows) to those
            below (columns): the positions of the layer below, then (encoder–decoders' decoders) the encoder's last
            states.
        encoder: The encoder's graph (encoder–decoders), whose last layer's states the decoder's edges reach.
    """

    layers: list[np.ndarray]
    encoder: FlowGraph | None = None

    @property
    def width(self) -> int:
        return self.layers[0].shape[0]


def solve_flows(graph: FlowGraph, causal: bool, last_only: bool = False, reach: bool = False):
    """Raw maximum flows ``(L, T, T[+S])``: from each position after each layer to each input token (the decoder's
    tokens, then the source's for encoder–decoders), float64, on the host; with ``last_only``, from the positions
    after the last layer alone, ``(1, T, T[+S])`` (the lower layers' flows are not solved). With ``reach``, also each
    node's maximum flow to all the input tokens at once ``(L, T)`` (a super-sink behind them): ``(flows, reached)``."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import maximum_flow

    width, encoder = graph.width, graph.encoder
    enc_width = 0 if encoder is None else encoder.width
    enc_nodes = 0 if encoder is None else (len(encoder.layers) + 1) * enc_width  # numbered first, layer-major
    top_encoder = enc_nodes - enc_width  # the encoder's last states
    pieces = []
    if encoder is not None:
        for layer, capacity in enumerate(encoder.layers, start=1):
            pieces.append(_edges(capacity, layer * enc_width, (layer - 1) * enc_width, enc_width, top_encoder))
    solved = [len(graph.layers)] if last_only else range(1, len(graph.layers) + 1)
    flows = np.zeros((len(solved), width, width + enc_width))
    reached = np.zeros((len(solved), width))
    sinks = [enc_nodes + j for j in range(width)] + list(range(enc_width))  # the input tokens: decoder's, source's
    everything = enc_nodes + (len(graph.layers) + 1) * width  # the super-sink: behind every input token
    pieces.append((np.asarray(sinks), np.full(len(sinks), everything), np.full(len(sinks), 2 * CAPACITY_SCALE)))
    for layer, capacity in enumerate(graph.layers, start=1):
        first = enc_nodes + layer * width
        pieces.append(_edges(capacity, first, first - width, width, top_encoder))
        if layer not in solved:
            continue
        sources, targets, caps = (np.concatenate(part) for part in zip(*pieces, strict=True))
        matrix = coo_matrix((caps.astype(np.int32), (sources, targets)), shape=(everything + 1,) * 2).tocsr()
        live = capacity.sum(-1) > 0  # padding: no edge leaves the node
        for i in range(width):
            if not live[i]:
                continue
            for index, sink in enumerate(sinks):
                if not (causal and i < index < width):
                    flows[solved.index(layer), i, index] = maximum_flow(matrix, first + i, sink).flow_value
            if reach:
                reached[solved.index(layer), i] = maximum_flow(matrix, first + i, everything).flow_value
    if reach:
        return flows / CAPACITY_SCALE, reached / CAPACITY_SCALE
    return flows / CAPACITY_SCALE


def _edges(capacity: np.ndarray, first: int, below: int, width: int, top_encoder: int):
    """One layer's positive capacities, scaled and rounded, as (source nodes, target nodes, capacities): rows from
    node ``first``; columns under ``width`` from node ``below``, the others the encoder's last states."""
    scaled = np.rint(capacity.astype(np.float64) * CAPACITY_SCALE).astype(np.int64)
    rows, cols = np.nonzero(scaled > 0)
    targets = np.where(cols < width, below + cols, top_encoder + cols - width)
    return first + rows, targets, scaled[rows, cols].astype(np.int32)


def flow_count(positions: int, sources: int, layers: int, every_layer: bool = False) -> int:
    """How many maximum flows :func:`attention_flow` solves for one input (an upper bound: a causal model's future
    tokens are skipped), from its sizes alone: ``positions`` decoder positions (the only stack's, or an
    encoder–decoder's decoder), each to every token (``positions + sources``), after the last layer or after each of
    ``layers``; an encoder–decoder's encoder adds its last layer's ``sources × sources``."""
    return (layers if every_layer else 1) * positions * (positions + sources) + sources**2


@torch.no_grad()
def attention_flow(trace: ModelTrace, every_layer: bool = False, check_row=None) -> LayerMaps:
    """Attention flow maps of a traced model, rows normalised (see the module docstring).

    Args:
        trace: A recorded forward pass.
        every_layer: The flows from the states after every layer ``(B, L, i, j)``; else after the last one.
        check_row: Called as ``check_row(row, positions, sources)`` for every row of the batch (its real decoder
            positions and source tokens, read from the maps on the host) before any flow is solved; it raises to
            refuse the batch.

    Returns:
        :class:`LayerMaps`: ``target`` (decoder positions to decoder tokens), and for encoder–decoders ``source``
        (decoder positions to source tokens; a row's source and target flows sum to 1 together) and ``encoder``
        (the encoder's last layer to its input tokens).
    """
    from .norm_based import rollout_scores

    sinks = trace.spec.attention_sinks and not trace.spec.is_encoder_decoder
    scores = rollout_scores(trace, "attention_flow", sinks=sinks)
    if scores.cross is not None:
        source_blocks, target_blocks = joint_layer_blocks(scores)
        decoder_layers = torch.cat([target_blocks, source_blocks], dim=-1)
    else:
        decoder_layers = scores.decoder
    # the maps on the host, in one copy each (the solver runs there)
    decoder_host = decoder_layers.double().cpu().numpy()
    encoder_host = None if scores.encoder is None else scores.encoder.double().cpu().numpy()
    width = decoder_host.shape[-2]
    if check_row is not None:  # a real position's row of the first map sums to 1, a padding position's to 0
        positions = (decoder_host[:, 0].sum(-1) > 0).sum(-1)
        sources = [0] * len(positions) if encoder_host is None else (encoder_host[:, 0].sum(-1) > 0).sum(-1)
        for row, (count, source_count) in enumerate(zip(positions, sources, strict=True)):
            check_row(row, int(count), int(source_count))
    target, source, encoder, shares = [], [], [], []
    for row in range(decoder_host.shape[0]):
        encoder_graph = None if encoder_host is None else FlowGraph(layers=list(encoder_host[row]))
        graph = FlowGraph(layers=list(decoder_host[row]), encoder=encoder_graph)
        solved = solve_flows(graph, causal=trace.decoder.causal, last_only=not every_layer, reach=sinks)
        if sinks:  # normalised to the share that reaches the tokens; the rest is the sinks'
            raw, reached = solved
            flows = _normalised(raw) * reached[..., None]
            live = decoder_host[row, 0].sum(-1) > 0
            share = (1 - reached) * live
            shares.append(share.T if every_layer else share[0])  # (T, L) or (T,)
        else:
            flows = _normalised(solved)
        flows = flows if every_layer else flows[0]
        target.append(flows[..., :width])
        if encoder_graph is not None:
            source.append(flows[..., width:])
            encoder.append(_normalised(solve_flows(encoder_graph, causal=False, last_only=True))[0])

    def back(arrays: list[np.ndarray]) -> torch.Tensor:  # to the model's device, in the maps' dtype
        return torch.from_numpy(np.stack(arrays)).to(decoder_layers.device, decoder_layers.dtype)

    maps = LayerMaps(target=back(target))
    if source:
        maps.source, maps.encoder = back(source), back(encoder)
    if shares:
        maps.positions["sink_share"] = back(shares)
    return maps


def _normalised(flows: np.ndarray) -> np.ndarray:
    """Each node's flows divided by their sum (rows without flow, padding, stay 0)."""
    sums = flows.sum(-1, keepdims=True)
    return np.divide(flows, sums, out=np.zeros_like(flows), where=sums > 0)
