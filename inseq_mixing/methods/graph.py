r"""Contribution graphs (Ferrando & Voita, EMNLP 2024), on a recorded forward pass.

Paper: Javier Ferrando, Elena Voita. "Information Flow Routes: Automatically Interpreting Language Models at Scale".
EMNLP 2024. https://aclanthology.org/2024.emnlp-main.965/

Every sub-block of a Transformer block writes a sum into the residual stream. The attention sub-block's output at
position :math:`i` of layer :math:`l` is

.. math:: x^{mid}_i = x^{l-1}_i + \sum_h \sum_j \alpha^h_{ij}\, v^h_j W^h_O \;(+\, b_O),

one part per (head, token) and the residual, and the FFN sub-block's is :math:`x^l_i = x^{mid}_i + f(x^{mid}_i)`, two
parts. The importance of a part :math:`z_k` of a sum :math:`y = \sum_k z_k` is its proximity to the sum, normalised
over the sum's parts (ALTI's proximity, Ferrando et al. 2022):

.. math:: w(z_k \to y) = \frac{\max(0, \lVert y\rVert_1 - \lVert y - z_k\rVert_1)}
                              {\sum_{k'} \max(0, \lVert y\rVert_1 - \lVert y - z_{k'}\rVert_1)},

so the importances of the edges into each node add up to 1. The graph's nodes are the residual stream's states (the
embeddings, then after each sub-block of each layer, at every position); its edges are the parts: one edge per head
from :math:`x^{l-1}_j` into :math:`x^{mid}_i` (kind ``"attention"``), the residual edges :math:`x^{l-1}_i \to
x^{mid}_i` and :math:`x^{mid}_i \to x^l_i` (kind ``"residual"``), and the FFN edge :math:`x^{mid}_i \to x^l_i` (kind
``"ffn"``). The attention edges' weights are our per-head ALTI parts (:func:`.alti.alti` with ``per_head=True``), the
same normalisation over heads, tokens and the residual. A route for one prediction is found top-down from the
explained position's last state: an edge into a node already on the route is kept when its importance exceeds the
threshold :math:`\tau`, and its source joins the route.

Our extensions (the paper treats decoder-only, pre-LN models): post-LN blocks (BERT, Marian, BART) use ALTI's frozen
norm on every part and the norm's real output as :math:`y`; encoder–decoders add a cross-attention stage whose head
edges come from the encoder's last states (and the route goes on down the encoder); parallel blocks (GPT-J, GPT-NeoX,
Falcon), whose FFN reads the block input, draw the FFN edge from the state after attention (the same position, so the
routes are the same); token-level edges (``heads=False``) weigh a token by its heads' importances summed; a sum none of
whose parts is closer to it than the origin gives its residual edge the weight 1 (as ALTI does).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import torch

from ..trace import ModelTrace, StackTrace
from .alti import alti, proximity
from .blocks import ffn_output, upcast
from .norms import freeze_norm
from .rollout import normalize_rows

#: Default pruning threshold :math:`\tau` (the paper chooses it per study; low values keep more of the graph).
DEFAULT_THRESHOLD = 0.04

#: The stages of one layer, in order (``"cross"`` only in an encoder–decoder's decoder); ``"embedding"`` is below
#: layer 0.
STAGES = ("attention", "cross", "ffn")
#: The stacks of a graph, and the kinds of its edges.
STACKS = ("decoder", "encoder")
EDGE_KINDS = ("attention", "cross", "ffn", "residual")


@dataclass
class StackEdges:
    """Every edge importance of one stack, dense.

    Attributes:
        attention: ``(B, L, H + 1, Q, Q)``: per-head self-attention edges ``[b, l, h, i, j]`` (``j → i``); index ``H``
            the residual edge, on the diagonal.
        ffn: ``(B, L, Q, 2)``: the FFN edge and the residual edge into each position's layer output.
        cross: ``(B, L, H + 1, Q, S + 1)``: cross-attention edges from the encoder's last states; ``[b, l, H, i, S]``
            the residual edge (encoder–decoders' decoders).
    """

    attention: torch.Tensor
    ffn: torch.Tensor
    cross: torch.Tensor | None = None

    def cpu(self) -> StackEdges:
        return StackEdges(*(None if t is None else t.cpu() for t in (self.attention, self.ffn, self.cross)))


@dataclass
class GraphEdges:
    """:class:`StackEdges` of the decoder (or the only stack) and, for encoder–decoders, of the encoder."""

    decoder: StackEdges
    encoder: StackEdges | None = None

    def cpu(self) -> GraphEdges:
        """On the host, where routes are walked (a no-op for host tensors)."""
        return GraphEdges(self.decoder.cpu(), None if self.encoder is None else self.encoder.cpu())


def ffn_edges(stack_spec, stack: StackTrace) -> torch.Tensor:
    """``(B, L, Q, 2)``: the importance of the FFN's output and of the residual stream in each layer's output (rows
    sum to 1; padding rows are 0)."""
    per_layer = []
    for layer, record in zip(stack_spec.layers, stack.layers, strict=True):
        branch = upcast(ffn_output(layer, record))
        post_norm = layer.ffn.post_norm
        total = upcast(record.output if post_norm is None else record.ffn_norm_input)
        parts = torch.stack([branch, total - branch], dim=2)  # (B, Q, 2, D): the FFN, the residual
        if post_norm is not None:  # a post-LN block: the frozen norm on both parts, the norm's output as the sum
            parts = freeze_norm(post_norm, record.ffn_norm_input).linear(parts, in_place=True)
        scores = proximity(upcast(record.output), parts)
        empty = scores.sum(-1, keepdim=True) == 0
        scores = torch.where(empty, torch.tensor([0.0, 1.0], dtype=scores.dtype, device=scores.device), scores)
        per_layer.append(normalize_rows(scores) * stack.mask[..., None])
    return torch.stack(per_layer, dim=1)


@torch.no_grad()
def graph_edges(trace: ModelTrace, max_chunk_elements: int | None = None) -> GraphEdges:
    """Every edge importance of a traced forward pass (the full graph, before pruning).

    Args:
        trace: A recorded forward pass.
        max_chunk_elements: Memory bound of one chunk of attention parts (default: ALTI's).
    """
    options = {} if max_chunk_elements is None else {"max_chunk_elements": max_chunk_elements}
    heads = alti(trace, per_head=True, **options)
    spec = trace.spec
    decoder = StackEdges(attention=heads.decoder, ffn=ffn_edges(spec.decoder, trace.decoder), cross=heads.cross)
    if not spec.is_encoder_decoder:
        return GraphEdges(decoder=decoder)
    encoder = StackEdges(attention=heads.encoder, ffn=ffn_edges(spec.encoder, trace.encoder))
    return GraphEdges(decoder=decoder, encoder=encoder)


@dataclass(frozen=True)
class Node:
    """A state of the residual stream: ``stack`` (``"decoder"``, the only stack of a decoder-only or encoder-only
    model, or ``"encoder"``), ``layer`` (-1 for the embeddings), ``stage`` (``"embedding"`` or one of
    :data:`STAGES`: the state after that sub-block) and ``position`` (among the row's real tokens, padding left
    out)."""

    stack: str
    layer: int
    stage: str
    position: int

    @property
    def key(self) -> str:
        """A short unique name, ``decoder/3/ffn/5``."""
        return f"{self.stack}/{self.layer}/{self.stage}/{self.position}"


@dataclass(frozen=True)
class Edge:
    """One part of a sum: from ``source`` (the earlier state) into ``target``; ``kind`` is ``"attention"``,
    ``"cross"``, ``"ffn"`` or ``"residual"``; ``head`` the attention head (None for token-level edges and the
    others); ``weight`` the importance (see the module docstring)."""

    source: Node
    target: Node
    kind: str
    weight: float
    head: int | None = None


@dataclass
class ContributionGraph:
    """The route of one prediction (see the module docstring): its nodes, its edges, the explained node, the
    threshold, the number of layers and of real positions of each stack (``num_layers``, ``lengths``), and labels of
    each stack's positions (``tokens``, filled in where the output's tokens are the stack's positions)."""

    explained: Node
    nodes: list[Node]
    edges: list[Edge]
    threshold: float
    heads: bool
    num_layers: dict[str, int]
    lengths: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, list[str]] = field(default_factory=dict)

    def incoming(self, node: Node) -> list[Edge]:
        """The route's edges into ``node``."""
        return [edge for edge in self.edges if edge.target == node]

    def to_networkx(self):
        """A ``networkx.MultiDiGraph`` (several heads can join the same two nodes): nodes keyed by :attr:`Node.key`
        with their fields and token label, edges with ``kind``, ``head`` and ``weight``."""
        import networkx as nx

        graph = nx.MultiDiGraph(explained=self.explained.key, threshold=self.threshold)
        for node in self.nodes:
            graph.add_node(node.key, **asdict(node), token=self.label(node))
        for edge in self.edges:
            graph.add_edge(edge.source.key, edge.target.key, kind=edge.kind, head=edge.head, weight=edge.weight)
        return graph

    def label(self, node: Node) -> str | None:
        """The token at the node's position, where known."""
        labels = self.tokens.get(node.stack)
        return None if labels is None or node.position >= len(labels) else labels[node.position]

    def to_dict(self) -> dict:
        """Plain data (what :meth:`to_json` writes and :meth:`from_dict` reads)."""
        return {
            "explained": asdict(self.explained),
            "nodes": [asdict(node) for node in self.nodes],
            "edges": [
                {
                    "source": asdict(e.source),
                    "target": asdict(e.target),
                    "kind": e.kind,
                    "head": e.head,
                    "weight": e.weight,
                }
                for e in self.edges
            ],  # fmt: skip
            "threshold": self.threshold,
            "heads": self.heads,
            "num_layers": self.num_layers,
            "lengths": self.lengths,
            "tokens": self.tokens,
        }

    def to_json(self, path=None) -> str:
        """The graph as JSON (written to ``path`` when given)."""
        text = json.dumps(self.to_dict())
        if path is not None:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
        return text

    @classmethod
    def from_dict(cls, data: dict) -> ContributionGraph:
        """A graph from :meth:`to_dict`'s plain data, every field checked (a saved output is shared: a stack, stage or
        kind outside the known ones, or a number that is not one, is refused, not passed on to a page).

        Raises:
            ValueError: A field missing or of the wrong kind, naming it.
        """
        try:
            edges = [Edge(_node(e["source"]), _node(e["target"]), _choice(e["kind"], EDGE_KINDS, "kind"),
                          _number(e["weight"], "weight"), None if e["head"] is None else _count(e["head"], "head"))
                     for e in _listed(data["edges"], "edges")]  # fmt: skip
            return cls(
                explained=_node(data["explained"]),
                nodes=[_node(node) for node in _listed(data["nodes"], "nodes")],
                edges=edges,
                threshold=_number(data["threshold"], "threshold"),
                heads=_flag(data["heads"], "heads"),
                num_layers=_counts(data["num_layers"], "num_layers"),
                lengths=_counts(data.get("lengths", {}), "lengths"),
                tokens={_choice(key, STACKS, "tokens"): [str(token) for token in _listed(value, "tokens")]
                        for key, value in _mapping(data.get("tokens", {}), "tokens").items()},
            )  # fmt: skip
        except (KeyError, TypeError) as error:
            raise ValueError(f"Not a contribution graph: {type(error).__name__} {error}.") from None


def contribution_graph(
    edges: GraphEdges,
    masks: dict[str, torch.Tensor],
    row: int,
    position: int,
    threshold: float = DEFAULT_THRESHOLD,
    heads: bool = True,
) -> ContributionGraph:
    """The route of the prediction at ``position`` of batch row ``row``, pruned top-down at ``threshold``.

    Args:
        edges: The full graph's importances (:func:`graph_edges`).
        masks: ``{"decoder": (B, Q), ["encoder": (B, S)]}``: the real tokens of each stack (padding is left out of
            the graph and the positions renumbered among the real tokens).
        row: The batch row.
        position: The explained position, in the padded batch (its state after the last layer is the route's top).
        threshold: Keep an edge whose importance exceeds it (0: every edge with a positive importance).
        heads: One edge per attention head (the paper's parts); False: one per token, its heads' importances summed.

    Returns:
        :class:`ContributionGraph`.
    """
    if not 0 <= threshold < 1:
        raise ValueError(f"threshold={threshold}: give an importance in [0, 1) (edges above it are kept).")
    edges = edges.cpu()
    real = {name: mask[row].bool().cpu() for name, mask in masks.items()}
    if not 0 <= position < real["decoder"].shape[0] or not real["decoder"][position]:
        raise ValueError(f"Position {position} of row {row} is not a real token: explain one of its tokens.")
    route = _Route(threshold=threshold, heads=heads, numbers={name: (m.long().cumsum(0) - 1).tolist()
                                                              for name, m in real.items()})  # fmt: skip
    num_layers = {"decoder": edges.decoder.ffn.shape[1]}
    if edges.encoder is not None:
        num_layers["encoder"] = edges.encoder.ffn.shape[1]
        route.encoder_top = num_layers["encoder"] - 1
    front = torch.zeros_like(real["decoder"])
    front[position] = True
    encoder_front = route.walk("decoder", edges.decoder, row, front)
    if edges.encoder is not None and encoder_front.any():
        route.walk("encoder", edges.encoder, row, encoder_front)
    top = Node("decoder", num_layers["decoder"] - 1, "ffn", route.numbers["decoder"][position])
    nodes = {top}
    for edge in route.found:
        nodes.update((edge.source, edge.target))
    stage_order = {"embedding": -1, **{stage: index for index, stage in enumerate(STAGES)}}
    order = sorted(nodes, key=lambda n: (n.stack != "encoder", n.layer, stage_order[n.stage], n.position))
    lengths = {name: int(mask.sum()) for name, mask in real.items()}
    return ContributionGraph(explained=top, nodes=order, edges=route.found, threshold=threshold, heads=heads,
                             num_layers=num_layers, lengths=lengths)  # fmt: skip


@dataclass
class _Route:
    """The edges found so far, going down one stack at a time; ``numbers`` renumbers each stack's padded positions
    among its real tokens."""

    threshold: float
    heads: bool
    numbers: dict[str, list[int]]
    encoder_top: int = -1
    found: list[Edge] = field(default_factory=list)

    def node(self, stack: str, layer: int, stage: str, position: int) -> Node:
        return Node(stack, layer, stage, self.numbers[stack][position])

    def walk(self, stack: str, edges: StackEdges, row: int, front: torch.Tensor) -> torch.Tensor:
        """Go down ``stack`` from its last layer's states at ``front``; returns the encoder positions that
        cross-attention edges reached."""
        reached = torch.zeros(0 if edges.cross is None else edges.cross.shape[-1] - 1, dtype=torch.bool)
        for layer in reversed(range(edges.ffn.shape[1])):
            below = (layer - 1, "ffn") if layer > 0 else (-1, "embedding")
            mid = "cross" if edges.cross is not None else "attention"
            ffn = edges.ffn[row, layer]
            kept = (ffn > self.threshold) & front[:, None]
            for pos, slot in kept.nonzero().tolist():
                self.found.append(Edge(self.node(stack, layer, mid, pos), self.node(stack, layer, "ffn", pos),
                                       ("ffn", "residual")[slot], float(ffn[pos, slot])))  # fmt: skip
            front = kept.any(-1)
            if edges.cross is not None:
                front, keys = self.attention(stack, edges.cross[row, layer], front, layer, "cross",
                                             (layer, "attention"))  # fmt: skip
                reached |= keys
            front, _ = self.attention(stack, edges.attention[row, layer], front, layer, "attention", below)
        return reached

    def attention(self, stack, weights, front, layer, stage, below):
        """The edges of one attention stage (``stage``, also the edges' kind: ``"attention"`` or ``"cross"``) into
        the states at ``front`` (``weights`` ``(H + 1, Q, K[+1])``, index ``H`` the residual: on the diagonal, or in
        the last column for cross-attention, whose heads come from the encoder's last states); returns the positions
        of this stack reached below, and the keys the heads reached."""
        num_heads = weights.shape[0] - 1
        cross = stage == "cross"
        num_keys = weights.shape[-1] - int(cross)
        positions = torch.arange(weights.shape[1])
        residual = weights[num_heads, positions, num_keys] if cross else weights[num_heads].diagonal()
        kept_residual = (residual > self.threshold) & front
        for pos in kept_residual.nonzero().flatten().tolist():
            self.found.append(Edge(self.node(stack, *below, pos), self.node(stack, layer, stage, pos), "residual",
                                   float(residual[pos])))  # fmt: skip
        parts = weights[:num_heads, :, :num_keys]
        scores = parts if self.heads else parts.sum(0, keepdim=True)
        kept = (scores > self.threshold) & front[None, :, None]
        for head, pos, key in kept.nonzero().tolist():
            origin = self.node("encoder", self.encoder_top, "ffn", key) if cross else self.node(stack, *below, key)
            self.found.append(Edge(origin, self.node(stack, layer, stage, pos), stage, float(scores[head, pos, key]),
                                   head if self.heads else None))  # fmt: skip
        keys = kept.any(0).any(0)
        return kept_residual | (torch.zeros_like(front) if cross else keys), keys


# ----- reading a graph's plain data back, every field checked -----


def _node(data) -> Node:
    data = _mapping(data, "node")
    return Node(
        _choice(data["stack"], STACKS, "stack"),
        _integer(data["layer"], "layer", -1),
        _choice(data["stage"], ("embedding", *STAGES), "stage"),
        _count(data["position"], "position"),
    )


def _choice(value, choices: tuple, what: str) -> str:
    if value not in choices:
        raise ValueError(f"A contribution graph's {what} is one of {list(choices)}, not {str(value)[:40]!r}.")
    return value


def _integer(value, what: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"A contribution graph's {what} is a whole number ≥ {least}, not {str(value)[:40]!r}.")
    return value


def _count(value, what: str) -> int:
    return _integer(value, what, 0)


def _number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or abs(value) == float("inf"):
        raise ValueError(f"A contribution graph's {what} is a finite number, not {str(value)[:40]!r}.")
    return float(value)


def _typed(value, kind, what: str, words: str):
    if not isinstance(value, kind):
        raise ValueError(f"A contribution graph's {what} is {words}, not {str(value)[:40]!r}.")
    return value


def _flag(value, what: str) -> bool:
    return _typed(value, bool, what, "true or false")


def _listed(value, what: str) -> list:
    return list(_typed(value, list | tuple, what, "a list"))


def _mapping(value, what: str) -> dict:
    return _typed(value, dict, what, "a mapping")


def _counts(value, what: str) -> dict[str, int]:
    return {_choice(key, STACKS, what): _count(count, what) for key, count in _mapping(value, what).items()}
