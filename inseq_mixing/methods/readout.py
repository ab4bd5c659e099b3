r"""The logit's read-out, shared by the logit methods (ALTI-logit, DecompX, AttnLRP): the direction :math:`u_t` on
the final hidden state whose dot product is the logit of a token (minus a foil's), the logit's constant, the model's
own logit to check against, and :math:`u` carried down the residual stream through every frozen norm
(:func:`sweep_logit`), with the logit's parts met on the way: each attention sub-block's per-token parts
:math:`\Delta^l_{tj} = g^l_t \cdot \sum_h \alpha^h_{tj} v^h_j W^h_O`, the embedding's direct term, and the terms
that no token owns (FFN outputs, output-projection biases, norm shifts, the logit bias).

The math is ALTI-logit's (Ferrando et al., ACL 2023; see :mod:`.alti_logit`, which adds the rollout); the
encoder–decoder, post-LN and attention-output-norm cases are our extensions, described there.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..specs import AttentionSpec, ModelSpec
from ..specs.base import MixerSpec, linear_in_out
from ..trace import AttentionTrace, MixerTrace, ModelTrace
from .blocks import ffn_output, upcast
from .head import FrozenHead
from .mixers import frozen_mixer
from .norms import freeze_norm

#: Names of the logit terms that are not attributed to tokens, in :attr:`AltiLogitScores.unattributed`.
UNATTRIBUTED_TERMS = ("ffn", "attention_bias", "norm_bias", "logit_bias")


def unembedding_direction(spec: ModelSpec, ids: torch.Tensor, foil_ids: torch.Tensor | None) -> torch.Tensor:
    """:math:`U_w` (or :math:`U_w - U_{foil}`) for the token at every position, ``(B, T, D)``; through the transpose
    of the read-out projection :math:`P` when the model has one (:math:`U_w P`)."""
    return through_readout(spec, unembedding_rows(spec, ids, foil_ids))


def unembedding_rows(spec: ModelSpec, ids: torch.Tensor, foil_ids: torch.Tensor | None) -> torch.Tensor:
    """The LM head's rows :math:`U_w` (or :math:`U_w - U_{foil}`) of ``ids`` ``(B, T, E)``, gathered, then upcast."""
    rows = spec.lm_head.weight
    direction = upcast(rows[ids])
    return direction if foil_ids is None else direction - upcast(rows[foil_ids])


#: Raised by the logit methods on a model without a read-out.
NO_HEAD = (
    "{method} explains a logit, and this model has no head to read one from: load it with its head "
    "(...ForConditionalGeneration or ...ForCausalLM; encoder-only models: ...ForMaskedLM, "
    "...ForSequenceClassification or ...ForTokenClassification), or use a map method (alti, value_zeroing, ...)."
)


def readout(trace: ModelTrace, ids: torch.Tensor, foil_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The direction on the final hidden state ``(B, T, D)`` and the constant ``(B, T)`` of the logit of ``ids``
    (minus ``foil_ids``'s) at every position, before the LM-head scale: the unembedding rows and the logit bias, or an
    encoder's frozen head (:class:`~.head.FrozenHead`)."""
    spec = trace.spec
    if spec.head is not None:
        return FrozenHead(spec.head, trace.final_hidden, trace.decoder.mask).readout(ids, foil_ids)
    return unembedding_direction(spec, ids, foil_ids), logit_bias(spec, ids, foil_ids)


def through_readout(spec: ModelSpec, vectors: torch.Tensor) -> torch.Tensor:
    """Unembedding-side vectors ``(..., E)`` as directions on the final hidden state ``(..., D)``: through the
    transpose of the read-out projection :math:`P` when the model has one."""
    if spec.readout_proj is None:
        return vectors
    weight, _ = linear_in_out(spec.readout_proj)  # (D, E)
    return vectors @ upcast(weight).T


def logit_bias(spec: ModelSpec, ids: torch.Tensor, foil_ids: torch.Tensor | None) -> torch.Tensor:
    """Bias added to the logit outside the hidden state (LM-head bias and ``final_logits_bias``), ``(B, T)``."""
    bias = torch.zeros(ids.shape, device=ids.device, dtype=upcast(spec.lm_head.weight).dtype)
    for vector in (getattr(spec.lm_head, "bias", None), spec.logits_bias):
        if vector is not None:
            vector = upcast(vector.reshape(-1))
            bias = bias + vector[ids] - (0 if foil_ids is None else vector[foil_ids])
    return bias


def recorded_logit(trace: ModelTrace, ids: torch.Tensor, foil_ids: torch.Tensor | None) -> torch.Tensor:
    """The model's own logit of ``ids`` (minus ``foil_ids``'s) at every position, ``(B, T)``, before the final
    soft-cap if the model has one: the value the logit methods decompose. From a trace that skipped the LM head's
    full-vocabulary product, the same logits gathered from the final hidden state (:func:`gathered_logit`)."""
    if trace.logits is None and trace.spec.head is None:
        logit = gathered_logit(trace, ids)
        return logit if foil_ids is None else logit - gathered_logit(trace, foil_ids)
    return _gather_logit(trace.explained_logits, ids, foil_ids)


def softcapped_logit(trace: ModelTrace, ids: torch.Tensor, foil_ids: torch.Tensor | None) -> torch.Tensor | None:
    """The model's final (soft-capped) logit of ``ids`` (minus ``foil_ids``'s), ``(B, T)``; None for models without
    a final soft-cap."""
    cap = trace.spec.logit_softcap
    if trace.logits is None and trace.spec.head is None and cap is not None:
        logit = cap * torch.tanh(gathered_logit(trace, ids) / cap)
        return logit if foil_ids is None else logit - cap * torch.tanh(gathered_logit(trace, foil_ids) / cap)
    return None if trace.logits_before_softcap is None else _gather_logit(trace.logits, ids, foil_ids)


def gathered_logit(trace: ModelTrace, ids: torch.Tensor) -> torch.Tensor:
    """The LM head's logit of ``ids`` at every position ``(B, T)`` (before a final soft-cap), from the final hidden
    state: the unembedding rows of ``ids`` alone (read-out projection, scale and logit bias included), not the
    full-vocabulary product."""
    direction = unembedding_direction(trace.spec, ids, None) * trace.spec.logits_scale
    return _dot(direction, upcast(trace.final_hidden)) + logit_bias(trace.spec, ids, None)


def head_input_logit(spec: ModelSpec, head_input: torch.Tensor, ids: torch.Tensor, foil_ids: torch.Tensor | None
                     ) -> torch.Tensor:  # fmt: skip
    """The LM head's logit of ``ids`` (minus ``foil_ids``'s) ``(B, T)`` from what the head was given ``(B, T, E)``
    (after any read-out projection and scale): the unembedding rows of ``ids`` alone and the logit bias, not the
    full-vocabulary product; differentiable in ``head_input`` (the head is linear: its gradient is those rows)."""
    return _dot(unembedding_rows(spec, ids, foil_ids), upcast(head_input)) + logit_bias(spec, ids, foil_ids)


def _gather_logit(logits: torch.Tensor, ids: torch.Tensor, foil_ids: torch.Tensor | None) -> torch.Tensor:
    logits = upcast(logits)
    logit = logits.gather(-1, ids[..., None])[..., 0]
    return logit if foil_ids is None else logit - logits.gather(-1, foil_ids[..., None])[..., 0]


def attention_logit_parts(
    attn: AttentionSpec, record: AttentionTrace, direction: torch.Tensor, per_head: bool = False,
    rows: slice = slice(None),
) -> torch.Tensor:  # fmt: skip
    r""":math:`\Delta_{tj} = g_t \cdot \sum_h \alpha^h_{tj} v^h_j W^h_O`, ``(B, T, K)``, heads contracted first;
    with ``per_head``, each head's term :math:`g_t \cdot \alpha^h_{tj} v^h_j W^h_O`, ``(B, H, T, K)``. ``direction``
    holds the query positions ``rows`` only (and so does the result)."""
    values = upcast(record.values[:, :, attn.kv_head_of_query_head().to(record.values.device)])
    weights = upcast(attn.out_weight_per_head())
    start, stop, _ = rows.indices(record.output.shape[1])
    step = record.block_rows()
    blocks = []
    for first in range(start, stop, step) or [start]:  # a long trace: one block of query rows' probabilities at a time
        queries = slice(first, min(first + step, stop))
        projected = torch.einsum("hed,bqd->bhqe", weights, direction[:, first - start : queries.stop - start])
        per_key = torch.einsum("bkhe,bhqe->bhqk", values, projected)
        probs = upcast(record.probs_rows(queries))
        blocks.append(probs * per_key if per_head else torch.einsum("bhqk,bhqk->bqk", probs, per_key))
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=-2)


def mixer_logit_parts(attn: MixerSpec, record: MixerTrace, direction: torch.Tensor, per_head: bool = False,
                      rows: slice = slice(None)) -> torch.Tensor:  # fmt: skip
    r""":math:`g_t \cdot \mathrm{part}_t(j)` of a token mixer that is not attention, ``(B, T, K)`` (per head
    ``(B, H, T, K)``), for the query positions ``rows`` (:meth:`.mixers.FrozenMixer.logit_parts`)."""
    return frozen_mixer(attn, record).logit_parts(direction, rows, per_head)


#: Each kind of token-mixing sub-block's logit parts and its term no token carries (attention: the output
#: projection's bias; a mixer: :meth:`.mixers.FrozenMixer.unattributed`), by its spec's type.
BRANCH_LOGITS = {
    AttentionSpec: (attention_logit_parts, lambda attn, _record, branch, _rows: _dot(branch, attn.out_bias)),
    MixerSpec: (
        mixer_logit_parts,
        lambda attn, record, branch, rows: _dot(branch, frozen_mixer(attn, record).unattributed()[:, rows]),
    ),
}


def _dot(direction: torch.Tensor, vector: torch.Tensor | None) -> torch.Tensor:
    """Per-position dot product of ``(B, T, D)`` directions with a ``(D,)`` or ``(B, T, D)`` vector."""
    if vector is None:
        return direction.new_zeros(direction.shape[:-1])
    return (direction * upcast(vector)).sum(-1)


@dataclass
class LogitSweep:
    """Result of carrying the logit direction down the decoder.

    Attributes:
        self_parts: Per layer, :math:`\\Delta` of the self-attention sub-block ``(B, T, T)``.
        cross_parts: Per layer, :math:`\\Delta` of the cross-attention sub-block ``(B, T, S)``.
        direct: The embedding's direct term ``(B, T)``, with the direct terms of what the stack adds between its
            blocks at the position itself (:class:`~.specs.base.InjectedInputs`).
        unattributed: Terms not attributed to tokens, each ``(B, T)``.
        branches: Per layer, the direction :math:`g` on each attention sub-block's branch output (before a norm on
            the attention output), ``{"self": (B, T, D), "cross": (B, T, D)}``.
    """

    self_parts: list[torch.Tensor]
    cross_parts: list[torch.Tensor]
    direct: torch.Tensor
    unattributed: dict[str, torch.Tensor]
    branches: list[dict[str, torch.Tensor]] = field(default_factory=list)


def _through_norm(norm, norm_input, direction, terms, rows: slice = slice(None)) -> torch.Tensor:
    """Carry a direction (of the positions ``rows``) from a norm's output to its input; book the norm's shift."""
    frozen = freeze_norm(norm, norm_input[:, rows])
    terms["norm_bias"] += _dot(direction, frozen.shift)
    return frozen.transpose(direction)


def sweep_logit(
    trace: ModelTrace,
    direction: torch.Tensor,
    per_head: bool = False,
    parts: bool = True,
    rows: slice = slice(None),
    on_layer: Callable[[int, torch.Tensor], None] | None = None,
) -> LogitSweep:
    """Carry :math:`u` from the logit down the decoder's residual stream, splitting the logit on the way (attention
    parts per head with ``per_head``: ``(B, H, T, K)`` each; none with ``parts=False``, for the directions only).
    ``direction`` may hold the logits of some query positions only, ``rows``: every result then holds those rows.
    ``on_layer(index, self_parts)`` is called on each layer, top-down, once its self-attention parts are computed and
    while its records are the ones a long trace holds (a caller that reads the layer too reads it in this pass)."""
    spec, stack = trace.spec, trace.decoder
    terms = {name: direction.new_zeros(direction.shape[:-1]) for name in UNATTRIBUTED_TERMS}
    direction = direction * spec.logits_scale
    if spec.decoder.final_norm is not None:
        direction = _through_norm(spec.decoder.final_norm, stack.final_norm_input, direction, terms, rows)
    self_parts, cross_parts, branches = [], [], []
    direct = direction.new_zeros(direction.shape[:-1])
    for index in range(len(stack.layers) - 1, -1, -1):
        layer, record = spec.decoder.layers[index], stack.layers[index]
        branches.insert(0, {})
        if record.injected is not None:  # added after this block at some positions: their own, as an embedding
            direct += _dot(direction, record.injected[:, rows].to(direction.device))
        if layer.ffn.post_norm is not None:
            direction = _through_norm(layer.ffn.post_norm, record.ffn_norm_input, direction, terms, rows)
        terms["ffn"] += _dot(direction, upcast(ffn_output(layer, record)[:, rows]))
        for name, attn, attn_record, collected in (
            ("cross", layer.cross_attn, record.cross_attn, cross_parts),
            ("self", layer.self_attn, record.self_attn, self_parts),
        ):
            if attn is None:
                continue
            if attn.post_norm is not None:
                direction = _through_norm(attn.post_norm, attn_record.norm_input, direction, terms, rows)
            branch = direction  # a norm on the attention output sits on the branch only, not on the residual
            if attn.out_norm is not None:
                branch = _through_norm(attn.out_norm, attn_record.output, direction, terms, rows)
            logit_parts, bias = BRANCH_LOGITS[type(attn)]
            terms["attention_bias"] += bias(attn, attn_record, branch, rows)
            if parts:
                collected.insert(0, logit_parts(attn, attn_record, branch, per_head, rows))
            branches[0][name] = branch
        if on_layer is not None:
            on_layer(index, self_parts[0] if parts else None)
    direct += _dot(direction, upcast(stack.layers[0].input[:, rows]))
    return LogitSweep(self_parts, cross_parts, direct, terms, branches)


def masked(value: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor | None:
    """``value`` zeroed at padding, or None."""
    return None if value is None else value * mask
