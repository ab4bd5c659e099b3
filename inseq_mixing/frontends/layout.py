"""Inseq's output layout, for every front end: the Inseq adapter, the encoder-only and the speech front ends (and the
next one) lay their scores out here and nowhere else.

The method math returns maps ``(B, [slots,] positions i, tokens j)``: row ``i`` is what position ``i`` (its
representation, or the logit read there) is made of, one column per token ``j``; the optional ``slots`` axis holds
layers, heads or components (the result's ``axis`` labels it). Inseq stores a sequence's scores the other way round,
``(tokens j, explained i[, slots])``, with NaN on the cells a causal decoder cannot fill (a token after the explained
position). Logit methods also give the model's own logit and the terms outside the tokens (biases, the unattributed
remainder); they go into the step scores so that token scores plus terms equal the logit.

No math, and nothing a front end decides (which positions are explained, how tokens are labelled): a front end picks
the rows and the labels, this module only arranges them.
"""

import torch

from ..methods.blocks import upcast


def inseq_layout(scores: torch.Tensor, causal: bool) -> torch.Tensor:
    """A batch of maps ``(B, [slots,] positions i, tokens j)`` as Inseq's ``(B, tokens j, positions i[, slots])``,
    upcast and on the host; ``causal`` maps get NaN where ``j > i`` (Inseq's mark of a causally impossible cell)."""
    scores = scores.permute(0, 3, 2, 1) if scores.ndim == 4 else scores.transpose(1, 2)
    scores = upcast(scores.detach()).cpu().clone()
    if causal:
        future = torch.ones(scores.shape[1:3], dtype=torch.bool).tril(-1)  # rows j > columns i
        scores[:, future] = float("nan")
    return scores


def tokens_first(rows: torch.Tensor) -> torch.Tensor:
    """One sequence's rows ``([slots,] explained, tokens)`` as Inseq's ``(tokens, explained[, slots])``."""
    return inseq_layout(rows[None], causal=False)[0].contiguous()


def decoder_layout(scores: torch.Tensor, cells: list[int], tokens: int) -> torch.Tensor:
    """A decoder's map over its own text ``([slots,] positions i, tokens j)`` as Inseq's ``(target tokens,
    generated[, slots])``: generated token ``c`` is predicted at position ``cells[c]`` from the ``tokens`` before it;
    the cells of later tokens are NaN."""
    rows = tokens_first(scores[..., cells, : tokens - 1])  # (tokens - 1, generated[, slots])
    padded = torch.full((tokens, *rows.shape[1:]), float("nan"), dtype=rows.dtype)
    padded[: tokens - 1] = rows
    future = torch.arange(tokens)[:, None] > torch.tensor(cells)[None, :]
    padded[future] = float("nan")
    return padded


def logit_step_scores(result, contrastive: bool) -> dict[str, torch.Tensor]:
    """A logit method's step scores ``(B, positions)``: every term outside the tokens, and the model's own logit,
    named ``logit`` (``contrast_logits_diff``: the logit of the target minus the foil's) with, for a soft-capped
    model, the capped value (``..._after_softcap``: the contributions add up to the logit before the cap)."""
    name = "contrast_logits_diff" if contrastive else "logit"
    steps = {**result.terms, name: result.logit}
    if result.logit_after_softcap is not None:
        steps[f"{name}_after_softcap"] = result.logit_after_softcap
    return steps


def row_steps(steps: dict[str, torch.Tensor], row: int, cells: list[int]) -> dict[str, torch.Tensor]:
    """One sequence's step scores: row ``row``'s values at its explained ``cells``, upcast and on the host."""
    return {name: upcast(value[row, cells].detach()).cpu() for name, value in steps.items()}


def token_list(labels: list[str], ids: list[int]) -> list:
    """Inseq's tokens (``TokenWithId``) from their labels and ids."""
    from inseq.utils.typing import TokenWithId

    return [TokenWithId(label, idx) for label, idx in zip(labels, ids, strict=True)]


def sequence_output(
    source: list | None,
    target: list,
    source_attributions: torch.Tensor | None,
    *,
    signed: bool,
    target_attributions: torch.Tensor | None = None,
    step_scores: dict[str, torch.Tensor] | None = None,
    sequence_scores: dict[str, torch.Tensor] | None = None,
    start: int = 0,
    stop: int | None = None,
):
    """One sequence's Inseq output: signed scores (logit contributions) or maps, with as many extra dimensions as the
    scores have axes beyond (tokens, explained); ``start``/``stop``: the explained entries among ``target``."""
    from .sequences import MixingSequenceOutput, SignedMixingSequenceOutput

    scores = source_attributions if source_attributions is not None else target_attributions
    cls = SignedMixingSequenceOutput if signed else MixingSequenceOutput
    return cls(
        source=source,
        target=target,
        source_attributions=source_attributions,
        target_attributions=target_attributions,
        step_scores=step_scores or {},
        sequence_scores=sequence_scores or {},
        attr_pos_start=start,
        attr_pos_end=len(target) if stop is None else stop,
        _num_dimensions=scores.ndim - 2,
    )
