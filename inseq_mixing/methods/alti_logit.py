r"""ALTI-logit (Ferrando et al., ACL 2023): signed contributions of input tokens to a predicted token's logit.

Paper: Javier Ferrando, Gerard I. Gállego, Ioannis Tsiamas, Marta R. Costa-jussà. "Explaining How Transformers Use
Context to Build Predictions". ACL 2023. https://aclanthology.org/2023.acl-long.301/

With every norm's statistics frozen at the forward pass, the logit of token :math:`w` at position :math:`t` is linear
in the residual stream: :math:`\mathrm{logit}_w = u_t \cdot h^L_t + \text{const}`, where
:math:`u_t = s\, A_f^\top U_w` (final norm's frozen map :math:`A_f`, LM-head scale :math:`s`; :math:`U_w - U_{foil}`
for a contrastive explanation). Carrying :math:`u` down the residual stream (through the transpose of every post-LN
norm it crosses) gives a direction :math:`g^l_t` at each sub-block, and the logit splits exactly into

* the part of attention sub-block :math:`l` for context token :math:`j`,
  :math:`\Delta^l_{tj} = g^l_t \cdot \sum_h \alpha^h_{tj} v^h_j W^h_O` (value bias inside :math:`v`);
* the embedding's direct term :math:`g^0_t \cdot h^0_t`;
* terms not attributed to tokens: FFN outputs :math:`g \cdot f^l`, output-projection biases :math:`g \cdot b_O`,
  norm shifts :math:`g \cdot \beta`, and the logit bias (LM-head bias, BART's ``final_logits_bias``; encoder-only
  models: every bias and norm shift of the frozen head, :mod:`.head`).

Each :math:`\Delta^l_{tj}` is traced back to the input tokens with the ALTI rollout of the layers below,
:math:`\mathrm{score}_{ts} = \sum_l \sum_j \Delta^l_{tj} R^{l-1}_{js}` (:math:`R^{-1} = I`), plus the direct term on
token :math:`t`. Rollout rows sum to 1, so token scores plus the unattributed terms equal the model's logit.

Encoder–decoders (our extension of the paper, which covers decoder-only models): decoder self-attention parts travel
through the ALTI+ decoder rollout over [source; target] of the layers below, cross-attention parts through the final
encoder rollout. Post-LN models (Marian, BART) carry :math:`u` through every later norm's frozen map. A norm on an
attention output (Gemma 2 / 3's sandwich, OLMo-2; our extension) sits on the branch only: the attention parts are
dotted with :math:`A^\top g` (its frozen map :math:`A`), the residual keeps :math:`g`.

Encoder-only models (masked LMs, classifiers; our extension: the paper covers decoder-only models) are one non-causal
stack; the head between the final hidden state and the logit is frozen at the forward pass (:mod:`.head`), so
:math:`u_t` is the frozen head's direction.

A final logit soft-cap :math:`c \tanh(z / c)` (Gemma 2) is not linear: the method explains :math:`z`, the logit before
the cap, and reports the capped value beside it.
"""

from dataclasses import dataclass, field

import torch

from ..specs import AttentionSpec, ModelSpec
from ..specs.base import linear_in_out
from ..trace import AttentionTrace, ModelTrace
from .alti import DEFAULT_CHUNK_ELEMENTS, AltiScores, alti, alti_rollouts
from .blocks import ffn_output, refuse_non_finite, upcast
from .head import FrozenHead
from .norms import freeze_norm

#: Names of the logit terms that are not attributed to tokens, in :attr:`AltiLogitScores.unattributed`.
UNATTRIBUTED_TERMS = ("ffn", "attention_bias", "norm_bias", "logit_bias")


@dataclass
class AltiLogitScores:
    """Signed logit contributions for the token predicted at every position.

    Attributes:
        target: ``(B, T, T)``: contribution of target-prefix token ``j`` (decoder-only: any token) to the logit at
            position ``t``; 0 for ``j > t`` and padding.
        source: ``(B, T, S)``: contribution of source token ``s`` (encoder–decoders).
        unattributed: Terms not attributed to tokens, each ``(B, T)`` (see :data:`UNATTRIBUTED_TERMS`).
        direct: The embedding's direct term ``(B, T)`` (inside ``target``, on token ``t`` itself).
        target_heads: With ``per_head``: ``(B, L, H, T, T)``, the part of ``target`` carried by each attention head
            of each layer (``target`` = their sum + the direct term on the diagonal).
        source_heads: With ``per_head`` (encoder–decoders): ``(B, 2, L, H, T, S)``, the part of ``source`` carried
            by each self-attention (index 0) and cross-attention (index 1) head.
        logit: The model's own logit of the explained token (minus the foil's), ``(B, T)``; before the final
            soft-cap for models that have one (the contributions add up to it).
        logit_after_softcap: For models with a final soft-cap, the model's final logit (minus the foil's).
    """

    target: torch.Tensor
    source: torch.Tensor | None = None
    unattributed: dict[str, torch.Tensor] = field(default_factory=dict)
    logit: torch.Tensor | None = None
    logit_after_softcap: torch.Tensor | None = None
    direct: torch.Tensor | None = None
    target_heads: torch.Tensor | None = None
    source_heads: torch.Tensor | None = None


def unembedding_direction(spec: ModelSpec, ids: torch.Tensor, foil_ids: torch.Tensor | None) -> torch.Tensor:
    """:math:`U_w` (or :math:`U_w - U_{foil}`) for the token at every position, ``(B, T, D)``; through the transpose
    of the read-out projection :math:`P` when the model has one (:math:`U_w P`)."""
    rows = upcast(spec.lm_head.weight)
    direction = rows[ids]
    return through_readout(spec, direction if foil_ids is None else direction - rows[foil_ids])


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
        return FrozenHead(spec.head, trace.final_hidden).readout(ids, foil_ids)
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
    projected = torch.einsum("hed,bqd->bhqe", upcast(attn.out_weight_per_head()), direction)
    per_key = torch.einsum("bkhe,bhqe->bhqk", values, projected)
    probs = upcast(record.probs[:, :, rows])
    if per_head:
        return probs * per_key
    return torch.einsum("bhqk,bhqk->bqk", probs, per_key)


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
        direct: The embedding's direct term ``(B, T)``.
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
    trace: ModelTrace, direction: torch.Tensor, per_head: bool = False, parts: bool = True, rows: slice = slice(None)
) -> LogitSweep:
    """Carry :math:`u` from the logit down the decoder's residual stream, splitting the logit on the way (attention
    parts per head with ``per_head``: ``(B, H, T, K)`` each; none with ``parts=False``, for the directions only).
    ``direction`` may hold the logits of some query positions only, ``rows``: every result then holds those rows."""
    spec, stack = trace.spec, trace.decoder
    terms = {name: direction.new_zeros(direction.shape[:-1]) for name in UNATTRIBUTED_TERMS}
    direction = direction * spec.logits_scale
    if spec.decoder.final_norm is not None:
        direction = _through_norm(spec.decoder.final_norm, stack.final_norm_input, direction, terms, rows)
    self_parts, cross_parts, branches = [], [], []
    for layer, record in reversed(list(zip(spec.decoder.layers, stack.layers, strict=True))):
        branches.insert(0, {})
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
            terms["attention_bias"] += _dot(branch, attn.out_bias)
            if parts:
                collected.insert(0, attention_logit_parts(attn, attn_record, branch, per_head, rows))
            branches[0][name] = branch
    direct = _dot(direction, upcast(stack.layers[0].input[:, rows]))
    return LogitSweep(self_parts, cross_parts, direct, terms, branches)


def _from_row(value: torch.Tensor, first_row: int, axis: int) -> torch.Tensor:
    """Rows ``first_row:`` of a query axis (``-1`` or ``-2``) padded back to every row, the first ones 0."""
    if not first_row:
        return value
    return torch.nn.functional.pad(value, (0, 0) * (-1 - axis) + (first_row, 0))


def _below(rollouts: torch.Tensor, first: torch.Tensor, layers: int) -> torch.Tensor:
    """Rollouts of the layers below each of ``layers`` layers: ``first`` for layer 0, then depths 0 .. L-2 (the
    last layer's rollout, if given, is read by nothing)."""
    return torch.cat([first[:, None], rollouts[:, : layers - 1]], dim=1)


@torch.no_grad()
def alti_logit(
    trace: ModelTrace,
    target_ids: torch.Tensor,
    foil_ids: torch.Tensor | None = None,
    scores: AltiScores | None = None,
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    per_head: bool = False,
    first_row: int = 0,
) -> AltiLogitScores:
    """ALTI-logit scores of the token predicted at every position.

    Only what the scores read is computed: the ALTI maps of the layers below the last (a layer's parts are traced
    back through the rollout of the layers below it) and, with ``first_row``, the logit directions and parts of the
    rows from it on.

    Args:
        trace: A recorded forward pass.
        target_ids: ``(B, T)``: the token whose logit is explained at each position (usually the next token).
        foil_ids: ``(B, T)``: contrast tokens; explains ``logit(target) - logit(foil)``.
        scores: Precomputed ALTI maps of ``trace`` (with encoder maps for encoder–decoders).
        max_chunk_elements: Memory bound of one chunk of ALTI parts.
        per_head: Also split the token scores by attention head (``target_heads``, ``source_heads``).
        first_row: Positions before it (a prompt's, which nothing reads) are not explained: their rows and terms are
            0 (``logit`` is still every position's).

    Returns:
        :class:`AltiLogitScores`; ``target.sum(-1) + source.sum(-1) + sum(unattributed) == logit`` (from
        ``first_row`` on).
    """
    if not trace.spec.explains_logits:
        raise ValueError(NO_HEAD.format(method="ALTI-logit"))
    layers = len(trace.spec.decoder.layers)
    below_last = max(layers - 1, 1)  # (a one-layer model reads no map: the smallest stack is computed)
    scores = scores or alti(trace, True, max_chunk_elements=max_chunk_elements, decoder_layers=below_last)
    direction, bias = readout(trace, target_ids, foil_ids)
    rows = slice(first_row, None)
    sweep = sweep_logit(trace, direction[:, rows], per_head, rows=rows)
    sweep.unattributed = {name: _from_row(term, first_row, -1) for name, term in sweep.unattributed.items()}
    sweep.unattributed["logit_bias"] = _from_row(bias[:, rows], first_row, -1)
    sweep.direct = _from_row(sweep.direct, first_row, -1)
    rolled = alti_rollouts(scores)
    self_parts = _from_row(torch.stack(sweep.self_parts, dim=1), first_row, -2)  # (B, L, [H,] T, T)
    heads = "h" if per_head else ""
    identity = torch.eye(self_parts.shape[-1], device=self_parts.device).expand_as(rolled.target[:, 0])
    below = _below(rolled.target, identity, layers)
    target_terms = torch.einsum(f"bl{heads}tj,bljs->bl{heads}ts", self_parts, below)
    source_terms = None
    if rolled.source is not None:
        no_source = torch.zeros_like(rolled.source[:, 0])
        below = _below(rolled.source, no_source, layers)
        from_self = torch.einsum(f"bl{heads}tj,bljs->bl{heads}ts", self_parts, below)
        cross_parts = _from_row(torch.stack(sweep.cross_parts, 1), first_row, -2)
        from_cross = torch.einsum(f"bl{heads}tj,bjs->bl{heads}ts", cross_parts, rolled.encoder)
        source_terms = torch.stack([from_self, from_cross], dim=1)  # (B, 2, L, [H,] T, S)
    target = torch.diag_embed(sweep.direct) + target_terms.flatten(1, 1 + per_head).sum(1)
    source = None if source_terms is None else source_terms.flatten(1, 2 + per_head).sum(1)
    refuse_non_finite("ALTI-logit", target, source, *sweep.unattributed.values())
    real = trace.decoder.mask[..., None]
    if per_head:
        mask = trace.decoder.mask[:, None, None, :, None]
        target_heads = target_terms * mask
        source_heads = None if source_terms is None else source_terms * mask[:, None]
    else:
        target_heads = source_heads = None
    return AltiLogitScores(
        direct=sweep.direct * trace.decoder.mask,
        target_heads=target_heads,
        source_heads=source_heads,
        target=target * real,
        source=None if source is None else source * real,
        unattributed={name: term * trace.decoder.mask for name, term in sweep.unattributed.items()},
        logit=recorded_logit(trace, target_ids, foil_ids) * trace.decoder.mask,
        logit_after_softcap=masked(softcapped_logit(trace, target_ids, foil_ids), trace.decoder.mask),
    )


def masked(value: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor | None:
    """``value`` zeroed at padding, or None."""
    return None if value is None else value * mask
