"""DecompX's memory plan (:mod:`.decompx` holds the paper's steps): how the decomposed stream is stored and cut so
that a long input fits, with no effect on the numbers.

- The stream is kept as :class:`BlockedStream`: blocks of positions (:class:`RowBlock`), each with only the components
  its positions can carry (a causal position carries no later token: about half the dense tensor).
- Each block's layout (which components it keeps, where a slab of components lies in it, the (position, component)
  pairs that may be non-zero, its FFN chunks) is found once on the host from the masks and kept for every layer: no
  device read decides what is computed, and index tensors go to the device without waiting for it.
- Attention mixes one slab of components at a time (:func:`attention_slabs`): its key-side vectors are gathered
  block by block (:func:`slab_key_parts`, only the carried pairs of a causal stack) and its output lands in each
  query block (:func:`slab_targets`); the values, probabilities and ``W_O`` are :mod:`.decompx`'s.
- A causal stream's FFN runs on its packed pairs (:class:`PackedComponents`, :class:`PackedChunk`) where blocks of
  positions would run ``PACK_WHEN`` times as many rows; otherwise on blocks of positions (:class:`BlockedChunk`).
- A decoder-only model's last layer is computed only from its first explained row (:func:`first_explained_row`).

Every chunk holds at most ``max_chunk_elements`` elements (:mod:`.chunking`); what the C library keeps of the freed
chunks is given back by :mod:`inseq_mixing.memory`.
"""

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from .blocks import on_device, upcast, valid_cells
from .chunking import causal_chunk_slices, chunk_slices, items_per_chunk


@dataclass
class Components:
    """A decomposed stream: ``parts`` ``(B, positions, components, D)`` and which components each position may use.

    Attributes:
        parts: The components; they sum over axis 2 to the hidden state.
        available: ``(B, positions, components)``: real tokens the position can see (for ``"equal"`` splits).
        bias_index: Index of the bias component, or None.
    """

    parts: torch.Tensor
    available: torch.Tensor
    bias_index: int | None

    def total(self) -> torch.Tensor:
        """Each position's vector ``(B, P, ·)``: the sum of its components."""
        return self.parts.sum(2)

    def like(self, parts: torch.Tensor, positions: slice = slice(None)) -> "Components":
        return Components(parts, self.available[:, positions], self.bias_index)

    def per_part(self, rows: torch.Tensor) -> torch.Tensor:
        """A per-position tensor ``(B, P, ·)`` laid out against the parts (broadcast over components)."""
        return rows[:, :, None]

    def position_sums(self, weights: torch.Tensor) -> torch.Tensor:
        """Per-part weights ``(B, P, K)`` summed over each position's components, laid out against the parts."""
        return weights.sum(-1, keepdim=True)

    def position_totals(self, weights: torch.Tensor) -> torch.Tensor:
        """Per-part weights ``(B, P, K)`` summed over each position's components: ``(B, P)``."""
        return weights.sum(-1)

    def dot(self, rows: torch.Tensor) -> torch.Tensor:
        """Each part dotted with its position's vector of ``rows`` ``(B, P, D)``: ``(B, P, K)``."""
        return torch.einsum("bpkd,bpd->bpk", self.parts, rows)

    def add_to_bias_component(self, parts: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``parts`` with each position's vector of ``rows`` added to its bias component (in place)."""
        parts[:, :, self.bias_index] += rows
        return parts

    @property
    def num_positions(self) -> int:
        return self.parts.shape[1]


@dataclass
class PackedComponents(Components):
    """The (position, component) pairs of a causal stream that may be non-zero, packed on one axis: ``parts``
    ``(B, N, D)``, ``available`` ``(B, N)``, ``position[n]`` the (chunk-local) position of pair ``n``, and the pairs
    that hold the bias component. Per-position steps (totals, shares of a bias) are segment sums over ``position``; the
    linear maps run on the N pairs alone, where a block of positions would carry every component its last position
    sees (about twice the pairs of the causal half)."""

    position: torch.Tensor | None = None
    positions: int = 0
    bias_pairs: torch.Tensor | None = None

    def total(self) -> torch.Tensor:
        shape = (self.parts.shape[0], self.positions, *self.parts.shape[2:])
        return self.parts.new_zeros(shape).index_add_(1, self.position, self.parts)

    def like(self, parts: torch.Tensor, positions: slice = slice(None)) -> "PackedComponents":
        return dataclasses.replace(self, parts=parts)

    def per_part(self, rows: torch.Tensor) -> torch.Tensor:
        return rows.index_select(1, self.position)

    def position_sums(self, weights: torch.Tensor) -> torch.Tensor:
        return self.position_totals(weights).index_select(1, self.position)

    def position_totals(self, weights: torch.Tensor) -> torch.Tensor:
        return weights.new_zeros(weights.shape[0], self.positions).index_add_(1, self.position, weights)

    def dot(self, rows: torch.Tensor) -> torch.Tensor:
        return (self.parts * self.per_part(rows)).sum(-1)

    def add_to_bias_component(self, parts: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        parts[:, self.bias_pairs] += rows.index_select(1, self.position.index_select(0, self.bias_pairs))
        return parts

    @property
    def num_positions(self) -> int:
        return self.positions


class CarriedPairs(NamedTuple):
    """The (block row, component) pairs where a block's components of one slab may be non-zero (device tensors, found
    once): ``rows``, and for each pair the index into the slab's components kept in the block (``column``), into the
    slab (``kept``) and into the block's components (``local``)."""

    rows: torch.Tensor
    column: torch.Tensor
    kept: torch.Tensor
    local: torch.Tensor


@dataclass
class RowBlock:
    """Positions ``rows`` of a decomposed stream, with only the components they can carry.

    The block's layout (which components it keeps, where a slab of components lies in it, its carried pairs, its FFN
    packing) is found on the host from ``seen`` and kept for every layer: the method never reads the device to decide
    what to compute, and the index tensors are copied to the device without waiting for it.

    Attributes:
        rows: The positions.
        cols: ``(K_r,)`` sorted indices (in the stack's component layout) of the components kept, on the stream's
            device; every other component is exactly 0 at these positions (causally unreachable or padding).
        stream: The kept components ``(B, |rows|, K_r, D)``.
        host_cols: ``cols`` on the host.
        seen: ``(|rows|, K_r)`` host booleans: the kept components each position may carry (a token some sentence's
            position sees, and the bias component); the others are exactly 0 there in every sentence.
    """

    rows: slice
    cols: torch.Tensor
    stream: Components
    host_cols: np.ndarray
    seen: np.ndarray
    #: What is found once and read at every layer: slab placements, packed pairs of attention slabs, the FFN's packing.
    carried: dict = dataclasses.field(default_factory=dict, repr=False)

    def local(self, indices: np.ndarray, key: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """For component ``indices`` of the stack layout (named ``key``: the same at every layer): where in ``indices``
        those kept here are, and their local positions (device tensors; found once on the host and kept)."""
        if ("local", key) not in self.carried:
            position = np.searchsorted(self.host_cols, indices).clip(max=len(self.host_cols) - 1)
            kept = np.flatnonzero(self.host_cols[position] == indices)
            device = self.cols.device
            self.carried[("local", key)] = (on_device(kept, device), on_device(position[kept], device))
            self.carried[("host local", key)] = kept, position[kept]
        return self.carried[("local", key)]

    def carried_pairs(self, key: tuple) -> CarriedPairs | None:
        """The pairs where the block's components of the slab named ``key`` (placed by :meth:`local` first) may be
        non-zero at its positions, or None where they are most of the block (a dense product is then as cheap)."""
        if ("pairs", key) not in self.carried:
            kept, local = self.carried[("host local", key)]
            seen = self.seen[:, local]
            rows, cols = np.nonzero(seen)
            dense = seen.size < PACK_WHEN * len(rows)
            device = self.cols.device
            pairs = CarriedPairs(*(on_device(index, device) for index in (rows, cols, kept[cols], local[cols])))
            self.carried[("pairs", key)] = None if dense else pairs
        return self.carried[("pairs", key)]


@dataclass
class BlockedStream:
    """A decomposed stack stream stored as blocks of positions, each with only the components it can carry.

    Position ``i`` of a causal stack carries no token after ``i``, so the blocks hold about half of the dense
    ``(B, positions, components, D)`` tensor (at 1,000 tokens and ``D = 768``, 1.5 GB instead of 3.1 GB in float32).
    Position-wise operations (norms, FFN, bias splits) run block by block; attention mixes one slab of components at
    a time (:func:`attention_sublayer`).
    """

    blocks: list[RowBlock]
    num_components: int

    def map(self, update) -> "BlockedStream":
        """Apply ``update(block) -> Components`` to every block (a position-wise operation)."""
        for block in self.blocks:
            block.stream = update(block)
        return self

    def to_dense(self) -> Components:
        """The dense :class:`Components` ``(B, positions, components, D)`` (for checks: memory grows as n²)."""
        first = self.blocks[0].stream
        batch, _, _, d_model = first.parts.shape
        positions = self.blocks[-1].rows.stop
        parts = first.parts.new_zeros(batch, positions, self.num_components, d_model)
        available = torch.zeros(batch, positions, self.num_components, dtype=torch.bool, device=parts.device)
        for block in self.blocks:
            parts[:, block.rows, block.cols] = block.stream.parts
            available[:, block.rows, block.cols] = block.stream.available
        bias_index = None if first.bias_index is None else self.num_components - 1
        return Components(parts, available, bias_index)


def position_chunks(num_positions: int, elements_per_position: int, max_chunk_elements: int) -> list[slice]:
    """Slices of positions with at most ``max_chunk_elements`` elements each (at least one position)."""
    return chunk_slices(num_positions, elements_per_position, max_chunk_elements)


def initial_stream(
    hidden: torch.Tensor, offset: int, available: torch.Tensor, host_available: torch.Tensor, bias_index,
    max_elements: int, owner: torch.Tensor | None = None, causal: bool = False,
):  # fmt: skip
    """The stack input as a :class:`BlockedStream`: position ``p`` is entirely component ``offset + p``, or with
    ``owner`` ``(B, positions)`` (on the host) component ``owner[b, p]`` (audio units: every frame of a unit starts in
    its unit's component). ``host_available`` is ``available`` on the host: the blocks' layout is found from it. A
    ``causal`` stack's blocks of positions are narrowed like any causal chunk (:func:`.chunking.causal_chunk_slices`;
    GPT-2-sized batch of 16: 2.48–2.76 s -> 2.42–2.50 s, in turn in one process; one sentence and Marian unchanged)."""
    batch, positions, d_model = hidden.shape
    num_components = available.shape[-1]
    device = hidden.device
    blocks = []
    per_position = batch * num_components * d_model
    # causal: narrow blocks on the CPU, each carrying fewer components its rows cannot see
    chunks = causal_chunk_slices(positions, per_position, max_elements, device_type=device.type, causal=causal)
    for rows in chunks:
        seen = host_available[:, rows].numpy().any(0)  # (|rows|, K): the tokens some sentence's position sees
        if bias_index is not None:
            seen[:, bias_index] = True
        host_cols = np.union1d(np.flatnonzero(seen.any(0)), _own(rows, offset, owner))  # sorted
        local_bias = None if bias_index is None else int(np.searchsorted(host_cols, bias_index))
        cols = on_device(host_cols, device)
        parts = hidden.new_zeros(batch, rows.stop - rows.start, len(host_cols), d_model, dtype=upcast(hidden).dtype)
        stream = Components(parts, available[:, rows][:, :, cols], local_bias)
        blocks.append(RowBlock(rows, cols, stream, host_cols, seen[:, host_cols]))
    return add_to_own(BlockedStream(blocks, num_components), hidden, offset, owner)


def _own(rows: slice, offset: int, owner: torch.Tensor | None) -> np.ndarray:
    """The component each of the positions ``rows`` starts in (see :func:`initial_stream`), on the host."""
    return np.arange(rows.start, rows.stop) + offset if owner is None else owner[:, rows].numpy()


def add_to_own(stream: BlockedStream, hidden: torch.Tensor, offset: int, owner: torch.Tensor | None = None
               ) -> BlockedStream:  # fmt: skip
    """Add ``hidden`` ``(B, positions, D)`` to each position's own component, where :func:`initial_stream` put the
    stack's input (``offset``, ``owner`` as there): the stack's input, or a vector the stack adds between its blocks
    (:class:`~inseq_mixing.specs.base.InjectedInputs`). In place; returns ``stream``."""
    batch = hidden.shape[0]
    for block in stream.blocks:
        rows, parts = block.rows, block.stream.parts
        count = rows.stop - rows.start
        where = on_device(np.broadcast_to(np.searchsorted(block.host_cols, _own(rows, offset, owner)),
                                          (batch, count)), parts.device)  # fmt: skip
        every = torch.arange(batch, device=parts.device)[:, None]
        parts[every, torch.arange(count, device=parts.device), where] += upcast(hidden[:, rows]).to(parts.device)
    return stream


#: Run a causal stack's FFN on its packed (position, component) pairs (:func:`ffn_packing`) where blocks of
#: positions, each carrying every component its last position sees (:func:`blocked_chunks`), would run at least
#: ``PACK_WHEN`` times as many rows. Measured on a 2-core CPU (GPT-2-small-sized, 20 tokens, interleaved calls):
#: packed 20% faster at batch 1 (blocks: one block, the whole square), 0-8% at batch 16 (blocks of 3 positions, 17%
#: more rows); on an opus-mt-sized Marian at batch 16 (blocks carry the 20 source components anyway: few extra rows)
#: within noise.
PACK_CAUSAL_FFN = True
PACK_WHEN = 1.1


@dataclass
class PackedChunk:
    """Whole positions of a causal block whose (position, component) pairs that may be non-zero run through the FFN
    packed on one axis (device index tensors: ``rows``, ``cols`` of each pair, its chunk-local ``position``, the
    pairs that hold the bias component)."""

    rows: torch.Tensor
    cols: torch.Tensor
    position: torch.Tensor
    positions: int
    bias_pairs: torch.Tensor | None

    def run(self, step: Callable[[Components], torch.Tensor], inputs: Components, into: torch.Tensor) -> None:
        """Add ``step``'s output components of these pairs (the FFN's) to ``into`` ``(B, P, K, D)``."""
        packed = PackedComponents(
            inputs.parts[:, self.rows, self.cols],
            inputs.available[:, self.rows, self.cols],
            inputs.bias_index,
            position=self.position,
            positions=self.positions,
            bias_pairs=self.bias_pairs,
        )
        into[:, self.rows, self.cols] += step(packed)


@dataclass
class BlockedChunk:
    """Positions ``rows`` of a block with the components they can carry (``active``, a device index tensor)."""

    rows: slice
    active: torch.Tensor
    bias_index: int | None

    def run(self, step: Callable[[Components], torch.Tensor], inputs: Components, into: torch.Tensor) -> None:
        """Add ``step``'s output components of these positions (the FFN's) to ``into`` ``(B, P, K, D)``."""
        rows, active = self.rows, self.active
        parts, available = inputs.parts[:, rows][:, :, active], inputs.available[:, rows][:, :, active]
        chunk = Components(parts, available, self.bias_index)
        into[:, rows, active] += step(chunk)


def ffn_packing(
    block: RowBlock, per_position: int, elements_per_pair: int, max_chunk_elements: int
) -> list[PackedChunk] | None:
    """The FFN chunks of a causal block (:class:`PackedChunk`), found on the host from the components its positions
    may carry (``block.seen``, position-major: a position's bias component is its last pair), whole positions and at
    most ``max_chunk_elements`` elements (or one position) each; or None where blocks of positions would run fewer
    than ``PACK_WHEN`` times the rows (:func:`blocked_chunks` then)."""
    counts = block.seen.sum(1).tolist()
    blocks = position_chunks(len(counts), per_position, max_chunk_elements)
    blocked_rows = sum((rows.stop - rows.start) * max(counts[rows]) for rows in blocks)
    if blocked_rows < PACK_WHEN * sum(counts):  # blocks of a few positions waste little: their products are faster
        return None
    pairs = np.argwhere(block.seen)
    limit = items_per_chunk(elements_per_pair, max_chunk_elements)
    spans, first, taken = [], 0, 0  # whole positions, at most `limit` pairs (or one position) each
    for position, count in enumerate(counts):
        if taken and taken + count > limit:
            spans.append((first, position))
            first, taken = position, 0
        taken += count
    spans.append((first, len(counts)))
    offsets = [0, *itertools.accumulate(counts)]
    device, has_bias = block.cols.device, block.stream.bias_index is not None
    chunks = []
    for first, end in spans:
        rows, cols = pairs[offsets[first] : offsets[end]].T
        last_pairs = np.asarray(offsets[first + 1 : end + 1]) - offsets[first] - 1
        indices = (rows, cols, rows - first)
        chunks.append(
            PackedChunk(
                *(on_device(index, device) for index in indices),
                positions=end - first,
                bias_pairs=on_device(last_pairs, device) if has_bias else None,
            )
        )
    return chunks


def blocked_chunks(block: RowBlock, per_position: int, max_chunk_elements: int) -> list[BlockedChunk]:
    """The FFN chunks of a block as blocks of positions, each with the components its positions can see (found on the
    host from ``block.seen``)."""
    chunks = []
    for rows in position_chunks(block.rows.stop - block.rows.start, per_position, max_chunk_elements):
        active = np.flatnonzero(block.seen[rows].any(0))
        bias = block.stream.bias_index
        local_bias = None if bias is None else int(np.searchsorted(active, bias))
        chunks.append(BlockedChunk(rows, on_device(active, block.cols.device), local_bias))
    return chunks


def ffn_chunks(
    block: RowBlock, width: int, inputs: Components, causal: bool, max_chunk_elements: int
) -> list[PackedChunk] | list[BlockedChunk]:
    """The FFN's chunks of a block whose inputs are ``inputs`` (FFN width ``width``): a causal stream's packed pairs
    (:func:`ffn_packing`) where that saves rows, blocks of positions otherwise (:func:`blocked_chunks`). Found once
    per block and FFN width (what can change between layers) on the host, and kept for every layer."""
    batch, _, num_components, _ = inputs.parts.shape
    per_position = batch * num_components * width
    key = ("ffn", width, causal)
    if key not in block.carried:
        packing = None
        if causal and PACK_CAUSAL_FFN and inputs.bias_index in (None, num_components - 1):
            packing = ffn_packing(block, per_position, batch * width, max_chunk_elements)
        block.carried[key] = packing or blocked_chunks(block, per_position, max_chunk_elements)
    return block.carried[key]


def available_components(query_mask, blocks: list[tuple[torch.Tensor, bool]], has_bias: bool) -> torch.Tensor:
    """``(B, Q, K)``: for each position, the real tokens of each component block it can see (causal blocks: only up
    to itself); the bias component is never part of an equal split."""
    masks = [valid_cells(query_mask.bool(), key_mask.bool(), causal) for key_mask, causal in blocks]
    if has_bias:
        masks.append(torch.zeros_like(masks[0][..., :1]))
    return torch.cat(masks, dim=-1)


def first_explained_row(spec, positions: np.ndarray | None) -> int:
    """A decoder-only model's first explained position (host copy of ``(B, T)`` positions); 0 for the others (every
    row of an encoder's or an encoder–decoder's output is shown) or without positions."""
    if positions is None or spec.is_encoder_only or spec.is_encoder_decoder or not positions.any():
        return 0
    return int(np.argmax(positions.any(0)))


# ----- attention, one slab of components at a time -----


@dataclass
class AttentionSlab:
    """One slab of key-side components of an attention and where its output goes (found on the host).

    Attributes:
        components: The slab, indices in the key side's component layout.
        key: Its name for :meth:`RowBlock.local` (the same at every layer).
        query_components: The slab in the query side's layout (a cross-attention places encoder components).
        query_key: Their name on the query side.
        key_rows: Key positions that may carry one of the slab's components (a causal stack: from the first that
            does).
        query_rows: Query positions that get an output.
        packed: Whether products are taken only on the (position, component) pairs that may be non-zero (a causal
            self-attention).
    """

    components: np.ndarray
    key: tuple
    query_components: np.ndarray
    query_key: tuple
    key_rows: slice
    query_rows: slice
    packed: bool


def attention_slabs(keys: "BlockedStream", num_queries: int, num_keys: int, width: int, causal: bool,
                    self_attention: bool, place, first_query: int):  # fmt: skip
    """The slabs of ``width`` key-side components an attention mixes one at a time, each with the positions that
    matter (``place``: a cross-attention's map of key-layout indices to the query layout; ``first_query``: the first
    query row that gets an output). A slab no key position carries is skipped."""
    for start in range(0, keys.num_components, width):
        slab = np.arange(start, min(start + width, keys.num_components))  # on the host: the layout is found there
        key, query_key = ("slab", start, len(slab)), ("slab" if place is None else "placed", start, len(slab))
        key_rows = slice(first_carrying_row(keys, slab, key) if causal else 0, num_keys)
        if key_rows.start >= num_keys:
            continue
        query_start = key_rows.start if causal and self_attention else 0
        yield AttentionSlab(slab, key, slab if place is None else place(slab), query_key, key_rows,
                            slice(max(query_start, first_query), num_queries), causal and self_attention)  # fmt: skip


def first_carrying_row(stream: "BlockedStream", slab: np.ndarray, key: tuple) -> int:
    """The first position that carries one of the components ``slab`` (named ``key``; positions before it carry
    none)."""
    for block in stream.blocks:
        _, local = block.local(slab, key)
        if len(local):
            return block.rows.start
    return stream.blocks[-1].rows.stop


def slab_key_parts(keys: "BlockedStream", slab: AttentionSlab, read, project, into: torch.Tensor) -> None:
    """Write the slab's key-side vectors into ``into`` ``(B, key positions of the slab, |slab|, ...)``, block by
    block: ``read(number, block, local)`` gives a block's components of the slab (its local indices ``local``) as the
    attention reads them, ``project(parts)`` their vectors; with ``slab.packed``, only the carried pairs are
    projected (every other row is exactly 0, so its product is too) and written where they go."""
    rows = slab.key_rows
    for number, block in enumerate(keys.blocks):
        if block.rows.stop <= rows.start:
            continue
        kept, local = block.local(slab.components, slab.key)
        if not len(local):
            continue
        target = slice(block.rows.start - rows.start, block.rows.stop - rows.start)
        pairs = block.carried_pairs(slab.key) if slab.packed else None
        parts = read(number, block, local)
        if pairs is None:
            into[:, target, kept] = project(parts)
        else:
            into[:, target.start + pairs.rows, pairs.kept] = project(parts[:, pairs.rows, pairs.column])


@dataclass
class SlabTarget:
    """Where a slab's attention output lands in one query block: read ``part[read]`` (``part``: the slab's output
    ``(B, query rows, |slab|, heads, head_dim)``), add to ``block.stream.parts[write]``; ``pair_rows``: the carried
    pairs' block rows (None: the whole block, dense)."""

    number: int
    block: RowBlock
    read: tuple
    write: tuple
    pair_rows: torch.Tensor | None


def slab_targets(stream: "BlockedStream", slab: AttentionSlab, packed: bool):
    """The query blocks a slab's output lands in (those with rows from ``slab.query_rows`` on), each as a
    :class:`SlabTarget`: only its carried pairs where ``packed`` and the block's pairs are few, else dense."""
    every = slice(None)
    for number, block in enumerate(stream.blocks):
        if block.rows.stop <= slab.query_rows.start:
            continue
        kept, local = block.local(slab.query_components, slab.query_key)
        rows = slice(block.rows.start - slab.query_rows.start, block.rows.stop - slab.query_rows.start)
        pairs = block.carried_pairs(slab.query_key) if packed else None
        if pairs is not None:  # the carried pairs alone, gathered and added where they go (distinct pairs)
            yield SlabTarget(number, block, (every, rows.start + pairs.rows, pairs.kept),
                             (every, pairs.rows, pairs.local), pairs.rows)  # fmt: skip
        else:
            yield SlabTarget(number, block, (every, rows, kept), (every, every, local), None)
