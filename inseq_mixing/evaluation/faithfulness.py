"""Faithfulness of token attributions by perturbation: comprehensiveness and sufficiency as areas over the
perturbation curve (AOPC, DeYoung et al., ACL 2020, "ERASER"), with a random-ranking baseline, and rank agreement
between methods.

For a generated token at target position ``p`` and a ranking of its candidate context tokens (source tokens and the
target prefix before ``p``), replacing the top ``k%`` with a replacement token and re-running the model teacher-forced
gives the drop in the token's probability (and logit): **comprehensiveness**. Keeping only the top ``k%`` (replacing
the rest) gives **sufficiency**. Each is averaged over the ``k`` bins. Higher comprehensiveness and lower sufficiency
mean a more faithful ranking; a random ranking is the baseline.
"""

import math
from dataclasses import dataclass

import torch

DEFAULT_FRACTIONS = (0.1, 0.2, 0.3, 0.5)


@dataclass
class TokenExample:
    """One generated token to evaluate, with its context ids.

    Attributes:
        source_ids: Source ids ``(S,)`` of an encoder–decoder, or None for decoder-only models.
        target_ids: Target ids ``(T,)`` (encoder–decoders: starting with the decoder start token; decoder-only: the
            whole sequence).
        position: Index in ``target_ids`` of the explained token.
        candidates: Which context tokens may be ranked and replaced: a bool mask over ``[source; target[:position]]``.
    """

    source_ids: torch.Tensor | None
    target_ids: torch.Tensor
    position: int
    candidates: torch.Tensor

    @property
    def context_ids(self) -> torch.Tensor:
        prefix = self.target_ids[: self.position]
        return prefix if self.source_ids is None else torch.cat([self.source_ids, prefix])


def perturbed_contexts(example: TokenExample, ranking: torch.Tensor, fractions, replacement_id: int):
    """Context ids with the top-k ranked candidates replaced (comprehensiveness) and with all but them replaced
    (sufficiency), one row per fraction: two ``(len(fractions), context)`` tensors."""
    candidates = example.candidates.nonzero().squeeze(-1)
    ordered = candidates[ranking]
    context = example.context_ids
    removed, kept = context.repeat(len(fractions), 1), context.repeat(len(fractions), 1)
    for row, fraction in enumerate(fractions):
        top = ordered[: math.ceil(fraction * len(ordered))]
        removed[row, top] = replacement_id
        rest = candidates[~torch.isin(candidates, top)]
        kept[row, rest] = replacement_id
    return removed, kept


@torch.no_grad()
def target_scores(model, example: TokenExample, contexts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Probability and logit of the explained token for each row of context ids (teacher-forced)."""
    token = example.target_ids[example.position]
    contexts = contexts.to(next(model.parameters()).device)
    if example.source_ids is None:
        logits = model(input_ids=contexts).logits[:, -1]
    else:
        num_source = len(example.source_ids)
        logits = model(input_ids=contexts[:, :num_source], decoder_input_ids=contexts[:, num_source:]).logits[:, -1]
    logits = logits.float()
    return logits.softmax(-1)[:, token], logits[:, token]


AOPC_KEYS = ("comprehensiveness_prob", "comprehensiveness_logit", "sufficiency_prob", "sufficiency_logit")


def aopc(
    model,
    example: TokenExample,
    ranking: torch.Tensor,
    fractions,
    replacement_id: int,
    original: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict[str, float]:
    """Comprehensiveness and sufficiency (probability and logit drops, averaged over fractions) of one ranking.

    ``original`` is the unperturbed ``(probability, logit)`` from :func:`target_scores`, if already computed.
    """
    removed, kept = perturbed_contexts(example, ranking, fractions, replacement_id)
    original = original or target_scores(model, example, example.context_ids[None])
    return aopc_scores(lambda contexts: target_scores(model, example, contexts), removed, kept, original)


def aopc_scores(read, removed, kept, original: tuple[torch.Tensor, torch.Tensor]) -> dict[str, float]:
    """The AOPC of one ranking, whatever the perturbation: comprehensiveness, the mean drop of the explained
    probability and logit over the inputs ``removed`` (the top of the ranking taken out, one per fraction), and
    sufficiency, the mean drop over the inputs ``kept`` (only the top kept). ``read(inputs) -> (probability, logit)``
    reads the model on a batch of perturbed inputs; ``original`` is its reading of the unperturbed input. Generation
    models replace tokens (:func:`aopc`); encoder-only models delete them and speech models silence units
    (:func:`removal_faithfulness`)."""
    original_prob, original_logit = original
    scores = {}
    for name, inputs in (("comprehensiveness", removed), ("sufficiency", kept)):
        prob, logit = read(inputs)
        scores[f"{name}_prob"] = float((original_prob - prob).mean())
        scores[f"{name}_logit"] = float((original_logit - logit).mean())
    return scores


def removal_faithfulness(read, scores: torch.Tensor, candidates: torch.Tensor, fractions, random_draws: int,
                         generator: torch.Generator) -> dict[str, float]:  # fmt: skip
    """AOPC by removal, for inputs whose items are taken out rather than replaced (an encoder's tokens deleted, a
    speech model's units silenced): the ranking of the ``candidates`` by ``scores`` (highest first) and
    ``random_draws`` random rankings of them (``random_*`` keys, averaged).

    Args:
        read: ``read(kept) -> (probability, logit)`` of the explained output for a batch of masks ``(rows, items)``
            of the items kept (True) and removed (False).
        scores: One score per item.
        candidates: Which items may be removed ``(items,)``; the others are always kept.
        fractions: The fractions of the candidates removed (comprehensiveness) or kept alone (sufficiency).
        random_draws: Random rankings (the baseline).
        generator: Draws the random rankings (shared by every method, so that they are the same for each).
    """
    length = len(candidates)
    original = read(torch.ones(1, length, dtype=torch.bool))
    order = candidates.nonzero().squeeze(-1)
    ranked = order[torch.argsort(scores[order], descending=True, stable=True)]
    result = _removal_aopc(read, ranked, order, length, fractions, original)
    draws = [
        _removal_aopc(read, order[torch.randperm(len(order), generator=generator)], order, length, fractions, original)
        for _ in range(random_draws)
    ]
    result.update({f"random_{key}": sum(draw[key] for draw in draws) / max(1, len(draws)) for key in AOPC_KEYS})
    return result


def _removal_aopc(read, ranked: torch.Tensor, candidates: torch.Tensor, length: int, fractions, original):
    """Comprehensiveness (the top ``k%`` of ``ranked`` removed) and sufficiency (only they kept among the
    candidates), averaged over ``fractions``."""
    removed, kept = [], []
    for fraction in fractions:
        top = ranked[: math.ceil(fraction * len(ranked))]
        without = torch.ones(length, dtype=torch.bool)
        without[top] = False
        removed.append(without)
        only = torch.ones(length, dtype=torch.bool)
        only[candidates[~torch.isin(candidates, top)]] = False
        kept.append(only)
    return aopc_scores(read, torch.stack(removed), torch.stack(kept), original)


def random_baseline(
    model, example: TokenExample, fractions, replacement_id: int, draws: int, seed: int = 0, original=None
) -> dict[str, float]:
    """:func:`aopc` averaged over ``draws`` random rankings of the candidates (``random_*`` keys; 0 without draws).

    It does not depend on any method's scores, so a comparison computes it once per generated token.
    """
    generator = torch.Generator().manual_seed(seed)
    num_candidates = int(example.candidates.sum())
    runs = [
        aopc(model, example, torch.randperm(num_candidates, generator=generator), fractions, replacement_id, original)
        for _ in range(draws)
    ]
    return {f"random_{key}": sum(run[key] for run in runs) / max(1, len(runs)) for key in AOPC_KEYS}


def faithfulness(
    model,
    example: TokenExample,
    scores: torch.Tensor,
    fractions=DEFAULT_FRACTIONS,
    replacement_id: int = 2,
    random_draws: int = 3,
    seed: int = 0,
    baseline: dict[str, float] | None = None,
    original: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict[str, float]:
    """AOPC comprehensiveness and sufficiency of the ranking given by ``scores`` (one per candidate, highest first),
    and the same for ``random_draws`` random rankings (``random_*`` keys, averaged).

    ``baseline`` (from :func:`random_baseline`) and ``original`` (from :func:`target_scores`) skip recomputing what
    every method shares for the same token.
    """
    if len(scores) != int(example.candidates.sum()):
        raise ValueError(f"Got {len(scores)} scores for {int(example.candidates.sum())} candidate tokens.")
    original = original or target_scores(model, example, example.context_ids[None])
    ranking = torch.argsort(scores, descending=True, stable=True)
    result = aopc(model, example, ranking, fractions, replacement_id, original)
    if baseline is None:
        baseline = random_baseline(model, example, fractions, replacement_id, random_draws, seed, original)
    return {**result, **baseline}


def rank_correlation(first: torch.Tensor, second: torch.Tensor) -> float:
    """Spearman rank correlation of two score vectors (ties broken by position); NaN below two items."""
    if len(first) < 2:
        return float("nan")
    ranks = [torch.argsort(torch.argsort(values, stable=True)).double() for values in (first, second)]
    centred = [rank - rank.mean() for rank in ranks]
    return float((centred[0] * centred[1]).sum() / (centred[0].norm() * centred[1].norm()))
