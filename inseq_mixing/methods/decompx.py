r"""DecompX (Modarressi et al., ACL 2023): every hidden state as a sum of per-input-token components, through all
layers, read out on the logit.

Paper: Ali Modarressi, Mohsen Fayyaz, Ehsan Aghazadeh, Yadollah Yaghoobzadeh, Mohammad Taher Pilehvar. "DecompX:
Explaining Transformers Decisions by Propagating Token Decomposition". ACL 2023.
https://aclanthology.org/2023.acl-long.149/

Each hidden state is kept as :math:`x_i = \sum_k x_{i \Leftarrow k}`, a ``(positions, components, d_model)`` tensor.
Every operation of a block is linear once the non-linear parts are frozen at the forward pass:

* attention: :math:`z_{i \Leftarrow k} = \sum_h \sum_j \alpha^h_{ij} (x_{j \Leftarrow k} W^h_V) W^h_O` (heads
  contracted over :math:`j` before the output projection); the residual adds its own components;
* norms: shared statistics of the whole vector, applied to each component (exact);
* FFN: first linear per component; the activation linearised per neuron at the true pre-activation :math:`z`, the
  same for every component: slope :math:`f(z)/z` (the default, "zero-origin", exact in sum) or the tangent
  :math:`f'(z)` (its intercept :math:`f(z) - z f'(z)` is then a bias); second linear per component. Gated FFNs hold
  one branch at its true value and decompose the other;
* biases (value bias, carried through :math:`W_O` since attention rows sum to 1; output bias; FFN biases; norm
  shifts; the logit bias) are split over the components of the vector they are added to, in proportion to
  :math:`|x_{\Leftarrow k} \cdot b|` (the paper's default), to :math:`\lVert x_{\Leftarrow k}\rVert`, equally over
  the tokens available at that position, or kept in one extra "bias" component.

Read-out: the final decomposed state goes through the final norm and the LM-head scaling and is projected on
:math:`U_w` (or :math:`U_w - U_{foil}`); the component scores sum to the model's logit.

Encoder–decoders (our extension of the paper, which decomposes encoder classifiers): the encoder is decomposed over
source tokens; decoder components are [source | target (| bias)], and cross-attention carries the encoder output's
components into the source block. Decoder-only models (also our extension) decompose over the whole sequence.
Norms on a sub-block's output (Gemma 2 / 3's sandwich, OLMo-2; our extension) are frozen like every other norm and act
on the branch's components before the residual sum. A final logit soft-cap :math:`c \tanh(z / c)` (Gemma 2) is not
linear: the components add up to :math:`z`, the logit before the cap, which is reported beside the capped one.
Mixtures of experts (our extension): the routing frozen at the traced pass, each chosen expert decomposed as a dense
gated FFN (:func:`decompose_mixture`). Multi-head latent attention (DeepSeek; our extension): values decompressed from
a per-token latent, its norm frozen (:class:`LatentMap`). Token mixers that are not attention (hybrids; our
extension): each component through the frozen mixer (:func:`mixer_sublayer`). A vector the stack adds to a position
between its blocks (Qwen3-VL's DeepStack features; our extension) joins that position's own component, as the stack's
input did (:func:`.decompx_plan.add_to_own`).
"""

from dataclasses import dataclass, field

import numpy as np
import torch

from ..memory import release_freed_memory
from ..specs import AttentionSpec, FFNSpec, LayerSpec, StackSpec
from ..specs.base import MixerSpec, MoESpec, linear_in_out
from ..trace import AttentionTrace, LayerTrace, MixerTrace, ModelTrace, StackTrace
from .blocks import fused_activations, host_copies, on_device, refuse_non_finite, upcast
from .chunking import items_per_chunk
from .compiled import kernel
from .decompx_plan import (  # the memory plan: how the stream is stored and cut (no effect on the numbers)
    AttentionSlab,
    BlockedStream,
    Components,
    PackedComponents,
    RowBlock,
    add_to_own,
    attention_slabs,
    available_components,
    ffn_chunks,
    first_explained_row,
    initial_stream,
    slab_key_parts,
    slab_targets,
)
from .head import FrozenHead, summed_into_first
from .mixers import frozen_mixer
from .norms import FrozenNorm, freeze_norm
from .options import (  # the choices are re-exported: the options live in .options so that listing them needs no torch
    BIAS_SPLITS,  # noqa: F401
    CONVENTIONS,  # noqa: F401
    FFN_LINEARIZATIONS,  # noqa: F401
    GATED_SPLITS,  # noqa: F401
    DecompXOptions,
)
from .readout import (
    NO_HEAD,
    masked,
    readout,
    recorded_logit,
    softcapped_logit,
    sweep_logit,
    through_readout,
)
from .units import FrameUnits


def bias_shares(
    components: Components, bias: torch.Tensor, mode: str, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Share of a bias ``(B, P, D)`` (or one ``(D,)`` for every position) that goes to each component ``(B, P, K)``
    (not for ``"separate"``); ``weights`` (``"absdot"``, ``"norm"``): the components' weights, when the caller has
    them in another way than from ``components.parts``.

    A position whose weights are all 0 (e.g. a bias orthogonal to every component) splits equally.
    """
    available = components.available.to(components.parts.dtype)
    if mode not in ("absdot", "norm"):
        weights = available
    elif weights is None and mode == "absdot":  # one vector for every position: a matrix-vector product
        weights = (components.parts @ bias if bias.dim() == 1 else components.dot(bias)).abs()
    elif weights is None:
        weights = torch.linalg.vector_norm(components.parts, dim=-1)
    return normalized_shares(weights * available, available, components.position_sums)


def normalized_shares(weights: torch.Tensor, available: torch.Tensor, position_sums=None) -> torch.Tensor:
    """Weights normalised over each position's components (the last axis; packed pairs: ``position_sums``), equal
    over the available components where they sum to 0."""
    position_sums = position_sums or (lambda values: values.sum(-1, keepdim=True))
    total = position_sums(weights)
    equal = available / position_sums(available).clamp(min=1)
    return torch.where(total > 0, weights / torch.where(total > 0, total, 1), equal)


def split_bias(
    components: Components,
    bias: torch.Tensor,
    mode: str,
    onto: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
):
    """Add ``bias`` (``(D,)`` or ``(B, P, D)``) to a decomposed vector, split over its components by ``mode``, in
    place: the parts must be fresh (a product's or a norm's output), read by nothing else.

    Args:
        components: The decomposed vector the bias is added to (its components set the shares).
        bias: The bias.
        mode: One of :data:`BIAS_SPLITS`.
        onto: Parts to add the shares to, if not ``components.parts`` (e.g. zeros, to get the shares alone).
        weights: The components' weights, where the caller has them another way (see :func:`bias_shares`).
    """
    parts = components.parts if onto is None else onto
    bias = upcast(bias).to(parts.device)
    if mode == "separate":
        rows = bias.expand(parts.shape[0], components.num_positions, -1) if bias.dim() == 1 else bias
        return components.add_to_bias_component(parts, rows)
    laid_out = bias if bias.dim() == 1 else components.per_part(bias)
    return parts.addcmul_(bias_shares(components, bias, mode, weights)[..., None], laid_out)  # one pass over the parts


def split_scalar_bias(
    scores: torch.Tensor, components: Components, bias: torch.Tensor, mode: str, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Split a per-position scalar bias ``(B, P)`` over component scores ``(B, P, K)`` (by ``|score|`` for
    ``"absdot"`` and ``"norm"``, or by the given ``weights``)."""
    if mode == "separate":
        scores = scores.clone()
        scores[..., components.bias_index] += bias
        return scores
    available = components.available.to(scores.dtype)
    if mode in ("absdot", "norm"):
        weights = (scores.abs() if weights is None else weights) * available
    else:
        weights = available
    return scores + normalized_shares(weights, available) * bias[..., None]


def linear_parts(module, components: Components, mode: str) -> Components:
    """A linear module applied to each component, its bias split over the results."""
    weight, bias = linear_in_out(module)
    weight = upcast(weight)
    parts = components.parts @ weight
    if bias is None:
        return components.like(parts)
    weights = input_side_weights(components, weight, bias, mode)
    return components.like(split_bias(components.like(parts), bias, mode, weights=weights))


def input_side_weights(
    components: Components, weight: torch.Tensor, bias: torch.Tensor, mode: str
) -> torch.Tensor | None:
    r"""The ``"absdot"`` weights of a linear map's bias over its output components :math:`x_k W`, taken on its input
    where the map widens (an FFN's first linear): :math:`|x_k W \cdot b| = |x_k \cdot W b|`, one pass over the
    narrower rows instead of the wider ones; None elsewhere (taken on the output)."""
    if mode != "absdot" or weight.shape[0] >= weight.shape[1]:
        return None
    return (components.parts @ (weight @ upcast(bias))).abs()


def activated_linear(ffn: FFNSpec, inputs: Components, options: DecompXOptions) -> torch.Tensor:
    r"""The components of a (non-gated) FFN's activation at its zero-origin slope, from those of its input:
    :math:`(x_k W + s_k b) \odot f(z) / z` with :math:`b`'s shares :math:`s_k` (``options.bias``) and the true
    pre-activation :math:`z = \sum_k x_k W + b`; the bias and the slope are applied in one pass (one fused kernel
    with ``compile``: :func:`biased_slopes`)."""
    weight, bias = linear_in_out(ffn.w_in)
    weight = upcast(weight)
    product = inputs.like(inputs.parts @ weight)
    if bias is not None and options.bias == "separate":  # the whole bias to the bias component, in place
        split_bias(product, bias, options.bias)
        bias = None
    pre, shares = product.total(), None
    if bias is not None:
        bias = upcast(bias)
        shares = bias_shares(product, bias, options.bias, input_side_weights(inputs, weight, bias, options.bias))
        pre = pre.addcmul_(product.position_totals(shares)[..., None], bias)
    slope = (ffn.activation(pre) / pre).masked_fill_(pre == 0, 0)  # f(z) / z, 0 at z = 0
    position = product.position if isinstance(product, PackedComponents) else None
    return kernel(biased_slopes)(product.parts, shares, bias, slope, position)


def biased_slopes(
    parts: torch.Tensor,
    shares: torch.Tensor | None,
    bias: torch.Tensor | None,
    slope: torch.Tensor,
    position: torch.Tensor | None,
) -> torch.Tensor:
    """``(parts + shares ⊗ bias) ⊙ slope``, in place on ``parts`` (``(B, P, K, F)``, or packed pairs ``(B, N, F)``
    at chunk positions ``position``), with ``slope`` ``(B, P, F)`` at each part's position. DecompX's hot FFN step:
    compiled with ``compile=True`` (one pass over the parts instead of three, and no per-pair copy of the slope)."""
    if shares is not None:
        parts = parts.addcmul_(shares[..., None], bias)
    return parts.mul_(slope[:, :, None] if position is None else slope.index_select(1, position))


def linear_total(module, hidden: torch.Tensor) -> torch.Tensor:
    """A linear module (bias included) applied in the scores' precision."""
    weight, bias = linear_in_out(module)
    out = hidden @ upcast(weight)
    return out if bias is None else out + upcast(bias)


def decompose_norm(
    norm, norm_input: torch.Tensor, components: Components, mode: str, in_place: bool = False
) -> Components:
    """A norm at its recorded statistics applied to each component, its shift split over them; ``in_place``: over
    the components' parts (which nothing else reads), without a new tensor."""
    frozen = freeze_norm(norm, norm_input)
    parts = frozen.linear(components.parts, in_place=in_place)
    if frozen.shift is not None:
        parts = split_bias(components.like(parts), frozen.shift, mode)
    return components.like(parts)


def attention_bias(attn: AttentionSpec, row_sums: torch.Tensor) -> torch.Tensor | None:
    r"""Output bias plus the value bias carried through :math:`W_O`, :math:`b_O + \sum_h (\sum_j \alpha^h_{ij})
    b^h_V W^h_O` for every query :math:`i`: ``(B, queries, D)``, ``(D,)`` without a value bias, or None;
    ``row_sums``: :math:`\sum_j \alpha^h_{ij}` ``(B, heads, queries)``.

    The rows of :math:`\alpha` sum to 1 only to the precision of the softmax, which transformers takes in float32 for
    most families even in a float64 model; weighting the value bias by the recorded row sums keeps the components'
    sum equal to the model's attention output.
    """
    _, value_bias = attn.value_weight()
    bias = None if attn.out_bias is None else upcast(attn.out_bias)
    if value_bias is not None:
        per_head = upcast(value_bias).reshape(attn.num_kv_heads, attn.head_dim)[attn.kv_head_of_query_head()]
        carried = torch.einsum("he,hed->hd", per_head.to(row_sums.device), upcast(attn.out_weight_per_head()))
        carried = torch.einsum("bhq,hd->bqd", row_sums, carried)  # (B, queries, D)
        bias = carried if bias is None else carried + bias.to(carried.device)
    return bias


@dataclass
class KeyNorm:
    """A key block's pre-attention norm: frozen map and the shares of its shift over the block's components; and,
    for a latent attention, the map to the latent that the values are read from (:class:`LatentMap`)."""

    frozen: object | None
    shares: torch.Tensor | None
    latent: "LatentMap | None" = None

    def apply(self, parts: torch.Tensor, local: torch.Tensor, bias_index: int | None) -> torch.Tensor:
        """The normalised components ``local`` of a block (shift shares included), taken to the latent if any."""
        normed = parts if self.frozen is None else self.frozen.linear(parts)
        shift = None if self.frozen is None else self.frozen.shift
        if shift is not None and self.shares is None:  # "separate": the whole shift goes to the bias component
            is_bias = (local == bias_index).to(normed.dtype)
            normed = normed + is_bias[:, None] * shift
        elif shift is not None:
            normed = normed.addcmul_(self.shares[:, :, local, None], shift)  # one pass, on the fresh normalised parts
        return normed if self.latent is None else self.latent.apply(normed)


@dataclass
class LatentMap:
    r"""A latent attention's map from a key's (normalised) components to its latent's: the down-projection, then the
    latent's norm at its recorded statistics, :math:`c_{j \Leftarrow k} = N_j(\hat x_{j \Leftarrow k} W_{down})`
    (linear once the norm is frozen; the latent norm is an RMSNorm, without a shift). Our extension: DecompX treats
    standard multi-head attention."""

    down: torch.Tensor
    frozen: FrozenNorm

    def apply(self, parts: torch.Tensor) -> torch.Tensor:
        return self.frozen.linear(parts @ self.down)


def key_norms(attn: AttentionSpec, record: AttentionTrace, stream: BlockedStream, mode: str) -> list[KeyNorm] | None:
    """Per block, the frozen input norm of the attention and its shift's shares (from the stream as it is before the
    attention adds to it), and a latent attention's map to the latent; None without either (post-LN, OLMo-2): the
    attention reads the stream itself."""
    if attn.in_norm is None and attn.latent is None:
        return None
    norms = []
    for block in stream.blocks:
        frozen, shares, latent = None, None, None
        if attn.in_norm is not None:
            frozen = freeze_norm(attn.in_norm, record.norm_input[:, block.rows])
        if frozen is not None and frozen.shift is not None and mode == "absdot":  # |A(x_k) · β| without A(x_k)
            weights = frozen.dot_linear(block.stream.parts, frozen.shift).abs()
            shares = bias_shares(block.stream, frozen.shift, mode, weights)
        elif frozen is not None and frozen.shift is not None and mode != "separate":
            normed = block.stream.like(frozen.linear(block.stream.parts))
            shares = bias_shares(normed, frozen.shift, mode)
        if attn.latent is not None:
            down = upcast(linear_in_out(attn.latent.down)[0])
            latent = LatentMap(down, freeze_norm(attn.latent.norm, record.latent_norm_input[:, block.rows]))
        norms.append(KeyNorm(frozen, shares, latent))
    return norms


def slab_values(attn: AttentionSpec, keys: BlockedStream, norms, slab: AttentionSlab) -> torch.Tensor:
    r"""Value vectors ``(B, key positions of the slab, |slab|, heads, head_dim)`` of the key-side components of
    ``slab``: :math:`x_{j \Leftarrow k} W^h_V` (normalised first in pre-LN blocks), 0 where a position does not carry
    one. Stored head-major, ``(B, heads, positions, |slab|, head_dim)`` under the returned view, so that mixing them
    over key positions (a product per batch row and head) reads them without a copy."""
    value_weight, _ = attn.value_weight()
    first = keys.blocks[0].stream.parts
    rows = slab.key_rows
    stored = first.new_zeros(first.shape[0], attn.num_kv_heads, rows.stop - rows.start, len(slab.components),
                             attn.head_dim)  # fmt: skip
    values = stored.permute(0, 2, 3, 1, 4)  # (B, positions, |slab|, KV heads, head_dim), written through

    def read(number: int, block, local: torch.Tensor) -> torch.Tensor:
        parts = block.stream.parts[:, :, local]
        return parts if norms is None else norms[number].apply(parts, local, block.stream.bias_index)

    def project(parts: torch.Tensor) -> torch.Tensor:
        return (parts @ upcast(value_weight)).unflatten(-1, (attn.num_kv_heads, -1))

    slab_key_parts(keys, slab, read, project, values)
    if attn.num_kv_heads != attn.num_heads:  # each query head reads its group's value head
        stored = stored[:, attn.kv_head_of_query_head().to(stored.device)]
    return stored.permute(0, 2, 3, 1, 4)


def attention_sublayer(
    attn: AttentionSpec,
    record: AttentionTrace,
    stream: BlockedStream,
    options: DecompXOptions,
    causal: bool,
    keys: BlockedStream | None = None,
    place=None,
    heads: "HeadReadout | None" = None,
    own_offset: int | None = None,
    first_row: int = 0,
) -> BlockedStream:
    r"""Residual plus attention output on a blocked stream, then the norm in post-LN blocks.

    Attention output components :math:`\sum_h \sum_j \alpha^h_{ij} (x_{j \Leftarrow k} W^h_V) W^h_O` are computed one
    slab of components at a time (heads contracted over keys before the output projection) and added to the stream in
    place: a slab only reads the key-side components it writes, so the stream is never copied. The attention bias is
    then split over the output's components (their weights are kept per slab).

    Args:
        attn: The attention's spec.
        record: Its trace.
        stream: The query-side stream (updated in place).
        options: Decomposition choices.
        causal: Causal self-attention (a slab skips the positions that cannot carry it).
        keys: The key-side stream of a cross-attention (the encoder output); None for self-attention.
        place: Maps key-layout component indices to the query layout (cross-attention).
        heads: Where to read each head's output components out along a logit direction (``per_head``), or None.
        own_offset: The authors' released code in a stack's first layer (``convention="reference"``): the value
            bias stays in each key token's own value, :math:`\alpha^h_{ij} (x_j W^h_V + b^h_V) W^h_O` going to token
            :math:`j` (component ``own_offset + j``), instead of being a bias; None otherwise.
        first_row: Only the blocks of positions from this one on get their output (a stack's last layer, whose
            earlier rows nothing reads): the earlier blocks serve as keys, then leave the stream.
    """
    mode = options.bias
    self_attention = keys is None
    keys = stream if self_attention else keys
    norms = key_norms(attn, record, keys, mode) if self_attention else None
    batch, num_queries = record.output.shape[:2]
    num_keys, device = record.values.shape[1], record.output.device
    out_weight = upcast(attn.out_weight_per_head())
    # one slab's largest tensors are (B, positions, slab width, heads, head_dim): at most max_chunk_elements
    width = items_per_chunk(batch * max(num_queries, num_keys) * out_weight.shape[-1], options.max_chunk_elements)
    if record.kept_probs is None and keys.num_components > width:  # a long trace: one slab, if it is the smaller
        one_slab = batch * max(num_queries, num_keys) * keys.num_components * out_weight.shape[-1]
        if 4 * one_slab < batch * record.heads * num_queries * num_keys:  # (a few of its tensors against the layer's
            width = keys.num_components  # probabilities, which several slabs would each read whole or compute again)
    floor = next((block.rows.start for block in stream.blocks if block.rows.stop > first_row), num_queries)
    slabs = list(attention_slabs(keys, num_queries, num_keys, width, causal, self_attention, place, floor))
    # a long trace mixed in one slab (components over units): its probabilities read a block of query rows at a time,
    # never the layer's heads × T² at once; several slabs would each compute the rows again: read whole
    probs = None if record.kept_probs is None and len(slabs) == 1 else upcast(record.probs)
    weights = [torch.zeros_like(block.stream.available, dtype=out_weight.dtype) for block in stream.blocks]
    value_bias = None
    if own_offset is not None and self_attention and attn.value_weight()[1] is not None:
        bias = None if attn.out_bias is None else upcast(attn.out_bias)
        per_kv_head = upcast(attn.value_weight()[1]).reshape(attn.num_kv_heads, attn.head_dim)
        value_bias = per_kv_head[attn.kv_head_of_query_head().to(per_kv_head.device)]  # (H, head_dim)
    out_frozen = None if attn.out_norm is None else freeze_norm(attn.out_norm, record.output)
    weighted = mode in ("absdot", "norm")
    out_matrix = out_weight.flatten(0, 1)  # (H · head_dim, D): W_O as one matrix against (heads, head_dim)
    biases = None
    for slab in slabs:
        values = slab_values(attn, keys, norms, slab)
        if value_bias is not None:  # each component's own token keeps the value bias (the first layer, 'reference')
            own = slab.components - own_offset - slab.key_rows.start
            mine = np.flatnonzero((own >= 0) & (own < values.shape[1]))
            values[:, on_device(own[mine], device), on_device(mine, device)] += value_bias
        if probs is None:  # by blocks of rows, the rows' sums gathered on the way (every row: the bias reads them)
            part, row_sums = _mixed_by_rows(record, slab, values, num_queries)
        else:
            part = torch.einsum("bhqj,bjkhe->bqkhe", probs[:, :, slab.query_rows, slab.key_rows], values)
            row_sums = probs.sum(-1) if biases is None else None
        if biases is None:  # from the first slab on (every slab reads the same rows' sums)
            if value_bias is None:
                bias = attention_bias(attn, row_sums)
            biases = [branch_bias(bias, out_frozen, block.rows) for block in stream.blocks]
        if heads is not None:
            heads.read(part, out_weight, slab.query_rows, on_device(slab.query_components, device))
        del values
        for target in slab_targets(stream, slab, packed=slab.packed and out_frozen is None):
            contribution = part[target.read].flatten(-2) @ out_matrix
            if out_frozen is not None:  # the norm on the attention output, frozen, acts on every component
                contribution = out_frozen.linear(contribution, target.block.rows)
            target.block.stream.parts[target.write] += contribution
            block_bias = biases[target.number]
            if block_bias is not None and weighted and options.convention == "paper":  # over the attention output
                if target.pair_rows is not None and block_bias.dim() > 1:
                    block_bias = block_bias[:, target.pair_rows]
                weights[target.number][target.write] = bias_weights(contribution, block_bias, mode)
        del part
        release_freed_memory()  # the heap's holes from this slab (see ..memory)
    if biases is None:  # no slab carried anything (so the probabilities were read whole): the bias alone
        bias = attention_bias(attn, probs.sum(-1)) if value_bias is None else bias
        biases = [branch_bias(bias, out_frozen, block.rows) for block in stream.blocks]
    if first_row:  # every key is read: the blocks before the first kept row leave the stream
        kept = [index for index, block in enumerate(stream.blocks) if block.rows.stop > first_row]
        stream.blocks = [stream.blocks[index] for index in kept]
        weights, biases = [weights[index] for index in kept], [biases[index] for index in kept]
    for block, weight, block_bias in zip(stream.blocks, weights, biases, strict=True):
        if block_bias is None:
            continue
        if weighted and options.convention == "reference":  # over the residual stream plus the attention output
            weight = bias_weights(block.stream.parts, block_bias, mode)
        block.stream = add_split_bias(block.stream, block_bias, weight, mode)
    if attn.post_norm is None:
        return stream
    return stream.map(
        lambda block: decompose_norm(attn.post_norm, record.norm_input[:, block.rows], block.stream, mode, True)
    )


def mixer_sublayer(mixer: MixerSpec, record: MixerTrace, stream: BlockedStream, options: DecompXOptions,
                   first_row: int = 0, embedded: torch.Tensor | None = None) -> BlockedStream:  # fmt: skip
    """Residual plus a token mixer's output that is not attention, on a blocked stream (our extension): the stream
    read densely ``(B, T, K, D)``, through the branch's frozen norm (its shift split), each component through the
    frozen mixer (:meth:`.mixers.FrozenMixer.component_outputs`), the biases' paths (the mixer's output minus the
    components' sum) split over the output's components, through a norm on the mixer's output where there is one,
    added to each block in place. ``embedded``: the components of the stack's input ``(B, T, K, D)``, for a mixer
    that reads the embeddings too (:class:`~..specs.base.SharedAttention`)."""
    if mixer.post_norm is not None:
        raise ValueError("DecompX reads a token mixer in a pre-norm block only.")
    mode = options.bias
    dense = stream.to_dense()
    normed = dense if mixer.in_norm is None else decompose_norm(mixer.in_norm, record.norm_input, dense, mode)
    frozen = frozen_mixer(mixer, record)
    if mixer.reads_embeddings:
        parts = frozen.component_outputs(normed.parts, embedded)
    else:
        parts = frozen.component_outputs(normed.parts)
    branch = dense.like(parts)
    rest = upcast(record.output) - parts.sum(2)
    weights = bias_weights(parts, rest, mode) if mode in ("absdot", "norm") else None
    branch = add_split_bias(branch, rest, weights, mode)
    if mixer.out_norm is not None:  # on the branch alone (Granite 4's residual multiplier), its statistics frozen
        branch = decompose_norm(mixer.out_norm, record.output, branch, mode, True)
    for block in stream.blocks:
        block.stream.parts += branch.parts[:, block.rows][:, :, block.cols]
    if first_row:  # the blocks before the first kept row leave the stream
        stream.blocks = [block for block in stream.blocks if block.rows.stop > first_row]
    return stream


@dataclass
class HeadReadout:
    """Each head's attention-output components at every position, read out along the logit direction on the
    sub-block's branch (``per_head``).

    Attributes:
        direction: ``(B, Q, D)``: the direction :math:`g` on the branch output (through a frozen norm on the
            attention output, if any), from :func:`.readout.sweep_logit`.
        scores: ``(B, H, Q, K)``, filled in: head ``h``'s components of query ``q`` for component ``k`` (query layout)
            dotted with ``direction``.
    """

    direction: torch.Tensor
    scores: torch.Tensor

    def read(self, part: torch.Tensor, out_weight: torch.Tensor, rows: slice, components: torch.Tensor) -> None:
        """Read one slab: ``part`` ``(B, q, slab, H, head_dim)`` of the query ``rows``."""
        read = torch.einsum("bqkhe,hed,bqd->bhqk", part, out_weight, self.direction[:, rows])
        self.scores[:, :, rows, components] = read


def _mixed_by_rows(record: AttentionTrace, slab: AttentionSlab, values: torch.Tensor,
                   num_queries: int) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """A slab's attention output ``(B, slab query rows, |slab|, heads, head_dim)`` from a long trace's probabilities
    read a block of query rows at a time (:meth:`~inseq_mixing.trace.AttentionTrace.row_blocks`), and every row's
    sum ``(B, heads, queries)`` gathered on the way."""
    rows, keys = slab.query_rows, slab.key_rows
    part = values.new_empty(values.shape[0], rows.stop - rows.start, *values.shape[2:])
    row_sums = None
    for queries, block in record.row_blocks():
        block = upcast(block)
        if row_sums is None:
            row_sums = block.new_empty(block.shape[0], block.shape[1], num_queries)
        row_sums[:, :, queries] = block.sum(-1)
        start, stop = max(queries.start, rows.start), min(queries.stop, rows.stop)
        if start < stop:
            read = block[:, :, start - queries.start : stop - queries.start, keys]
            part[:, start - rows.start : stop - rows.start] = torch.einsum("bhqj,bjkhe->bqkhe", read, values)
        del block
    return part, row_sums


def branch_bias(bias: torch.Tensor | None, out_frozen: FrozenNorm | None, rows: slice) -> torch.Tensor | None:
    """The attention bias (``(D,)`` or one per query ``(B, queries, D)``) of the query positions ``rows`` as it
    reaches the residual stream: unchanged, or through a frozen norm on the attention output plus that norm's shift,
    one vector per position ``(B, |rows|, D)``."""
    if bias is not None and bias.dim() == 3:
        bias = bias[:, rows]
    if out_frozen is None:
        return bias
    if bias is None and out_frozen.shift is None:
        return None
    batch, positions = out_frozen.inv_scale.shape[0], rows.stop - rows.start
    total = 0 if bias is None else out_frozen.linear(upcast(bias).expand(batch, positions, -1), rows)
    return total + (0 if out_frozen.shift is None else out_frozen.shift)


def bias_weights(components: torch.Tensor, bias: torch.Tensor, mode: str) -> torch.Tensor:
    """``(B, P, K)`` weights of the components' shares of a bias: ``|x_k · b|`` (``"absdot"``) or ``‖x_k‖``
    (``"norm"``)."""
    if mode == "absdot":
        return dot_with_bias(components, bias).abs()
    return torch.linalg.vector_norm(components, dim=-1)


def dot_with_bias(components: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``(B, P, K)`` dot products of components with a bias ``(D,)`` or one bias per position ``(B, P, D)``."""
    bias = bias.to(components.device)
    if bias.dim() == 1:  # components (B, P, K, D) or packed pairs (B, N, D)
        return components @ bias
    if bias.dim() == components.dim():  # packed pairs (B, N, D), each with its position's bias
        return torch.linalg.vecdot(components, bias)
    return torch.einsum("bpkd,bpd->bpk", components, bias)


def add_split_bias(stream: Components, bias: torch.Tensor, weights: torch.Tensor, mode: str) -> Components:
    """Add ``bias`` (``(D,)``, or one per position ``(B, P, D)``) to the components, split by ``weights``
    ``(B, P, K)`` (``"absdot"``/``"norm"``), equally over the available tokens (``"equal"``), or into the bias
    component (``"separate"``)."""
    bias = bias.to(stream.parts.device)
    if mode == "separate":
        stream.parts[:, :, stream.bias_index] += bias
        return stream
    if bias.dim() == 3:
        bias = bias[:, :, None]
    shares = bias_shares(stream, bias, mode, weights)
    return stream.like(stream.parts.addcmul_(shares[..., None], bias))  # bias (D,) or (B, P, 1, D); in place


def linearized_activation(activation, branch: Components, options: DecompXOptions) -> torch.Tensor:
    """Components of ``activation(z)`` from components of ``z``, the activation linearised at the true ``z`` (a gated
    FFN's gate, or the tangent; a non-gated FFN's zero-origin slope: :func:`activated_linear`)."""
    pre = branch.total()
    if options.ffn_linearization == "zero_origin":
        return branch.parts * branch.per_part((activation(pre) / pre).masked_fill_(pre == 0, 0))  # f(z) / z
    with torch.enable_grad():
        point = pre.detach().requires_grad_(True)
        value = activation(point)
        (slope,) = torch.autograd.grad(value.sum(), point)
    hidden = branch.parts * branch.per_part(slope)
    return split_bias(branch.like(hidden), value.detach() - slope * pre, options.bias)


def decompose_ffn(ffn: FFNSpec, inputs: Components, options: DecompXOptions) -> torch.Tensor:
    """FFN output components ``(B, P, K, D)`` for components of its (normalised) input."""
    if not options.include_ffn:  # the FFN's real output, split like a bias over its input's components
        output = upcast(ffn.forward(inputs.total().to(ffn.dtype)))
        return split_bias(inputs, output, options.bias, onto=torch.zeros_like(inputs.parts))
    if not ffn.is_gated and options.ffn_linearization == "zero_origin":
        return linear_parts(ffn.w_out, inputs.like(activated_linear(ffn, inputs, options)), options.bias).parts
    linear = linear_parts(ffn.w_in, inputs, options.bias)
    if not ffn.is_gated:
        hidden = linearized_activation(ffn.activation, linear, options)
    elif options.gated_split == "linear":
        gate = ffn.activation(linear_total(ffn.w_gate, inputs.total()))
        hidden = linear_branch_parts(ffn, linear, options) * linear.per_part(gate)
    else:
        gate = linear_parts(ffn.w_gate, inputs, options.bias)
        held = ffn.linear_branch(linear.total())
        hidden = linearized_activation(ffn.activation, gate, options) * linear.per_part(held)
    return linear_parts(ffn.w_out, linear.like(hidden), options.bias).parts


def linear_branch_parts(ffn: FFNSpec, linear: Components, options: DecompXOptions) -> torch.Tensor:
    """Components of a gated FFN's linear branch: ``x W_in`` as decomposed, through the branch's own map (linearised
    as an activation) and plus its offset (split like a bias) where the FFN has them (GPT-OSS's ``clamp(·) + 1``)."""
    parts = linear.parts
    if ffn.linear_activation is not None:
        parts = linearized_activation(ffn.linear_activation, linear, options)
    if ffn.linear_offset:
        offset = parts.new_full(parts.shape[-1:], ffn.linear_offset)
        parts = split_bias(linear.like(parts), offset, options.bias)
    return parts


def mixture_weights(
    moe: MoESpec, routing: tuple[torch.Tensor, torch.Tensor], norm_input: torch.Tensor
) -> torch.Tensor:
    r"""Each position's weight on each expert ``(B, P, E + 1)`` at the traced pass: the router's recorded weights on
    its selected experts, 0 elsewhere, and the shared expert's last (its sigmoid gate :math:`\sigma(x w_s)` on the
    block's recorded input where it has one, else 1)."""
    weights, experts = routing
    mix = upcast(weights).new_zeros(*weights.shape[:-1], moe.num_experts + 1)
    mix.scatter_(-1, experts.to(mix.device), upcast(weights))
    if moe.shared_gate is None:
        mix[..., -1] = 1.0
    else:
        hidden = norm_input if moe.in_norm is None else moe.in_norm(norm_input)
        mix[..., -1] = upcast(torch.sigmoid(moe.shared_gate(hidden)))[..., 0]
    return mix


def decompose_mixture(moe: MoESpec, inputs: Components, mix: torch.Tensor, options: DecompXOptions) -> torch.Tensor:
    r"""A mixture of experts' output components ``(B, P, K, D)`` for components of its input, the routing frozen at
    the traced pass (``mix``, :func:`mixture_weights`): :math:`\sum_e g_e\, \mathrm{FFN}_e(x_{\Leftarrow k})` over
    the experts each position was routed to (each expert decomposed as a dense gated FFN, on its positions only), plus
    the shared expert's components times its gate. The positions of each expert are found on the host (one copy of
    the routing per chunk, as the model's own forward makes). Our extension: DecompX treats dense FFNs."""
    parts, available = inputs.parts.flatten(0, 1), inputs.available.flatten(0, 1)
    routed = mix[..., :-1].flatten(0, 1)
    out = parts.new_zeros(*parts.shape[:-1], parts.shape[-1])
    rows, experts = routed.nonzero(as_tuple=True)
    counts = torch.bincount(experts, minlength=moe.num_experts).tolist()
    for expert, expert_rows in enumerate(rows[experts.argsort(stable=True)].split(counts)):
        if not counts[expert]:
            continue
        chosen = Components(parts.index_select(0, expert_rows)[None], available.index_select(0, expert_rows)[None],
                            inputs.bias_index)  # fmt: skip
        expert_parts = decompose_ffn(moe.expert(expert), chosen, options)[0]
        out.index_add_(0, expert_rows, expert_parts * routed[expert_rows, expert][:, None, None])
    out = out.unflatten(0, inputs.parts.shape[:2])
    if moe.shared is not None:
        out += decompose_ffn(moe.shared, inputs, options) * mix[..., -1:, None]
    return out


def decompose_ffn_block(
    ffn: FFNSpec | MoESpec,
    norm_input: torch.Tensor,
    block: RowBlock,
    options: DecompXOptions,
    source: Components | None = None,
    out_norm_input: torch.Tensor | None = None,
    causal: bool = False,
    routing: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Components:
    """The FFN sub-block on a block of positions: norm (pre-LN), FFN chunked over positions (a causal stream's
    (position, component) pairs packed, :func:`ffn_packing`), output norm (if any), residual, norm (post-LN). The
    residual sum is taken in place: the block's parts are updated (callers keep no other reference to them).
    ``norm_input`` is the recorded input of the FFN's norm at these positions, and ``out_norm_input`` that of its
    output norm. ``source``: what a parallel FFN reads (the block input's components), when it is not the block's
    stream. The chunks (and their packing) are found once per block on the host and kept for every layer (the
    components each position carries are the same at every layer). ``routing``: a mixture of experts' recorded
    routing at these positions (its chunks are blocks of positions, never packed pairs; without ``include_ffn`` the
    mixture's real output is split like a dense FFN's)."""
    mode = options.bias
    stream = block.stream
    source = stream if source is None else source
    inputs = source if ffn.in_norm is None else decompose_norm(ffn.in_norm, norm_input, source, mode)
    width = ffn.hidden_width(inputs.parts.shape[-1])
    mix = None if routing is None or not options.include_ffn else mixture_weights(ffn, routing, norm_input)
    chunks = ffn_chunks(block, width, inputs, causal and mix is None, options.max_chunk_elements)
    # the FFN's components go straight onto the residual stream's (each chunk of positions reads its inputs first)
    into = stream.parts if ffn.out_norm is None else torch.zeros_like(inputs.parts)
    for chunk in chunks:
        if mix is None:
            chunk.run(lambda part: decompose_ffn(ffn, part, options), inputs, into)
        else:
            chunk.run(lambda part, rows=chunk.rows: decompose_mixture(ffn, part, mix[:, rows], options), inputs, into)
        release_freed_memory()  # the heap's holes from this chunk (see ..memory)
    if ffn.out_norm is not None:
        output = decompose_norm(ffn.out_norm, out_norm_input, inputs.like(into), mode, in_place=True).parts
        stream = stream.like(stream.parts + output)
    del inputs
    return stream if ffn.post_norm is None else decompose_norm(ffn.post_norm, norm_input, stream, mode, True)


def decompose_layer(
    layer: LayerSpec,
    record: LayerTrace,
    stream: BlockedStream,
    options: DecompXOptions,
    causal: bool,
    encoder: BlockedStream | None = None,
    place=None,
    heads: dict[str, HeadReadout] | None = None,
    own_offset: int | None = None,
    first_row: int = 0,
    embedded: torch.Tensor | None = None,
) -> BlockedStream:
    """One block on a decomposed stream (updated in place).

    Args:
        layer: The block's spec.
        record: Its trace.
        stream: Components of the block input.
        options: Decomposition choices.
        causal: Whether self-attention is causal.
        encoder: Components of the encoder output (decoder blocks of encoder–decoders).
        place: Maps encoder component indices to the decoder layout.
        heads: Per-head read-outs of the ``"self"`` and ``"cross"`` attention (``per_head``), or None.
        own_offset: See :func:`attention_sublayer` (a stack's first layer, ``convention="reference"``).
        first_row: Rows before it are read by nothing after this layer (a stack's last layer): they leave the stream
            once they have served as keys (see :func:`attention_sublayer`).
        embedded: Components of the stack's input, for a mixer that reads the embeddings (see
            :func:`mixer_sublayer`).
    """
    heads = heads or {}
    parallel = layer.ffn.parallel  # a parallel FFN reads the block input
    block_input = {block.rows.start: block.stream.like(block.stream.parts.clone()) for block in stream.blocks
                   if parallel and block.rows.stop > first_row}  # fmt: skip
    self_heads = heads.get("self")
    if isinstance(layer.self_attn, MixerSpec):
        if self_heads is not None:
            raise ValueError(f"per_head=True reads attention heads; this layer mixes its tokens with a "
                             f"{layer.self_attn.kind} layer.")  # fmt: skip
        stream = mixer_sublayer(layer.self_attn, record.self_attn, stream, options, first_row, embedded)
    else:
        stream = attention_sublayer(layer.self_attn, record.self_attn, stream, options, causal, None, None,
                                    self_heads, own_offset, first_row)  # fmt: skip
    if layer.cross_attn is not None:
        cross = heads.get("cross")
        stream = attention_sublayer(layer.cross_attn, record.cross_attn, stream, options, False, encoder, place, cross)
    out_norm_input = record.ffn_out_norm_input
    for block in stream.blocks:
        norm_input = record.ffn_norm_input[:, block.rows]
        out_input = None if out_norm_input is None else out_norm_input[:, block.rows]
        source = block_input.pop(block.rows.start, None)
        routing = None if record.ffn_routing is None else tuple(part[:, block.rows] for part in record.ffn_routing)
        block.stream = decompose_ffn_block(layer.ffn, norm_input, block, options, source, out_input, causal, routing)
    return stream


def decompose_stack(
    stack_spec: StackSpec,
    stack: StackTrace,
    stream: BlockedStream,
    options: DecompXOptions,
    encoder: BlockedStream | None = None,
    place_encoder=None,
    keep_layers: bool = False,
    heads: list[dict[str, HeadReadout]] | None = None,
    offset: int = 0,
    first_row: int = 0,
    owner: torch.Tensor | None = None,
) -> tuple[BlockedStream, list[Components]]:
    """Every block of a stack, then its final norm; returns the output and (if asked) each block's output, dense.
    ``heads``: per layer, the per-head read-outs of its attention sub-blocks (``per_head``); ``offset``: the
    component of the stack's first token, ``owner`` its units' (see :func:`initial_stream`); ``first_row``: the output
    is read from this position on only, so the last layer's queries, FFN and the final norm skip the blocks before it
    (which leave the stream). A vector the stack adds after a block (:class:`~inseq_mixing.specs.base.InjectedInputs`)
    joins its position's own component, as the stack's input did."""
    layers = []
    heads = heads or [None] * len(stack_spec.layers)
    last = len(stack_spec.layers) - 1
    reads_embeddings = any(getattr(layer.self_attn, "reads_embeddings", False) for layer in stack_spec.layers)
    embedded = stream.to_dense().parts.clone() if reads_embeddings else None  # the stack's input's components
    for index, (layer, record, layer_heads) in enumerate(zip(stack_spec.layers, stack.layers, heads, strict=True)):
        own = offset if index == 0 and options.convention == "reference" else None
        stream = decompose_layer(layer, record, stream, options, stack.causal, encoder, place_encoder, layer_heads,
                                 own, first_row if index == last and not keep_layers else 0, embedded)  # fmt: skip
        if record.injected is not None:
            add_to_own(stream, record.injected, offset, owner)
        if keep_layers:
            layers.append(stream.to_dense())
    if stack_spec.final_norm is not None:  # on the stream's own parts (read by nothing else from here)
        norm, norm_input = stack_spec.final_norm, stack.final_norm_input
        for block in stream.blocks:
            block.stream = decompose_norm(norm, norm_input[:, block.rows], block.stream, options.bias, in_place=True)
    return stream, layers


def logit_vector_weights(spec, stream: BlockedStream, mode: str) -> torch.Tensor | None:
    r"""The released code's weights for the logit bias, ``(B, T, K)``: each component's whole logit vector
    :math:`\ell_k = s\, W x_k` (unembedding :math:`W`, read-out projection included) dotted with the logit bias
    vector, :math:`|\ell_k \cdot b|` (``"absdot"``), or its norm :math:`\lVert \ell_k \rVert` (``"norm"``, through
    the Gram matrix :math:`W^\top W`); None without a logit bias."""
    vectors = [v.reshape(-1) for v in (getattr(spec.lm_head, "bias", None), spec.logits_bias) if v is not None]
    if not vectors:
        return None
    unembedding = upcast(spec.lm_head.weight)  # (V, E)
    first = stream.blocks[0].stream.parts
    weights = first.new_zeros(first.shape[0], stream.blocks[-1].rows.stop, stream.num_components)
    if mode == "absdot":
        bias_direction = through_readout(spec, upcast(sum(vectors)).to(unembedding.device) @ unembedding)
        bias_direction = bias_direction * spec.logits_scale  # (D,)
        for block in stream.blocks:
            weights[:, block.rows, block.cols] = torch.einsum("btkd,d->btk", block.stream.parts, bias_direction).abs()
        return weights
    unembedding = through_readout(spec, unembedding) * spec.logits_scale  # (V, D)
    gram = unembedding.T @ unembedding
    for block in stream.blocks:
        parts = block.stream.parts
        squared = torch.einsum("btkd,de,btke->btk", parts, gram, parts)
        weights[:, block.rows, block.cols] = squared.clamp(min=0).sqrt()
    return weights


def through_head(stream: BlockedStream, trace: ModelTrace, ids: torch.Tensor, foil_ids, options: DecompXOptions):
    r"""An encoder head applied to the components of the final hidden state, as the paper does for the pooler: each
    linear map per component with its bias split over them (``options.bias``), each norm at its recorded statistics
    with its shift split, each activation at its slope :math:`f(z)/z` at the true pre-activation (the same for every
    component); the output row of the explained label or token then gives the scores (the paper treats BERT's pooler
    and classifier; the other heads, and masked-LM heads, are our extension).

    Returns:
        Scores ``(B, P, K)``, the last linear map's bias of the explained output ``(B, P)`` (split like the logit
        bias by the caller), and the weights of that split (``convention="reference"``: each component's whole output
        vector dotted with that bias, as the released code does; else None: by the scores).
    """
    frozen = FrozenHead(trace.spec.head, trace.final_hidden)
    out_weight = upcast(frozen.head.out_proj.weight)
    out_bias = getattr(frozen.head.out_proj, "bias", None)
    rows = out_weight[ids] - (0 if foil_ids is None else out_weight[foil_ids])  # (B, P, D)
    first = stream.blocks[0].stream.parts
    scores = first.new_zeros(first.shape[0], ids.shape[1], stream.num_components)
    reference = options.convention == "reference" and options.bias == "absdot" and out_bias is not None
    weights = torch.zeros_like(scores) if reference else None
    bias_direction = upcast(out_bias) @ out_weight if reference else None  # |ℓ_k · b| = |x_k · (b W)|, ℓ_k = W x_k
    for block in stream.blocks:
        parts = block.stream
        for kind, step in frozen.frozen:
            if kind == "linear":
                parts = linear_parts(step, parts, options.bias)
            elif kind == "norm":
                normed = step.linear(parts.parts, block.rows)
                shifted = normed if step.shift is None else split_bias(parts.like(normed), step.shift, options.bias)
                parts = parts.like(shifted)
            else:
                parts = parts.like(parts.parts * step[:, block.rows, None, :])
        scores[:, block.rows, block.cols] = torch.einsum("bpkd,bpd->bpk", parts.parts, rows[:, block.rows])
        if reference:  # the bias dotted with each component's whole output vector
            weights[:, block.rows, block.cols] = torch.einsum("bpkd,d->bpk", parts.parts, bias_direction).abs()
    bias = torch.zeros(ids.shape, dtype=scores.dtype, device=scores.device)
    if out_bias is not None:
        bias = upcast(out_bias)[ids] - (0 if foil_ids is None else upcast(out_bias)[foil_ids])
    return scores, bias, weights


def read_out(stream: BlockedStream, direction: torch.Tensor) -> torch.Tensor:
    """Scores ``(B, T, K)``: every component projected on the direction ``(B, T, D)`` of its position."""
    first = stream.blocks[0].stream.parts
    scores = first.new_zeros(first.shape[0], direction.shape[1], stream.num_components)
    for block in stream.blocks:
        scores[:, block.rows, block.cols] = torch.einsum("btkd,btd->btk", block.stream.parts, direction[:, block.rows])
    return scores


@dataclass
class DecompXScores:
    """Signed logit contributions for the token predicted at every decoder position.

    Attributes:
        target: ``(B, T, T)``: contribution of target-prefix token ``j`` (decoder-only: any token) at position
            ``t``; exactly 0 for ``j > t`` and padding.
        source: ``(B, T, S)``: contribution of source token ``s`` (encoder–decoders).
        bias: ``(B, T)``: the bias component (``bias="separate"``), else None.
        logit: The model's own logit (minus the foil's), ``(B, T)``; before the final soft-cap for models that have
            one (the contributions add up to it).
        logit_after_softcap: For models with a final soft-cap, the model's final logit (minus the foil's).
        layers: With ``keep_layers``: components of each block's output, ``{"encoder": [...], "decoder": [...]}``.
        target_heads: With ``per_head``: ``(B, L, H, T, T)``, each decoder self-attention head's output components
            read out along the logit direction on its branch (its direct contribution; our extension).
        source_heads: With ``per_head`` (encoder–decoders): ``(B, 2, L, H, T, S)``, the same for source components,
            through the self-attention (index 0) and cross-attention (index 1) heads.
    """

    target: torch.Tensor
    source: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    logit: torch.Tensor | None = None
    logit_after_softcap: torch.Tensor | None = None
    layers: dict[str, list[Components]] = field(default_factory=dict)
    target_heads: torch.Tensor | None = None
    source_heads: torch.Tensor | None = None


@torch.no_grad()
def decompx(
    trace: ModelTrace,
    target_ids: torch.Tensor,
    foil_ids: torch.Tensor | None = None,
    options: DecompXOptions | None = None,
    keep_layers: bool = False,
    per_head: bool = False,
    units: FrameUnits | None = None,
    positions: torch.Tensor | None = None,
) -> DecompXScores:
    """DecompX scores of the token predicted at every decoder position.

    Args:
        trace: A recorded forward pass.
        target_ids: ``(B, T)``: the token whose logit is explained at each position.
        foil_ids: ``(B, T)``: contrast tokens: explain ``logit(target) - logit(foil)``.
        options: Decomposition choices (:class:`DecompXOptions`).
        keep_layers: Also return every block's output components (for checks; memory grows with depth).
        per_head: Also read each decoder attention head's output components out along the logit direction on its
            branch (``target_heads``, ``source_heads``; see :class:`HeadReadout`).
        units: Audio units of a speech model's audio stack, decomposed as the stack's input components: every frame
            of a unit starts in the unit's component (one component per unit instead of per frame; the scores over
            that stack are then per unit). With ``bias="separate"`` this equals the frame decomposition summed over
            each unit's frames; the other bias splits weigh a unit's component as a whole.
        positions: ``(B, T)``: the explained decoder positions. A decoder-only model's positions before the first
            of them (a prompt's, which nothing reads) are not explained: their scores are 0 (``logit`` is still every
            position's), and the last layer's queries, FFN, the final norm and the read-out run from the first
            explained position on (a long prompt explained at its end: less memory and time). Default: every
            position.

    Returns:
        :class:`DecompXScores`; ``target.sum(-1) + source.sum(-1) (+ bias) == logit`` (from the first explained
        position on).
    """
    if not trace.spec.explains_logits:
        raise ValueError(NO_HEAD.format(method="DecompX"))
    options = options or DecompXOptions()
    with fused_activations(trace.spec):  # the activation slopes: GPT-2's Python GELU as one fused kernel
        return _decompose(trace, target_ids, foil_ids, options, keep_layers, per_head, units, positions)


def _decompose(trace, target_ids, foil_ids, options, keep_layers, per_head, units, positions) -> DecompXScores:
    spec, dec, enc = trace.spec, trace.decoder, trace.encoder
    separate = options.bias == "separate"
    if units is not None and options.convention == "reference":
        raise ValueError(
            "DecompX's convention='reference' keeps each token's value bias in its own component, which audio units "
            "do not have: use convention='paper' with unit_components."
        )
    # the masks on the host, in one copy: every layout decision is taken there (no further read of the device)
    source_mask = None if enc is None else (enc.mask if units is None or units.stack != "encoder" else units.present)
    key_mask = dec.mask if units is None or units.stack != "decoder" else units.present
    on_device_now = {"decoder": dec.mask, "keys": key_mask}
    if enc is not None:
        on_device_now.update(encoder=enc.mask, source=source_mask)
    if units is not None:
        on_device_now["owner"] = units.owner()
    if positions is not None:
        on_device_now["positions"] = positions
    host = dict(zip(on_device_now, host_copies(*on_device_now.values()), strict=True))
    first_row = first_explained_row(spec, None if positions is None else host["positions"].numpy())
    owners = {} if units is None else {units.stack: host["owner"]}
    device = dec.mask.device
    layers, encoder, place = {}, None, None
    offset = 0
    if spec.is_encoder_decoder:
        num_source = source_mask.shape[1]
        host_available = available_components(host["encoder"], [(host["source"], False)], separate)
        available = host_available.to(device, non_blocking=True)
        bias_index = num_source if separate else None
        start = initial_stream(enc.layers[0].input, 0, available, host_available, bias_index,
                               options.max_chunk_elements, owners.get("encoder"))  # fmt: skip
        encoder, layers["encoder"] = decompose_stack(spec.encoder, enc, start, options, keep_layers=keep_layers,
                                                     owner=owners.get("encoder"))  # fmt: skip
        offset, blocks = num_source, [(host["source"], False), (host["decoder"], dec.causal)]
        place = encoder_placement(num_source, dec.mask.shape[1], separate)
    else:
        blocks = [(host["keys"], dec.causal)]
    num_target = blocks[-1][0].shape[1]  # the decoder stack's components: its tokens, or its audio units
    host_available = available_components(host["decoder"], blocks, separate)
    available = host_available.to(device, non_blocking=True)
    bias_index = available.shape[-1] - 1 if separate else None
    start = initial_stream(dec.layers[0].input, offset, available, host_available, bias_index,
                           options.max_chunk_elements, owners.get("decoder"), dec.causal)  # fmt: skip
    unembedded, bias = readout(trace, target_ids, foil_ids)
    heads = head_readouts(trace, unembedded, available.shape[-1]) if per_head else None
    stream, layers["decoder"] = decompose_stack(spec.decoder, dec, start, options, encoder, place,
                                                keep_layers=keep_layers, heads=heads, offset=offset,
                                                first_row=first_row, owner=owners.get("decoder"))  # fmt: skip
    weights = None
    if spec.head is not None and spec.head.pooling:  # a pooled read-out: the shares summed before the bias split
        scores = summed_into_first(read_out(stream, unembedded), 1)
    elif spec.head is not None:  # encoder heads: the components go through the head's steps, biases split on the way
        scores, bias, weights = through_head(stream, trace, target_ids, foil_ids, options)
    else:
        scores = read_out(stream, unembedded * spec.logits_scale)
        if options.convention == "reference" and options.bias in ("absdot", "norm"):
            weights = logit_vector_weights(spec, stream, options.bias)
    del stream, encoder
    positions = Components(scores.new_empty(0), available, bias_index)
    scores = split_scalar_bias(scores, positions, bias, options.bias, weights)
    refuse_non_finite("DecompX", scores)
    real = dec.mask[..., None].to(scores.dtype)
    scores = scores * real
    scores[:, :first_row] = 0  # rows nothing explains (their read-out was skipped)
    target_heads = source_heads = None
    if heads is not None:
        real_rows = dec.mask[:, None, None, :, None]
        self_heads = torch.stack([layer["self"].scores for layer in heads], dim=1) * real_rows
        target_heads = self_heads[..., offset : offset + num_target]
        if spec.is_encoder_decoder:
            cross_heads = torch.stack([layer["cross"].scores for layer in heads], dim=1) * real_rows
            source_heads = torch.stack([self_heads[..., :offset], cross_heads[..., :offset]], dim=1)
    return DecompXScores(
        target_heads=target_heads,
        source_heads=source_heads,
        target=scores[..., offset : offset + num_target],
        source=scores[..., :offset] if spec.is_encoder_decoder else None,
        bias=scores[..., -1] if separate else None,
        logit=recorded_logit(trace, target_ids, foil_ids) * dec.mask,
        logit_after_softcap=masked(softcapped_logit(trace, target_ids, foil_ids), dec.mask),
        layers=layers if keep_layers else {},
    )


def head_readouts(trace: ModelTrace, unembedded: torch.Tensor, num_components: int) -> list[dict[str, HeadReadout]]:
    """Empty per-head read-outs of every decoder attention sub-block, along the logit directions that ALTI-logit
    carries down the residual stream from the unembedding direction ``(B, T, D)`` (:func:`.readout.sweep_logit`)."""
    sweep = sweep_logit(trace, unembedded, parts=False)
    readouts = []
    for layer, branches in zip(trace.spec.decoder.layers, sweep.branches, strict=True):
        readouts.append({})
        for name, direction in branches.items():
            attn = layer.self_attn if name == "self" else layer.cross_attn
            scores = direction.new_zeros(direction.shape[0], attn.num_heads, direction.shape[1], num_components)
            readouts[-1][name] = HeadReadout(direction, scores)
    return readouts


def encoder_placement(num_source: int, num_target: int, separate: bool):
    """Map encoder component indices [source (| bias)] to the decoder layout [source | target (| bias)]."""

    def place(indices: np.ndarray) -> np.ndarray:
        if not separate:
            return indices
        return np.where(indices == num_source, num_source + num_target, indices)

    return place
