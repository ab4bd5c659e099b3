r"""Value Zeroing (Mohebbi et al., EACL 2023), in closed form on a recorded forward pass.

Paper: Hosein Mohebbi, Willem Zuidema, Grzegorz Chrupała, Afra Alishahi. "Quantifying Context Mixing in
Transformers". EACL 2023. https://aclanthology.org/2023.eacl-main.245/

For layer :math:`l`, context token :math:`j` and position :math:`i`, zero the value vector :math:`v^h_j` in every
head, re-run the layer on its clean input and score

.. math:: s^l_{ij} = d\big(\tilde y^{l,\neg j}_i,\; y^l_i\big)

with :math:`d` the cosine distance (or Euclidean distance) between corrupted and clean layer outputs. Rows are
normalised to sum to 1.

Zeroing :math:`v_j` changes the attention output of query :math:`i` by exactly
:math:`-\sum_h \alpha^h_{ij}\, v^h_j W^h_O`, and everything after the attention module is position-wise (residual,
norms, FFN, and cross-attention, whose queries come from position :math:`i` alone). So the zeroings of one layer are a
single batched pass of a ``(zeroed tokens, positions, d_model)`` tensor through the rest of the block, chunked over
zeroed tokens; no re-run of the model per token. The rest of the block is the model's own modules, except that
transformers' Python ``gelu_new`` (GPT-2, T5 v1.1) runs as torch's fused kernel of the same formula there
(:func:`.blocks.fused_activations`; equal to float rounding), for the clean and the corrupted rows alike. A mixture of
experts (our extension) is position-wise too, and re-runs whole, router included: a corrupted row may go to other
experts, as in a re-run of the model.

Token mixers that are not attention (hybrids such as Bamba and LFM2; our extension): token :math:`j`'s value input to
the mixer is zeroed with the mixing kept as it was (its steps, decays and state projections come from other channels),
and the mixer's output is re-run past the mixing in closed form (:meth:`.mixers.FrozenMixer.zeroed_outputs`: the
value's activation, gate and gated norm recomputed), then the rest of the block as for attention.

Audio units (speech models, :mod:`.units`): zeroing every frame of a unit :math:`u` at once changes the attention
output of query :math:`i` by :math:`-\sum_h \sum_{j \in u} \alpha^h_{ij}\, v^h_j W^h_O`, so the closed form holds
for spans too; a layer's zeroings are then one pass per unit instead of per frame. Its scores are
``(positions, units)``; the front end reduces the query frames of each unit (mean, or max) before normalising.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..specs import AttentionSpec, FFNSpec, LayerSpec
from ..specs.base import MixerSpec
from ..trace import LayerTrace, ModelTrace, StackTrace, eval_mode
from .blocks import (
    apply_ffn,
    cross_attention_input,
    finish_layer,
    fused_activations,
    head_value_outputs,
    refuse_non_finite,
    upcast,
    valid_cells,
)
from .chunking import DEFAULT_CHUNK_ELEMENTS, causal_chunk_slices, items_per_chunk
from .compiled import kernel
from .mixers import frozen_mixer
from .options import NORMALIZATIONS, SIMILARITY_METRICS
from .results import LayerMaps
from .rollout import joint_rollout, normalize_rows, normalize_rows_
from .rollout import rollout as rollout_stack
from .units import FrameUnits

#: Upper bound on the elements of one chunk of corrupted hidden states (times the FFN expansion, about 4).


@dataclass
class ValueZeroingScores:
    """Raw value-zeroing distances per layer, ``(batch, layers, positions i, context tokens j)``.

    Impossible cells (padding, and future tokens in causal self-attention) hold 0.

    Attributes:
        decoder: Decoder self-attention zeroing (the only map of decoder-only models), ``(B, L, T, T)``.
        cross: Cross-attention zeroing of source tokens, measured at decoder layer outputs, ``(B, L, T, S)``.
        encoder: Encoder self-attention zeroing, ``(B, L, S, S)``.
    """

    decoder: torch.Tensor
    cross: torch.Tensor | None = None
    encoder: torch.Tensor | None = None


def distance(corrupted: torch.Tensor, clean: torch.Tensor, metric: str) -> torch.Tensor:
    """Distance between hidden states along the last axis: cosine distance or Euclidean distance.

    The cosine distance is computed as ``½‖â − b̂‖²`` of the unit vectors, equal to ``1 − cos`` but without its
    cancellation: nearly unchanged outputs get accurate small distances instead of float32 rounding noise.
    """
    if metric == "cosine":
        return 0.5 * (F.normalize(corrupted, dim=-1) - F.normalize(clean, dim=-1)).pow(2).sum(-1)
    if metric == "euclidean":
        return torch.linalg.vector_norm(corrupted - clean, dim=-1)
    raise ValueError(f"Unknown similarity metric {metric!r}: use one of {SIMILARITY_METRICS}.")


def ffn_distance(ffn: FFNSpec, hidden: torch.Tensor, clean: torch.Tensor, metric: str,
                 output_norm: torch.nn.Module | None = None) -> torch.Tensor:  # fmt: skip
    """The FFN sub-block on corrupted rows ``(B·width, queries, D)`` and their distance to the clean layer output
    ``(B, 1, queries, D)``: ``(B, width, queries)``; ``output_norm`` (the stack's final norm, ``convention=
    "reference"``) applied to the corrupted output first (``clean`` has it already). Value zeroing's hot step (a fused
    kernel with ``compile``)."""
    corrupted = normed(apply_ffn(ffn, hidden), output_norm)
    return distance(corrupted.unflatten(0, (clean.shape[0], -1)), clean, metric)


def normed(hidden: torch.Tensor, norm: torch.nn.Module | None) -> torch.Tensor:
    """``hidden`` through ``norm`` (its own statistics, as the model's forward applies it), upcast; without a norm,
    ``hidden`` upcast."""
    if norm is None:
        return upcast(hidden)
    return upcast(norm(hidden.to(next(norm.parameters()).dtype)))


def chunk_elements_per_key(batch: int, positions: int, d_model: int) -> int:
    """Elements one zeroed token adds to a chunk's largest tensor (its FFN activations)."""
    return batch * positions * d_model * 4


def chunk_size_for(batch: int, positions: int, d_model: int, max_elements: int) -> int:
    """Zeroed tokens per chunk so that the chunk's FFN activations stay under ``max_elements``."""
    return items_per_chunk(chunk_elements_per_key(batch, positions, d_model), max_elements)


def zeroing_distances(
    layer: LayerSpec,
    record: LayerTrace,
    sub_block: str,
    causal: bool,
    metric: str = "cosine",
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    key_units: torch.Tensor | None = None,
    first_row: int = 0,
    output_norm: torch.nn.Module | None = None,
    trimmed: bool = False,
) -> torch.Tensor:
    """Distances of one layer's output when each context token's values are zeroed in one attention sub-block.

    Args:
        layer: The layer's spec.
        record: The layer's trace.
        sub_block: ``"self"`` (zero the layer's own tokens) or ``"cross"`` (zero encoder tokens in cross-attention).
        causal: Only positions ``i >= j`` are computed (causal self-attention).
        metric: ``"cosine"`` or ``"euclidean"``.
        max_chunk_elements: Memory bound per chunk of zeroed tokens.
        key_units: ``(batch, units, tokens)`` 0/1 membership (non-causal sub-blocks only): zero all tokens (frames) of
            a unit at once, one zeroing per unit.
        first_row: Rows (positions ``i``) before it are not computed and stay 0: nothing reads them (a prompt's rows
            when only the generated tokens are explained and the maps are not rolled out).
        output_norm: A norm applied to the clean and the corrupted layer outputs before their distance (the stack's
            final norm at its last layer, as transformers' last hidden state has it: ``convention="reference"``).
        trimmed: Return the rows from ``first_row`` on only, the others never allocated.

    Returns:
        ``(batch, positions i, tokens j)`` distances (``trimmed``: positions from ``first_row`` on; with
        ``key_units``: ``(batch, positions i, units)``); cells ``i < j`` of causal maps, and keys no head attends to
        (outside a sliding window), are exactly 0: zeroing their values changes nothing.
    """
    attn = layer.self_attn if sub_block == "self" else layer.cross_attn
    attn_record = record.self_attn if sub_block == "self" else record.cross_attn
    residual = record.input if sub_block == "self" else cross_attention_input(layer, record)
    source = ZEROING_SOURCES[type(attn)](attn, attn_record, first_row, key_units)
    batch, num_queries, num_keys = source.output.shape[0], source.output.shape[1], source.num_keys
    dtype, score_dtype, attn_output = residual.dtype, source.score_dtype, source.output
    full = slice(first_row, None)
    clean = finish_layer(
        layer,
        record,
        sub_block,
        residual[:, full],
        attn_output[:, full].to(dtype),
        torch.arange(batch, device=residual.device),
        full,
    )
    clean = normed(clean, output_norm)

    def distances(delta: torch.Tensor, queries: slice) -> torch.Tensor:
        """``(B, width, queries)`` distances of the layer output when ``delta`` ``(B, width, queries, d_model)``
        is taken from the attention output."""
        width = delta.shape[1]
        corrupted_attn = attn_output[:, None, queries] - delta
        rows = batch * width
        clean_rows = clean[:, None, (queries.start or 0) - first_row :]
        arguments = (
            layer,
            record,
            sub_block,
            residual[:, None, queries].expand(-1, width, -1, -1).reshape(rows, -1, residual.shape[-1]),
            corrupted_attn.to(dtype).reshape(rows, -1, residual.shape[-1]),
            torch.arange(batch, device=residual.device).repeat_interleave(width),
            queries,
        )
        if layer.ffn.parallel:  # the FFN's output does not change (GPT-NeoX)
            corrupted = normed(finish_layer(*arguments), output_norm).view(batch, width, -1, residual.shape[-1])
            return distance(corrupted, clean_rows, metric)
        hidden = finish_layer(*arguments, before_ffn=True)
        return kernel(ffn_distance)(layer.ffn, hidden, clean_rows, metric, output_norm)

    if key_units is not None:
        if first_row:
            raise ValueError("Audio units take every query row (first_row=0).")
        return unit_zeroing_distances(source.probs, source.value_outputs, key_units, distances, residual.shape[-1],
                                      max_chunk_elements).to(score_dtype)  # fmt: skip
    top = first_row if trimmed else 0  # the first row ``scores`` holds
    scores = residual.new_zeros(batch, num_queries - top, num_keys, dtype=score_dtype)
    per_key = chunk_elements_per_key(batch, num_queries - first_row, residual.shape[-1])
    # causal, on the CPU: narrow chunks let each one skip the positions before its first key, ~n²/2 pairs instead of
    # n² (each wasted pair is an FFN row: narrowed whatever the chunk's size); on an accelerator as wide as memory
    # allows
    chunks = causal_chunk_slices(
        num_keys, per_key, max_chunk_elements, smallest_chunk_elements=0, fewest_items=4,
        device_type=residual.device.type, causal=causal,
    )  # fmt: skip
    for keys in chunks:
        start = keys.start
        queries = slice(max(start, first_row), None) if causal else full
        scores[:, queries.start - top :, keys] = distances(source.delta(keys, queries), queries).transpose(1, 2)
    return source.untouched(scores.clamp_(min=0), top).to(score_dtype)


class AttentionZeroing:
    """What zeroing each token's values takes out of an attention sub-block's output, in closed form:
    ``Σ_h α^h_ij v^h_j W^h_O``. A long trace holds the probabilities of the rows that get a score only (from
    ``first_row`` on), recomputed by blocks; a norm on the attention output gets the output summed again in float64
    (:func:`resummed_attention_output`)."""

    def __init__(self, attn, record, first_row: int, key_units: torch.Tensor | None):
        self.skipped = first_row if record.kept_probs is None and key_units is None else 0
        probs = upcast(record.probs_rows(slice(self.skipped, None)))  # rows skipped.. of the layer's
        self.num_keys, self.score_dtype = probs.shape[-1], probs.dtype
        value_outputs = head_value_outputs(attn, record)
        output = upcast(record.output)
        if attn.out_norm is not None:
            probs, value_outputs, resummed = resummed_attention_output(attn, probs, value_outputs)
            skipped = self.skipped
            output = resummed if not skipped else torch.cat([output[:, :skipped].double(), resummed], dim=1)
        self.probs, self.value_outputs, self.output = probs, value_outputs, output

    def delta(self, keys: slice, queries: slice) -> torch.Tensor:
        """``(B, keys, queries, D)``: each zeroed token's part of the rows ``queries`` (from a start to the end)."""
        read = slice(queries.start - self.skipped, None)  # the same rows of the probabilities held
        return torch.einsum("bhqk,bhkd->bkqd", self.probs[:, :, read, keys], self.value_outputs[:, :, keys])

    def untouched(self, scores: torch.Tensor, top: int = 0) -> torch.Tensor:
        """``scores`` (its rows from ``top`` on) with the cells no head attends (outside a sliding window) exactly
        0, in place."""
        attended = (self.probs > 0).any(dim=1)  # rows from ``skipped`` on
        if self.skipped > top:  # rows before first_row hold no score (0) whatever they attend
            attended = torch.nn.functional.pad(attended, (0, 0, self.skipped - top, 0))
        return scores.masked_fill_(~attended[:, top - min(top, self.skipped) :], 0.0)


class MixerZeroing:
    """What zeroing each token's value input takes out of a token mixer's output that is not attention: the mixer's
    clean output minus its output re-run past the frozen mixing (:meth:`.mixers.FrozenMixer.zeroed_outputs`: the
    value's activation, the gate and the gated norm recomputed; our extension)."""

    def __init__(self, attn, record, first_row: int, key_units: torch.Tensor | None):
        if key_units is not None:
            raise ValueError("Value zeroing by units reads attention's probabilities; this layer's token mixer is "
                             f"a {attn.kind} layer.")  # fmt: skip
        self.frozen = frozen_mixer(attn, record)
        self.output = upcast(record.output)
        self.num_keys, self.score_dtype = self.output.shape[1], self.output.dtype

    def delta(self, keys: slice, queries: slice) -> torch.Tensor:
        return self.output[:, None, queries] - self.frozen.zeroed_outputs(keys, queries)

    def untouched(self, scores: torch.Tensor, top: int = 0) -> torch.Tensor:
        return scores


#: How zeroing a token's values changes each kind of token-mixing sub-block, by its spec's type.
ZEROING_SOURCES = {AttentionSpec: AttentionZeroing, MixerSpec: MixerZeroing}


def unit_zeroing_distances(
    probs: torch.Tensor,
    value_outputs: torch.Tensor,
    key_units: torch.Tensor,
    distances,
    d_model: int,
    max_chunk_elements: int,
) -> torch.Tensor:
    """Zero each unit's frames at once (see the module docstring): ``(B, queries, units)`` distances (0: empty units).

    A chunk of units forms its deltas as one product: the probabilities masked to each unit's frames, heads and
    frames flattened together, times the per-head value outputs ``v W_O``.
    """
    batch, heads, num_queries, num_keys = probs.shape
    num_units = key_units.shape[1]
    members = key_units.to(probs.dtype)
    flat_values = value_outputs.reshape(batch, 1, heads * num_keys, -1)  # (B, 1, H·K, D)
    chunk = min(
        chunk_size_for(batch, num_queries, d_model, max_chunk_elements),
        items_per_chunk(batch * heads * num_queries * num_keys, max_chunk_elements),
    )
    scores = probs.new_zeros(batch, num_queries, num_units)
    for start in range(0, num_units, chunk):
        units = slice(start, min(start + chunk, num_units))
        masked = probs[:, None] * members[:, units, None, None, :]  # (B, w, H, Q, K)
        masked = masked.transpose(2, 3).reshape(batch, -1, num_queries, heads * num_keys)
        scores[:, :, units] = distances(masked @ flat_values, slice(None)).transpose(1, 2)
    return scores.clamp(min=0) * (members.sum(-1) > 0)[:, None, :]


def resummed_attention_output(attn, probs: torch.Tensor, value_outputs: torch.Tensor):
    """Probabilities, per-head value outputs and the attention output ``b_O + Σ_hk α v W_O``, in float64.

    A norm on the attention output (Gemma 2 / 3, OLMo-2) rescales whatever remains after a value is zeroed: when
    that remainder is small (a token attending almost only to itself), the rounding error of ``output − part`` would
    be normalised into a wrong direction. Summed again in float64, the remainder is accurate to ~1e-16.
    """
    probs, value_outputs = probs.double(), value_outputs.double()
    output = torch.einsum("bhqk,bhkd->bqd", probs, value_outputs)
    if attn.out_bias is not None:
        output = output + attn.out_bias.double().to(output.device)
    return probs, value_outputs, output


def stack_distances(*args, **kwargs) -> torch.Tensor:
    """:func:`zeroing_distances` for every layer of a stack, masked (arguments as :func:`layer_distances`'s):
    ``(batch, layers, positions, tokens)`` (with ``key_units``: ``(batch, layers, positions, units)``)."""
    return torch.stack(list(layer_distances(*args, **kwargs)), dim=1)


def layer_distances(
    stack_spec_layers: list[LayerSpec],
    stack: StackTrace,
    sub_block: str,
    key_mask: torch.Tensor,
    causal: bool,
    metric: str,
    max_chunk_elements: int,
    key_units: torch.Tensor | None = None,
    first_row: int = 0,
    final_norm: torch.nn.Module | None = None,
    trimmed: bool = False,
) -> Iterator[torch.Tensor]:
    """:func:`zeroing_distances` of each layer of a stack in turn, masked, so that a caller may hold one layer's at a
    time: ``(batch, positions, tokens)`` (with ``key_units``: ``(batch, positions, units)``); rows before
    ``first_row`` are 0 (``trimmed``: left out); ``final_norm`` is applied to the last layer's outputs
    (``convention="reference"``)."""
    if key_units is None:
        valid = valid_cells(stack.mask, key_mask, causal)
    else:
        valid = stack.mask.bool()[:, :, None] & (key_units.sum(-1) > 0)[:, None, :]
    valid = valid[:, first_row:] if trimmed else valid
    last = len(stack_spec_layers) - 1
    for index, (layer, record) in enumerate(zip(stack_spec_layers, stack.layers, strict=True)):
        yield zeroing_distances(
            layer, record, sub_block, causal, metric, max_chunk_elements, key_units, first_row,
            final_norm if index == last else None, trimmed,
        ).masked_fill_(~valid, 0.0)  # fmt: skip


@contextmanager
def block_reruns(spec, metric: str) -> Iterator[None]:
    """While the blocks of ``spec``'s stacks are re-run: dropout off whatever the model's flags, ``gelu_new`` as one
    fused kernel; ``metric`` checked first."""
    if metric not in SIMILARITY_METRICS:
        raise ValueError(f"Unknown similarity metric {metric!r}: use one of {SIMILARITY_METRICS}.")
    blocks = [layer.module for stack in (spec.decoder, spec.encoder) if stack is not None for layer in stack.layers]
    with eval_mode(*blocks), fused_activations(spec):
        yield


@torch.no_grad()
def value_zeroing(
    trace: ModelTrace,
    metric: str = "cosine",
    encoder_scores: bool = True,
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    units: FrameUnits | None = None,
    first_row: int = 0,
    final_norms: bool = False,
) -> ValueZeroingScores:
    """Raw value-zeroing distances for every layer and attention sub-block of a traced model.

    Args:
        trace: A recorded forward pass.
        metric: ``"cosine"`` (cosine distance, the paper's choice) or ``"euclidean"``.
        encoder_scores: Also compute encoder self-attention scores (encoder–decoders).
        max_chunk_elements: Memory bound per chunk of zeroed tokens.
        units: Audio units of a speech model's audio stack: its frames are zeroed a unit at a time (the key axis of
            every map over those frames is then units; query axes stay frames).
        first_row: Decoder positions before it (self- and cross-attention maps) are not computed and stay 0: a
            prompt's rows that nothing reads. The rollout needs every row: leave it 0 there.
        final_norms: Measure each stack's last layer after the stack's final norm, as transformers' last hidden state
            has it (the speech study's code compares hidden states: ``convention="reference"``); else the layer's own
            output, as every other layer.
    """
    spec, dec, enc = trace.spec, trace.decoder, trace.encoder
    audio = {} if units is None else {units.stack: units.members}
    if audio.get("decoder") is not None and dec.causal:
        raise ValueError("Audio units are for non-causal stacks (speech encoders).")
    decoder_norm = spec.decoder.final_norm if final_norms else None
    with block_reruns(spec, metric):
        scores = ValueZeroingScores(
            decoder=stack_distances(
                spec.decoder.layers,
                dec,
                "self",
                dec.mask,
                dec.causal,
                metric,
                max_chunk_elements,
                audio.get("decoder"),
                first_row,
                decoder_norm,
            )  # fmt: skip
        )
        if spec.is_encoder_decoder:
            scores.cross = stack_distances(
                spec.decoder.layers, dec, "cross", enc.mask, False, metric, max_chunk_elements, audio.get("encoder"),
                first_row, decoder_norm,
            )  # fmt: skip
            if encoder_scores:
                scores.encoder = stack_distances(
                    spec.encoder.layers, enc, "self", enc.mask, False, metric, max_chunk_elements,
                    audio.get("encoder"), final_norm=spec.encoder.final_norm if final_norms else None,
                )  # fmt: skip
    return check_finite(scores)


@torch.no_grad()
def value_zeroing_layer_mean(
    trace: ModelTrace,
    metric: str = "cosine",
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    first_row: int = 0,
    final_norms: bool = False,
) -> LayerMaps:
    """The layers' mean of a decoder-only or encoder-only model's row-normalised value-zeroing maps, what
    :func:`value_zeroing_maps` of :func:`value_zeroing` gives averaged over the layers, summed a layer at a time over
    the rows from ``first_row`` on (the others 0): one layer's rows held, not every layer's ``T × T`` map (arguments
    as :func:`value_zeroing`'s)."""
    spec, stack = trace.spec, trace.decoder
    norm = spec.decoder.final_norm if final_norms else None
    total = None  # (B, Q - first_row, K)
    with block_reruns(spec, metric):
        layers = layer_distances(spec.decoder.layers, stack, "self", stack.mask, stack.causal, metric,
                                 max_chunk_elements, first_row=first_row, final_norm=norm, trimmed=True)  # fmt: skip
        for found in layers:
            refuse_non_finite("Value zeroing (decoder scores)", found)
            found = normalize_rows_(found)
            total = found if total is None else total.add_(found)
            del found
    return LayerMaps(target=F.pad(total.div_(len(spec.decoder.layers)), (0, 0, first_row, 0)))


def check_finite(scores: ValueZeroingScores) -> ValueZeroingScores:
    """Refuse NaN or infinite distances (overflowing half-precision activations) instead of returning them."""
    for name in ("decoder", "cross", "encoder"):
        refuse_non_finite(f"Value zeroing ({name} scores)", getattr(scores, name))
    return scores


def value_zeroing_maps(scores: ValueZeroingScores, normalization: str = "separate", rollout: bool = False):
    """Normalise raw value-zeroing distances, and optionally roll them out across layers.

    Args:
        scores: Raw distances from :func:`value_zeroing`.
        normalization: ``"separate"`` (the paper: each map's rows sum to 1) or ``"joint"`` (encoder–decoders: the
            cross and decoder self rows of a layer sum to 1 together, so source and target are comparable).
        rollout: Multiply the layer maps through the model. Encoder–decoders use the ALTI+ joint bookkeeping with
            jointly normalised decoder layers (our extension of Value Zeroing to encoder–decoders; needs encoder
            scores).

    Returns:
        :class:`LayerMaps`.
    """
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be 'separate' or 'joint', not {normalization!r}.")
    if scores.cross is None:
        target = normalize_rows(scores.decoder)
        return LayerMaps(target=rollout_stack(target)[:, -1] if rollout else target)
    encoder = normalize_rows(scores.encoder) if scores.encoder is not None else None
    if rollout:
        if encoder is None:
            raise ValueError("The encoder–decoder rollout needs the encoder scores: keep output_encoder_self_scores.")
        encoder, source, target = joint_rollout(encoder, *joint_blocks(scores))
        return LayerMaps(target=target[:, -1], source=source[:, -1], encoder=encoder)
    if normalization == "joint":
        source, target = joint_blocks(scores)
    else:
        source, target = normalize_rows(scores.cross), normalize_rows(scores.decoder)
    return LayerMaps(target=target, source=source, encoder=encoder)


def joint_blocks(scores: ValueZeroingScores) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross and decoder self distances normalised together per row, split back into (source, target) blocks."""
    num_source = scores.cross.shape[-1]
    joint = normalize_rows(torch.cat([scores.cross, scores.decoder], dim=-1))
    return joint[..., :num_source], joint[..., num_source:]
