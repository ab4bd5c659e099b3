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

**One layer's map at a time.** With :math:`R^{l-1} = C^{l-1} \cdots C^0`, the sum is computed top-down in Horner's
form, :math:`(\ldots((\Delta^{L-1} C^{L-2} + \Delta^{L-2}) C^{L-3} + \Delta^{L-3}) \cdots) C^0 + \Delta^0`: each
layer's ALTI map :math:`C^l` is computed when the walk reaches it and dropped after one product with the explained
rows, so the method holds one ``T × T`` map and the rows' ``k × T`` scores instead of every layer's maps and every
depth's rollout (``2 L T²``), and multiplies ``k × T × T`` per layer instead of rolling ``T × T`` maps out
(``L T³``). Decoder-only and encoder-only stacks; encoder–decoders' joint rollout and the per-head split keep the
rollouts of every depth.

Encoder–decoders (our extension of the paper, which covers decoder-only models): decoder self-attention parts travel
through the ALTI+ decoder rollout over [source; target] of the layers below, cross-attention parts through the final
encoder rollout. Post-LN models (Marian, BART) carry :math:`u` through every later norm's frozen map. A norm on an
attention output (Gemma 2 / 3's sandwich, OLMo-2; our extension) sits on the branch only: the attention parts are
dotted with :math:`A^\top g` (its frozen map :math:`A`), the residual keeps :math:`g`.

Encoder-only models (masked LMs, classifiers; our extension: the paper covers decoder-only models) are one non-causal
stack; the head between the final hidden state and the logit is frozen at the forward pass (:mod:`.head`), so
:math:`u_t` is the frozen head's direction.

A vector the stack adds to a position between its blocks (Qwen3-VL's DeepStack features; our extension) is that
position's own, as its embedding is: its dot product with the direction there joins the direct term; the ALTI maps of
the rollout read it as part of the position's residual stream at the next block, as they read an FFN's output.

A final logit soft-cap :math:`c \tanh(z / c)` (Gemma 2) is not linear: the method explains :math:`z`, the logit before
the cap, and reports the capped value beside it.
"""

from dataclasses import dataclass, field

import torch

from ..trace import ModelTrace
from .alti import DEFAULT_CHUNK_ELEMENTS, AltiScores, alti, alti_rollouts, stack_contributions
from .blocks import refuse_non_finite
from .readout import NO_HEAD, masked, readout, recorded_logit, softcapped_logit, sweep_logit


@dataclass
class AltiLogitScores:
    """Signed logit contributions for the token predicted at every position.

    Attributes:
        target: ``(B, T, T)``: contribution of target-prefix token ``j`` (decoder-only: any token) to the logit at
            position ``t``; 0 for ``j > t`` and padding.
        source: ``(B, T, S)``: contribution of source token ``s`` (encoder–decoders).
        unattributed: Terms not attributed to tokens, each ``(B, T)`` (see :data:`~.readout.UNATTRIBUTED_TERMS`).
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
    streamed = scores is None and not per_head and trace.encoder is None  # one layer's map at a time
    if not streamed:
        scores = scores or alti(trace, True, max_chunk_elements=max_chunk_elements, decoder_layers=below_last)
    direction, bias = readout(trace, target_ids, foil_ids)
    rows = slice(first_row, None)
    folded = {}  # streamed: the parts folded top-down through each layer's map in the sweep's pass

    def fold(index: int, parts: torch.Tensor) -> None:
        folded["rolled"] = parts if not folded else _folded(trace, folded["rolled"], index, parts, max_chunk_elements)

    sweep = sweep_logit(trace, direction[:, rows], per_head, rows=rows, on_layer=fold if streamed else None)
    sweep.unattributed = {name: _from_row(term, first_row, -1) for name, term in sweep.unattributed.items()}
    sweep.unattributed["logit_bias"] = _from_row(bias[:, rows], first_row, -1)
    sweep.direct = _from_row(sweep.direct, first_row, -1)
    if streamed:
        target = torch.diag_embed(sweep.direct) + _from_row(folded["rolled"], first_row, -2)
        return _scores(trace, target_ids, foil_ids, sweep, target)
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
    if per_head:
        mask = trace.decoder.mask[:, None, None, :, None]
        target_heads = target_terms * mask
        source_heads = None if source_terms is None else source_terms * mask[:, None]
    else:
        target_heads = source_heads = None
    return _scores(trace, target_ids, foil_ids, sweep, target, source, target_heads, source_heads)


def _folded(trace: ModelTrace, rolled: torch.Tensor, index: int, parts: torch.Tensor,
            max_chunk_elements: int) -> torch.Tensor:  # fmt: skip
    r"""One step of :math:`\sum_l P^l R^{l-1}` in Horner's form top-down (see the module docstring): what the layers
    above ``index`` gave, ``rolled`` ``(B, rows, T)``, through layer ``index``'s ALTI map (computed here, dropped after
    one product), plus that layer's parts."""
    spec, stack = trace.spec, trace.decoder
    layer_map = stack_contributions(spec.decoder, stack, "self", stack.mask, max_chunk_elements,
                                    layers=slice(index, index + 1))[:, 0]  # fmt: skip
    return rolled @ layer_map + parts


def _scores(trace, target_ids, foil_ids, sweep, target, source=None, target_heads=None, source_heads=None):
    """The method's result from its token scores and the sweep's terms, padding and checks applied."""
    refuse_non_finite("ALTI-logit", target, source, *sweep.unattributed.values())
    real = trace.decoder.mask[..., None]
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
