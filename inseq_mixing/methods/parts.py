r"""The per-(position, token) parts of an attention sub-block's output, shared by every decomposition-based map method
(ALTI, the attention-norm family, GlobEnc), and the driver that runs a per-sub-block scorer over a stack.

An attention sub-block's output at position :math:`i` splits into one vector per context token,

.. math:: T_i(x_j) = \sum_h \alpha^h_{ij}\, (x_j W^h_V + b^h_V)\, W^h_O \;[+\, x_i \text{ if } j = i],

(the residual counted as token :math:`i`'s own part in self-attention, as an extra last column in cross-attention),
passed through the frozen norm on the attention output (sandwich layouts) and through any further frozen norms a method
asks for (a post-LN block's norm, ...). Parts come in tiles of (position, token) pairs bounded by
``max_chunk_elements`` (:func:`.chunking.pair_tiles`: cache-sized on a CPU); causal tiles skip future keys. A method
only supplies the scorer of a tile, ``scorer(output, parts) -> (B, q, k)``.
"""

from collections.abc import Callable, Sequence

import torch

from ..specs import AttentionSpec, LayerSpec, StackSpec
from ..specs.base import MixerSpec
from ..trace import AttentionTrace, LayerTrace, MixerTrace, StackTrace
from .blocks import cross_attention_input, head_value_outputs, upcast, valid_cells
from .chunking import DEFAULT_CHUNK_ELEMENTS, chunk_slices, pair_tiles
from .compiled import kernel
from .mixers import frozen_mixer
from .norms import FrozenNorm, freeze_norm

Scorer = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def part_scores(
    attn: AttentionSpec,
    record: AttentionTrace,
    residual: torch.Tensor,
    self_mixing: bool,
    causal: bool,
    scorer: Scorer,
    with_residual: bool = True,
    maps: Sequence[FrozenNorm] = (),
    output: torch.Tensor | None = None,
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    first_row: int = 0,
    trimmed: bool = False,
) -> torch.Tensor:
    """Score every part of one attention sub-block.

    Args:
        attn: The sub-block's spec.
        record: Its trace.
        residual: The residual stream entering the sub-block ``(B, Q, D)``.
        self_mixing: Self-attention (residual on the diagonal) or cross-attention (residual as a last column).
        causal: Skip keys after the last query of each chunk.
        scorer: ``scorer(output, parts)``: outputs ``(B, q, D)``, parts ``(B, q, k, D)`` of one tile → ``(B, q, k)``;
            it may overwrite the parts (each tile's are its own) but not the output.
        with_residual: Count the residual as a part (else parts are the attention's alone).
        maps: Frozen norms applied to every part, in order, after the residual is added.
        output: What the parts sum to with their shifts (given to the scorer); default: residual plus the branch
            output.
        max_chunk_elements: Memory bound of one tile of parts.
        first_row: Query rows before it are not scored (they stay 0): nothing reads them.
        trimmed: Return the rows from ``first_row`` on only, the others never allocated.

    Returns:
        ``(B, Q, K)``, or ``(B, Q, K + 1)`` for cross-attention with the residual (``trimmed``: ``Q - first_row``
        rows).
    """
    source, residual, out_frozen, output = _part_inputs(attn, record, residual, output)
    batch, num_keys, num_queries = output.shape[0], source.num_keys, output.shape[1]
    scorer = kernel(scorer)
    top = first_row if trimmed else 0  # the first row ``scores`` holds
    scores = output.new_zeros(batch, num_queries - top, num_keys + int(with_residual and not self_mixing))
    per_pair = batch * output.shape[-1]
    tiles = pair_tiles(num_queries, num_keys, per_pair, max_chunk_elements, output.device.type, causal)
    tiles = source.tiles(from_row(tiles, first_row))
    for queries, keys in tiles:
        parts = source(queries, keys)  # (B, q, k, D)
        if out_frozen is not None:  # a norm on the attention output acts on every part (its shift stays outside)
            parts = out_frozen.linear(parts, queries, in_place=True)
        if with_residual and self_mixing:
            _add_residual_on_diagonal(parts, residual, queries, keys)
        for frozen in maps:
            parts = frozen.linear(parts, queries, in_place=True)
        scores[:, queries.start - top : queries.stop - top, keys] = scorer(output[:, queries], parts)
    if with_residual and not self_mixing:  # cross-attention: the residual is the last column
        _residual_column(scores, scorer, output, residual, maps, per_pair, max_chunk_elements, first_row, top)
    return scores


def _residual_column(scores: torch.Tensor, scorer: Scorer, output: torch.Tensor, residual: torch.Tensor,
                     maps: Sequence[FrozenNorm], per_pair: int, max_chunk_elements: int, first_row: int,
                     top: int = 0) -> None:  # fmt: skip
    """Cross-attention's residual scored as its last column of ``scores`` (its first row position ``top``), in
    place."""
    for queries in chunk_slices(output.shape[1], per_pair, max_chunk_elements):
        if queries.stop <= first_row:
            continue
        queries = slice(max(queries.start, top), queries.stop)
        own = residual[:, queries, None].clone()  # the scorer may overwrite its parts
        for frozen in maps:
            own = frozen.linear(own, queries, in_place=True)
        scores[:, queries.start - top : queries.stop - top, -1:] = scorer(output[:, queries], own)


def part_norms(
    attn: AttentionSpec | MixerSpec,
    record: AttentionTrace | MixerTrace,
    residual: torch.Tensor,
    self_mixing: bool,
    causal: bool,
    with_residual: bool = True,
    maps: Sequence[FrozenNorm] = (),
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    first_row: int = 0,
    trimmed: bool = False,
) -> torch.Tensor:
    """``‖part‖₂`` of every part of one sub-block: :func:`part_scores` with :func:`l2_norms` (arguments as there),
    an attention sub-block's read without forming its parts (:func:`attention_part_norms`)."""
    norms = PART_NORMS.get(type(attn))
    if norms is None:
        return part_scores(attn, record, residual, self_mixing, causal, l2_norms, with_residual, maps,
                           max_chunk_elements=max_chunk_elements, first_row=first_row, trimmed=trimmed)  # fmt: skip
    return norms(attn, record, residual, self_mixing, causal, with_residual, maps, max_chunk_elements, first_row,
                 trimmed)  # fmt: skip


def attention_part_norms(
    attn: AttentionSpec,
    record: AttentionTrace,
    residual: torch.Tensor,
    self_mixing: bool,
    causal: bool,
    with_residual: bool = True,
    maps: Sequence[FrozenNorm] = (),
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    first_row: int = 0,
    trimmed: bool = False,
) -> torch.Tensor:
    r"""``‖part‖₂`` of every part of an attention sub-block (:func:`part_norms`), each as a quadratic form in the
    heads' probabilities: every frozen norm the parts pass through is a per-position scale times a map that is the
    same at every position (:meth:`.norms.FrozenNorm.unscaled`), so with :math:`g^h_j` token :math:`j`'s head value
    output through those maps and :math:`s_i` the product of the scales at position :math:`i`,

    .. math:: \lVert T_i(x_j) \rVert_2^2 = s_i^2 \sum_{h, h'} \alpha^h_{ij} \alpha^{h'}_{ij}\, g^h_j \cdot g^{h'}_j,

    ``heads²`` per pair instead of ``heads × d_model``: token :math:`j`'s ``heads × heads`` Gram matrix is made
    once. A position's own part, which holds the residual, is formed and measured directly. Equal to the parts'
    norms up to rounding: the squared norm's relative error grows as the heads' vectors cancel in the sum (their
    summed norms over the norm of their sum, squared, times the precision's).
    """
    residual = upcast(residual)
    chain = ([] if attn.out_norm is None else [freeze_norm(attn.out_norm, record.output)]) + list(maps)
    values = head_value_outputs(attn, record)  # (B, H, K, D)
    through = values
    scale = residual.new_ones(residual.shape[:2])  # (B, Q): each position's scales, multiplied
    for frozen in chain:
        through = frozen.unscaled(through)
        scale = scale * frozen.inv_scale[..., 0]
    gram = torch.einsum("bhkd,bgkd->bkhg", through, through)  # (B, K, H, H)
    del through
    blocks = RowBlocks(record)
    batch, num_queries, num_keys, heads = residual.shape[0], residual.shape[1], values.shape[2], values.shape[1]
    top = first_row if trimmed else 0  # the first row ``scores`` holds
    scores = residual.new_zeros(batch, num_queries - top, num_keys + int(with_residual and not self_mixing))
    own_probs = residual.new_zeros(batch, num_queries, heads) if with_residual and self_mixing else None
    tiles = pair_tiles(num_queries, num_keys, batch * heads * 2, max_chunk_elements, residual.device.type, causal)
    for queries, keys in blocks.tiles(from_row(tiles, first_row)):
        probs = blocks(queries)[:, keys]  # (B, k, q, H)
        squared = (torch.matmul(probs, gram[:, keys]) * probs).sum(-1).transpose(1, 2)  # (B, q, k)
        squared = squared.mul_(scale[:, queries, None].square()).clamp_(min=0).sqrt_()
        scores[:, queries.start - top : queries.stop - top, keys] = squared
        first, stop = max(queries.start, keys.start), min(queries.stop, keys.stop)
        if own_probs is not None and first < stop:
            own = torch.arange(first, stop, device=probs.device)
            own_probs[:, first:stop] = probs[:, own - keys.start, own - queries.start]
    if own_probs is not None:  # each position's own part, the residual in it, formed and measured
        rows = slice(first_row, num_queries)
        own = torch.einsum("bqh,bhqd->bqd", own_probs[:, rows], values[:, :, rows])
        if attn.out_norm is not None:
            own = chain[0].linear(own, rows)
        own = own + residual[:, rows]
        for frozen in maps:
            own = frozen.linear(own, rows)
        positions = torch.arange(first_row, num_queries, device=scores.device)
        scores[:, positions - top, positions] = torch.linalg.vector_norm(own, dim=-1)
    if with_residual and not self_mixing:
        _residual_column(scores, l2_norms, residual, residual, maps, batch * residual.shape[-1], max_chunk_elements,
                         first_row, top)  # fmt: skip
    return scores


def from_row(tiles: list[tuple[slice, slice]], first_row: int) -> list[tuple[slice, slice]]:
    """``tiles`` without their query rows before ``first_row``."""
    if not first_row:
        return tiles
    return [(slice(max(queries.start, first_row), queries.stop), keys) for queries, keys in tiles
            if queries.stop > first_row]  # fmt: skip


def _add_residual_on_diagonal(parts: torch.Tensor, residual: torch.Tensor, queries: slice, keys: slice) -> None:
    """Add each position's residual to its own part, ``parts (B, q, k, D)`` of a tile, where the tile holds the pair
    (i, i)."""
    first, stop = max(queries.start, keys.start), min(queries.stop, keys.stop)
    if first >= stop:
        return
    own = torch.arange(first, stop, device=parts.device)
    parts[:, own - queries.start, own - keys.start] += residual[:, first:stop]


class RowBlocks:
    """A sub-block's attention probabilities for the tiles' query rows, laid out ``(B, K, q, H)`` (keys first), one
    block of query rows held at a time: a kept layer is one block (the whole layer, as it was traced); a long trace's
    layer is recomputed block by block (:meth:`~inseq_mixing.trace.AttentionTrace.probs_rows`), each block at least
    :data:`~inseq_mixing.trace.ROW_BLOCK_BYTES` of rows, so that the layer's ``heads × T²`` is never held at once.
    The tiles come in order of their queries (:func:`.chunking.pair_tiles`), so each block is computed once."""

    def __init__(self, record: AttentionTrace):
        self.record = record
        self.rows, self.block = slice(0, 0), None

    def tiles(self, tiles: list[tuple[slice, slice]]) -> list[tuple[slice, slice]]:
        """``tiles`` with each tile's queries cut to at most one block of rows (a kept layer's stay whole)."""
        if self.record.kept_probs is not None:
            return tiles
        rows = self.record.block_rows()
        cut = [
            (slice(start, min(start + rows, queries.stop)), keys)
            for queries, keys in tiles
            for start in range(queries.start, queries.stop, rows)
        ]
        return sorted(cut, key=lambda tile: tile[0].start)  # a block's tiles together (stable: keys in order)

    def __call__(self, queries: slice) -> torch.Tensor:
        if not (self.rows.start <= queries.start and queries.stop <= self.rows.stop):
            self.block = None  # freed before the next block is computed
            num_queries = self.record.output.shape[1]
            start = 0 if self.record.kept_probs is not None else queries.start  # a kept layer: one block, all of it
            self.rows = slice(start, min(num_queries, start + max(self.record.block_rows(), queries.stop - start)))
            self.block = upcast(self.record.probs_rows(self.rows)).permute(0, 3, 2, 1).contiguous()
        return self.block[:, :, queries.start - self.rows.start : queries.stop - self.rows.start]


class AttentionParts:
    """The parts of an attention sub-block, tile by tile: the probabilities by query rows (:class:`RowBlocks`,
    ``(B, K, q, H)``) times each head's value outputs ``(B, K, H, D)`` (keys first, so that a tile's parts are one
    batched product over its keys)."""

    def __init__(self, attn: AttentionSpec, record: AttentionTrace):
        self.attn, self.record = attn, record
        self.probs = RowBlocks(record)
        self._values = None
        self.num_keys, self.heads = record.values.shape[1], attn.num_heads

    @property
    def values(self) -> torch.Tensor:
        """Each head's value outputs, keys first ``(B, K, H, D)``, made when a tile first reads them."""
        if self._values is None:
            self._values = head_value_outputs(self.attn, self.record).transpose(1, 2).contiguous()
        return self._values

    def tiles(self, tiles: list[tuple[slice, slice]]) -> list[tuple[slice, slice]]:
        return self.probs.tiles(tiles)

    def __call__(self, queries: slice, keys: slice) -> torch.Tensor:
        """Token parts ``(B, q, k, D)``."""
        return torch.matmul(self.probs(queries)[:, keys], self.values[:, keys]).transpose(1, 2)

    def head_parts(self, queries: slice, keys: slice) -> torch.Tensor:
        """Each head's part of each token ``(B, q, H, k, D)``."""
        return (self.probs(queries)[:, keys, :, :, None] * self.values[:, keys, None]).permute(0, 2, 3, 1, 4)

    def totals(self, first_row: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Every position's parts summed and its own part ``(B, Q - first_row, D)`` each, from ``first_row`` on, a
        block of query rows at a time: the probabilities meet the values in head space (width ``head_dim``), then
        each head's sum goes through its slice of ``W_O`` (the parts' sum, ``Σ_h (Σ_j α^h_ij v^h_j) W^h_O``, without
        a ``(heads, T², d_model)`` product)."""
        values = upcast(self.record.values[:, :, self.attn.kv_head_of_query_head().to(self.record.values.device)])
        weight = upcast(self.attn.out_weight_per_head())  # (H, E, D)
        total, own = [], []
        for queries, probs in self.record.row_blocks(first_row=first_row):  # a block of rows' probabilities
            probs = upcast(probs)
            total.append(torch.einsum("bqhe,hed->bqd", torch.einsum("bhqk,bkhe->bqhe", probs, values), weight))
            diagonal = probs[..., queries].diagonal(dim1=-2, dim2=-1)
            own.append(torch.einsum("bhq,bqhe,hed->bqd", diagonal, values[:, queries], weight))
        return torch.cat(total, dim=1), torch.cat(own, dim=1)


class MixerParts:
    """The parts of a token mixer that is not attention, tile by tile (:meth:`.mixers.FrozenMixer.token_parts`)."""

    def __init__(self, attn: MixerSpec, record: MixerTrace):
        self.frozen = frozen_mixer(attn, record)
        self.num_keys, self.heads = self.frozen.positions, self.frozen.heads

    def tiles(self, tiles: list[tuple[slice, slice]]) -> list[tuple[slice, slice]]:
        return tiles

    def __call__(self, queries: slice, keys: slice) -> torch.Tensor:
        return self.frozen.token_parts(queries, keys)

    def head_parts(self, queries: slice, keys: slice) -> torch.Tensor:
        return self.frozen.head_parts(queries, keys)

    def totals(self, first_row: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        return self.frozen.totals(slice(first_row, None))


#: Where the parts of each kind of token-mixing sub-block come from, by its spec's type.
PART_SOURCES = {AttentionSpec: AttentionParts, MixerSpec: MixerParts}


def part_source(attn: AttentionSpec | MixerSpec, record: AttentionTrace | MixerTrace) -> AttentionParts | MixerParts:
    """The parts of one token-mixing sub-block (attention or a mixer), looked up by its spec's type."""
    return PART_SOURCES[type(attn)](attn, record)


def _part_inputs(
    attn: AttentionSpec | MixerSpec, record: AttentionTrace | MixerTrace, residual: torch.Tensor,
    output: torch.Tensor | None,
) -> tuple[AttentionParts | MixerParts, torch.Tensor, FrozenNorm | None, torch.Tensor]:  # fmt: skip
    """What the parts of one sub-block are built from, upcast: their source (:func:`part_source`), the residual, the
    frozen norm on the sub-block's output (sandwich layouts) or None, and what the parts sum to (default: residual
    plus the branch output)."""
    residual = upcast(residual)
    out_frozen = None if attn.out_norm is None else freeze_norm(attn.out_norm, record.output)
    if output is None:
        branch = upcast(record.output if attn.out_norm is None else attn.out_norm(record.output))
        output = residual + branch
    return part_source(attn, record), residual, out_frozen, output


def head_part_scores(
    attn: AttentionSpec,
    record: AttentionTrace,
    residual: torch.Tensor,
    self_mixing: bool,
    causal: bool,
    scorer: Scorer,
    maps: Sequence[FrozenNorm] = (),
    output: torch.Tensor | None = None,
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> torch.Tensor:
    """Score every head's part of every token, :math:`\alpha^h_{ij} v^h_j W^h_O`, and the residual as a part of its
    own (arguments as in :func:`part_scores`; the scorer gets parts ``(B, q, H, k, D)`` and ``(B, q, 1, 1, D)``).

    Returns:
        ``(B, H + 1, Q, K)`` (cross-attention: ``K + 1``); index ``H`` holds the residual's score, on the diagonal
        (self-attention) or in the last column (cross-attention).
    """
    source, residual, out_frozen, output = _part_inputs(attn, record, residual, output)
    batch, num_keys, num_heads, num_queries = output.shape[0], source.num_keys, source.heads, output.shape[1]
    scorer = kernel(scorer)
    scores = output.new_zeros(batch, num_heads + 1, num_queries, num_keys + (not self_mixing))
    per_pair = batch * num_heads * output.shape[-1]
    tiles = source.tiles(pair_tiles(num_queries, num_keys, per_pair, max_chunk_elements, output.device.type, causal))
    for queries, keys in tiles:
        parts = source.head_parts(queries, keys)  # (B, q, H, k, D)
        if out_frozen is not None:
            parts = out_frozen.linear(parts, queries, in_place=True)
        for frozen in maps:
            parts = frozen.linear(parts, queries, in_place=True)
        scores[:, :num_heads, queries, keys] = scorer(output[:, queries], parts).transpose(1, 2)
    for queries in chunk_slices(num_queries, batch * output.shape[-1], max_chunk_elements):  # the residual's slot
        own = residual[:, queries, None, None].clone()  # the scorer may overwrite its parts
        for frozen in maps:
            own = frozen.linear(own, queries, in_place=True)
        rows = torch.arange(queries.start, queries.stop, device=scores.device)
        scores[:, num_heads, rows, rows if self_mixing else num_keys] = scorer(output[:, queries], own)[:, :, 0, 0]
    return scores


def l2_norms(_output: torch.Tensor, parts: torch.Tensor) -> torch.Tensor:
    """The scorer of the norm-based measures: ``‖part‖₂``."""
    return torch.linalg.vector_norm(parts, dim=-1)


#: ``layer_scores(layer, record, attn, attn_record, residual, self_mixing, causal) -> (B, Q, K[+1])``.
LayerScorer = Callable[[LayerSpec, LayerTrace, AttentionSpec, AttentionTrace, torch.Tensor, bool, bool], torch.Tensor]


def stack_scores(
    stack_spec: StackSpec, stack: StackTrace, sub_block: str, key_mask: torch.Tensor, layer_scores: LayerScorer,
    with_residual: bool = True, layers: int | slice | None = None,
) -> torch.Tensor:  # fmt: skip
    """``layer_scores`` on one kind of sub-block (``"self"`` or ``"cross"``) of every layer of a stack (or of its
    first ``layers``, or of the layers a slice picks), impossible cells (padding, future keys) set to 0:
    ``(B, L, [H,] Q, K[+1])`` (a scorer may add axes before ``Q``, and give the last rows only; it returns a tensor
    of its own, which is changed in place)."""
    self_mixing = sub_block == "self"
    causal = stack.causal and self_mixing
    if with_residual and not self_mixing:
        key_mask = torch.cat([key_mask, torch.ones_like(key_mask[:, :1])], dim=-1)
    valid = valid_cells(stack.mask, key_mask, causal)
    per_layer = []
    chosen = layers if isinstance(layers, slice) else slice(layers)
    for layer, record in zip(stack_spec.layers[chosen], stack.layers[chosen], strict=True):
        if self_mixing:
            attn, attn_record, residual = layer.self_attn, record.self_attn, record.input
        else:
            attn, attn_record, residual = layer.cross_attn, record.cross_attn, cross_attention_input(layer, record)
        scores = layer_scores(layer, record, attn, attn_record, residual, self_mixing, causal)  # a tensor of its own
        rows = valid[:, valid.shape[1] - scores.shape[-2] :]  # a scorer may give the last rows only (trimmed)
        cells = rows.reshape(rows.shape[0], *[1] * (scores.dim() - 3), *rows.shape[1:])  # extra axes: heads
        per_layer.append(scores.masked_fill_(~cells, 0.0))
    return per_layer[0].unsqueeze(1) if len(per_layer) == 1 else torch.stack(per_layer, dim=1)  # one layer: no copy


#: The parts' L2 norms read without forming the parts, by the sub-block spec's type (others: :func:`part_scores`).
PART_NORMS = {AttentionSpec: attention_part_norms}
