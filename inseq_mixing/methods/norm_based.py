r"""The norm-based context-mixing measures and attention rollout.

**Attention norm** (Kobayashi et al., EMNLP 2020, "Attention is Not Only a Weight"): the size of what token :math:`j`
adds to position :math:`i` in a layer,

.. math:: N_{ij} = \Big\lVert \sum_h \alpha^h_{ij}\, f^h(x_j) \Big\rVert_2, \qquad f^h(x) = (x W^h_V + b^h_V) W^h_O.

Extensions (Kobayashi et al., EMNLP 2021, "Incorporating Residual and Normalization Layers"): ``residual=True``
("N-Res") adds the residual :math:`x_i` to token :math:`i`'s own vector; ``layer_norm=True`` ("N-ResLN") also passes
every vector through the block's layer norm, frozen at the forward pass. For post-LN blocks that is the norm after the
residual sum, as in the paper (BERT); for pre-LN blocks the norm that next reads the residual stream (the following
sub-block's input norm; our extension), and none when there is none (OLMo-2). The **context-mixing ratio** of position
:math:`i` is :math:`r_i = \lVert \sum_{j \ne i} z_{ij} \rVert / (\lVert \sum_{j \ne i} z_{ij} \rVert + \lVert z_{ii}
\rVert)`, with the residual in :math:`z_{ii}` (and the norm, with ``layer_norm``).

**GlobEnc** (Modarressi et al., NAACL 2022): the layer-wide decomposition of an encoder layer without the FFN, the
attention vectors with the residual through the first layer norm, then, through the second residual (which carries
them past the FFN), through the second layer norm, both frozen; :math:`\lVert z_{ij} \rVert_2`, rows normalised, rolled
out through the layers. Pre-LN blocks have no norm on the residual stream, so their vectors are N-Res's. Decoders and
encoder–decoders (self- and cross-attention maps, rolled out with ALTI+'s joint bookkeeping) are our extension.

**Attention rollout** (Abnar & Zuidema, ACL 2020): per layer :math:`\hat A = \tfrac12 \mathrm{mean}_h A^h +
\tfrac12 I`, rows renormalised, rolled out; encoder–decoders: cross-attention gets the residual as a last column
(:math:`\tfrac12\mathrm{mean}_h A^h_{\text{cross}}`, :math:`\tfrac12`), rolled out with ALTI+'s joint bookkeeping (our
extension). It reads the recorded attention probabilities only.
"""

import functools

import torch

from ..specs import AttentionSpec, LayerSpec, StackSpec
from ..specs.base import MixerSpec
from ..trace import AttentionTrace, LayerTrace, MixerTrace, ModelTrace, StackTrace
from .alti import AltiScores, alti_maps
from .blocks import refuse_non_finite, upcast, valid_cells
from .mixers import frozen_mixer
from .norms import FrozenNorm, freeze_norm
from .parts import DEFAULT_CHUNK_ELEMENTS, part_norms, part_source, stack_scores
from .results import LayerMaps
from .rollout import normalize_rows_, rolled_out_rows


def following_norms(layer: LayerSpec, record: LayerTrace, attn: AttentionSpec, attn_record: AttentionTrace):
    """The norm that next acts on the residual stream after an attention sub-block, frozen: its post-sum norm
    (post-LN), else the next sub-block's input norm (pre-LN), else none."""
    if attn.post_norm is not None:
        return [freeze_norm(attn.post_norm, attn_record.norm_input)]
    if attn is layer.self_attn and layer.cross_attn is not None:
        following, norm_input = layer.cross_attn.in_norm, record.cross_attn.norm_input
    else:
        following, norm_input = layer.ffn.in_norm, record.ffn_norm_input
    if following is None or layer.ffn.parallel:  # a parallel FFN reads the block input, not this sum
        return []
    return [freeze_norm(following, norm_input)]


def globenc_norms(layer: LayerSpec, record: LayerTrace, attn: AttentionSpec, attn_record: AttentionTrace):
    """GlobEnc's frozen norms after an attention sub-block: its post-sum norm, then, for the last attention
    sub-block of the layer, the FFN's post-sum norm (post-LN; none in pre-LN blocks)."""
    maps = [] if attn.post_norm is None else [freeze_norm(attn.post_norm, attn_record.norm_input)]
    last = layer.cross_attn if layer.cross_attn is not None else layer.self_attn
    if attn is last and layer.ffn.post_norm is not None:
        maps.append(freeze_norm(layer.ffn.post_norm, record.ffn_norm_input))
    return maps


def mixing_ratio(attn: AttentionSpec, record: AttentionTrace, residual: torch.Tensor, maps: list[FrozenNorm],
                 first_row: int = 0) -> torch.Tensor:  # fmt: skip
    """Context-mixing ratio of every position of a self-attention sub-block ``(B, Q)``, NaN on the rows before
    ``first_row`` (not computed)."""
    total, own = part_source(attn, record).totals(first_row)
    rows = slice(first_row, None)
    mixed = total - own
    if attn.out_norm is not None:
        out_frozen = freeze_norm(attn.out_norm, record.output)
        mixed, own = out_frozen.linear(mixed, rows), out_frozen.linear(own, rows)
    own = own + upcast(residual[:, rows])
    for frozen in maps:
        mixed, own = frozen.linear(mixed, rows), frozen.linear(own, rows)
    mixed, own = torch.linalg.vector_norm(mixed, dim=-1), torch.linalg.vector_norm(own, dim=-1)
    ratio = mixed.new_full(residual.shape[:2], torch.nan)
    ratio[:, rows] = mixed / (mixed + own).clamp(min=torch.finfo(mixed.dtype).tiny)
    return ratio


@torch.no_grad()
def attention_norm(
    trace: ModelTrace,
    residual: bool = False,
    layer_norm: bool = False,
    encoder_scores: bool = True,
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    per_layer: bool = True,
    first_row: int = 0,
    ratios_from_first_row: bool = False,
) -> LayerMaps:
    """Attention-norm maps of every layer (N, N-Res with ``residual``, N-ResLN with ``layer_norm`` as well), or with
    ``per_layer=False`` their mean over the layers (summed a layer at a time: one layer's map held, not every
    layer's); a decoder-only or encoder-only model's rows from ``first_row`` on (the others 0: nothing reads them).
    The context-mixing ratio of every position, or with ``ratios_from_first_row`` of the rows from ``first_row`` on
    (NaN before: not computed; a span reads its own rows only).

    Cross-attention maps hold the source tokens only (the residual column, the decoder's own stream, is dropped).
    """
    with_residual = residual or layer_norm
    first_row = 0 if trace.spec.is_encoder_decoder else first_row  # the encoder's rows are all read

    def layer_scores(layer, record, attn, attn_record, stream, self_mixing, causal):
        maps = following_norms(layer, record, attn, attn_record) if layer_norm else []
        return part_norms(attn, attn_record, stream, self_mixing, causal, with_residual, maps, max_chunk_elements,
                          first_row, trimmed=True)  # fmt: skip

    def scores(stack_spec, stack, sub_block, key_mask, read_layer=None):
        """The stack's maps (per layer, or summed into their mean) a layer at a time; ``read_layer(index)`` is
        called on each layer while its records are the ones held (a long trace rebuilds each layer once)."""
        found = None  # (B, L, Q, K) per layer, else (B, Q, K) summed
        for index in range(len(stack.layers)):
            layer = stack_scores(stack_spec, stack, sub_block, key_mask, layer_scores, with_residual,
                                 slice(index, index + 1))[:, 0]  # fmt: skip
            if not per_layer:
                found = layer if found is None else found.add_(layer)
            else:
                if found is None:
                    found = layer.new_zeros(layer.shape[0], len(stack.layers), *layer.shape[1:])
                found[:, index] = layer
            del layer  # in ``found``: not held beside what ``read_layer`` computes
            if read_layer is not None:
                read_layer(index)
        found = found if per_layer else found.div_(len(stack.layers))
        return torch.nn.functional.pad(found, (0, 0, stack.mask.shape[1] - found.shape[-2], 0))  # rows before: 0

    spec, dec, enc = trace.spec, trace.decoder, trace.encoder
    ratios, ratio_row = [], first_row if ratios_from_first_row else 0

    def mixing_ratio_of(index: int) -> None:
        layer, record = spec.decoder.layers[index], dec.layers[index]
        maps = following_norms(layer, record, layer.self_attn, record.self_attn) if layer_norm else []
        ratios.append(mixing_ratio(layer.self_attn, record.self_attn, record.input, maps, ratio_row) * dec.mask)

    result = LayerMaps(target=scores(spec.decoder, dec, "self", dec.mask, mixing_ratio_of))
    result.positions["context_mixing_ratio"] = torch.stack(ratios, dim=1)
    if spec.is_encoder_decoder:
        result.source = scores(spec.decoder, dec, "cross", enc.mask)[..., : enc.mask.shape[1]]
        if encoder_scores:
            result.encoder = scores(spec.encoder, enc, "self", enc.mask)
    computed = [value[..., ratio_row:] for value in result.positions.values()]  # the rows before: NaN, not computed
    refuse_non_finite("attention_norm", result.target, result.source, result.encoder, *computed)
    return result


def _normalised(maps: torch.Tensor, stack: StackTrace) -> torch.Tensor:
    """Rows normalised to 1 at real positions (``(B, L, Q, K)``, or the last rows only), in place."""
    return normalize_rows_(maps).mul_(stack.mask[:, None, stack.mask.shape[1] - maps.shape[-2] :, None])


@torch.no_grad()
def globenc(trace: ModelTrace, rollout: bool = True, max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
            first_row: int = 0) -> LayerMaps:  # fmt: skip
    """GlobEnc maps, rolled out through the layers (or per layer with ``rollout=False``); a decoder-only or
    encoder-only model's rollout: its rows from ``first_row`` on (the others 0), one layer's map at a time
    (:func:`.rollout.rolled_out_rows`)."""

    def layer_scores(layer, record, attn, attn_record, stream, self_mixing, causal, first=0):
        maps = globenc_norms(layer, record, attn, attn_record)
        return part_norms(attn, attn_record, stream, self_mixing, causal, True, maps, max_chunk_elements, first,
                          trimmed=True)  # fmt: skip

    spec, dec, enc = trace.spec, trace.decoder, trace.encoder
    if rollout and not spec.is_encoder_decoder:

        def layer_map(index: int, first: int) -> torch.Tensor:
            layer = slice(index, index + 1)
            scorer = functools.partial(layer_scores, first=first)
            found = _normalised(stack_scores(spec.decoder, dec, "self", dec.mask, scorer, layers=layer), dec)
            refuse_non_finite("globenc", found)
            return found[:, 0]

        return LayerMaps(target=rolled_out_rows(layer_map, len(dec.layers), first_row))
    scores = AltiScores(decoder=_normalised(stack_scores(spec.decoder, dec, "self", dec.mask, layer_scores), dec))
    if spec.is_encoder_decoder:
        scores.cross = _normalised(stack_scores(spec.decoder, dec, "cross", enc.mask, layer_scores), dec)
        scores.encoder = _normalised(stack_scores(spec.encoder, enc, "self", enc.mask, layer_scores), enc)
    refuse_non_finite("globenc", scores.decoder, scores.cross, scores.encoder)
    return alti_maps(scores, rollout)


def _mixer_map_blocks(attn: MixerSpec, record: MixerTrace, block_elements: int = 2**24):
    """``(rows, map rows (B, 1, R, T))`` of a token mixer (:meth:`.mixers.FrozenMixer.map_rows`), by blocks of rows
    whose kernel holds at most ``block_elements``."""
    frozen = frozen_mixer(attn, record)
    for rows in frozen.row_blocks(block_elements=block_elements):
        yield rows, frozen.map_rows(rows)


#: Where rollout's map of each kind of token-mixing sub-block comes from, by its spec's type: attention's
#: probabilities by blocks of query rows, a mixer's map (:meth:`.mixers.FrozenMixer.map_rows`).
MAP_BLOCKS = {AttentionSpec: lambda _attn, record: record.row_blocks(), MixerSpec: _mixer_map_blocks}


def rollout_layer_maps(stack_spec: StackSpec, stack: StackTrace, sub_block: str, key_mask: torch.Tensor,
                       layers: slice = slice(None), sinks: bool = False) -> torch.Tensor:  # fmt: skip
    """Abnar & Zuidema's per-layer maps ``(B, L, Q, K[+1])`` of one kind of sub-block (of the ``layers`` a slice
    picks), rows normalised; with ``sinks`` (self-attention whose rows sum to less than 1, the rest on a learned
    sink without a value) not normalised: a row's missing mass, ``0.5 · mean_h(1 − Σ_j A_ij)``, is the sink's share.
    A token mixer that is not attention gives its map in attention's place (:data:`MAP_BLOCKS`)."""
    records = stack.layers[layers]
    keys = key_mask.shape[1] + (sub_block != "self")  # cross-attention: the residual's column last
    stacked = None  # (B, L, Q, K[+1]), filled in place: one map's memory a layer, no temporaries of its size
    for index, (layer, record) in enumerate(zip(stack_spec.layers[layers], records, strict=True)):
        attn = layer.self_attn if sub_block == "self" else layer.cross_attn
        attn_record = record.self_attn if sub_block == "self" else record.cross_attn
        for rows, probs in MAP_BLOCKS[type(attn)](attn, attn_record):
            block = upcast(probs).mean(1) * 0.5
            if stacked is None:
                stacked = block.new_zeros(block.shape[0], len(records), stack.mask.shape[1], keys)
            stacked[:, index, rows, : block.shape[-1]] = block
        if sub_block == "self":
            stacked[:, index].diagonal(dim1=-2, dim2=-1).add_(0.5)
        else:
            stacked[:, index, :, -1] = 0.5
    if sub_block != "self":
        key_mask = torch.cat([key_mask, torch.ones_like(key_mask[:, :1])], dim=-1)
    valid = valid_cells(stack.mask, key_mask, stack.causal and sub_block == "self")
    stacked.masked_fill_(~valid[:, None], 0.0)
    if sinks and sub_block == "self":
        return stacked.mul_(stack.mask[:, None, :, None])
    return normalize_rows_(stacked).mul_(stack.mask[:, None, :, None])


def rollout_scores(trace: ModelTrace, method: str = "attention_rollout", sinks: bool = False) -> AltiScores:
    """Abnar & Zuidema's layer maps of every attention sub-block of a traced model (the graph attention rollout
    multiplies through and attention flow solves on), non-finite maps refused in ``method``'s name; ``sinks``: the
    decoder's self-attention rows not renormalised where attention sinks took part of them
    (:func:`rollout_layer_maps`)."""
    spec, dec, enc = trace.spec, trace.decoder, trace.encoder
    scores = AltiScores(decoder=rollout_layer_maps(spec.decoder, dec, "self", dec.mask, sinks=sinks))
    if spec.is_encoder_decoder:
        scores.cross = rollout_layer_maps(spec.decoder, dec, "cross", enc.mask)
        scores.encoder = rollout_layer_maps(spec.encoder, enc, "self", enc.mask)
    refuse_non_finite(method, scores.decoder, scores.cross, scores.encoder)
    return scores


@torch.no_grad()
def attention_rollout(trace: ModelTrace, first_row: int = 0, per_layer: bool = False) -> LayerMaps:
    """Attention rollout through all layers: ``target`` (and ``source``, ``encoder`` for encoder–decoders); a
    decoder-only or encoder-only model's rows from ``first_row`` on (the others 0), one layer's map at a time
    (:func:`.rollout.rolled_out_rows`).

    A model with attention sinks (``spec.attention_sinks``): each layer's share of a row that went to the sink stays
    out of the map (the sink passes nothing on), so a rolled-out row sums to less than 1 and
    ``positions["sink_share"]`` ``(B, T)`` holds the rest, ``1 − Σ_j R_ij`` (NaN on rows before ``first_row``, which
    are not computed; 0 on padding): our extension of the rollout to sinks.

    With ``per_layer``, the layer maps instead of their product: ``(B, L, T, T)`` (encoder–decoders: ALTI+'s joint
    layer blocks), every row; with sinks, each layer's share ``(B, T, L)``."""
    if trace.spec.is_encoder_decoder:
        return alti_maps(rollout_scores(trace), rollout=not per_layer)
    stack, sinks = trace.decoder, trace.spec.attention_sinks
    if per_layer:
        maps = rollout_layer_maps(trace.spec.decoder, stack, "self", stack.mask, sinks=sinks)
        refuse_non_finite("attention_rollout", maps)
        result = LayerMaps(target=maps)
        if sinks:
            result.positions["sink_share"] = ((1 - maps.sum(-1)) * stack.mask[:, None]).transpose(1, 2)
        return result

    def layer_map(index: int, first: int) -> torch.Tensor:
        found = rollout_layer_maps(trace.spec.decoder, stack, "self", stack.mask, slice(index, index + 1), sinks)
        found = found[:, 0, first:]
        refuse_non_finite("attention_rollout", found)
        return found

    result = LayerMaps(target=rolled_out_rows(layer_map, len(stack.layers), first_row))
    if sinks:
        share = (1 - result.target.sum(-1)) * stack.mask
        share[:, :first_row] = torch.nan
        result.positions["sink_share"] = share
    return result
