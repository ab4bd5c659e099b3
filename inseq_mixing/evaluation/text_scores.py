"""Scoring shared by the text protocols of generation and encoder-only models: each protocol's metric over the
explained items and its random baseline (definitions in :mod:`.metrics`)."""

import torch

from .explain import Explanation, is_per_layer
from .items import Item
from .metrics import (
    Statistic,
    alignment_counts,
    cue_share,
    mean_statistic,
    random_reciprocal_rank,
    reciprocal_rank,
)
from .scores import MethodResult


def score_evidence(explained: list[Explanation]) -> MethodResult:
    ranks = [
        reciprocal_rank(explanation.context_scores(explanation.explained_columns()), explanation.item.marks)
        for explanation in explained
    ]
    return MethodResult({"mrr": mean_statistic(ranks)})


def score_cue(explained: list[Explanation]) -> MethodResult:
    shares = []
    for explanation in explained:
        per_layer = is_per_layer(explanation.seq)
        scores = explanation.context_scores(explanation.explained_columns(), per_layer=per_layer)
        shares.append(cue_share(scores, explanation.item.marks).nan_to_num(0.0))
    if shares[0].dim() == 0:
        return MethodResult({"cue_contribution": mean_statistic(torch.stack(shares))})
    layers = torch.stack(shares)  # (items, layers)
    result = MethodResult({"cue_contribution": mean_statistic(layers.mean(1))})
    result.layer_statistics = [mean_statistic(layers[:, layer]) for layer in range(layers.shape[1])]
    result.per_layer = Statistic(layers.T, torch.ones_like(layers.T))
    return result


def score_alignment(explained: list[Explanation]) -> MethodResult:
    counts = [alignment_counts(explanation.source_target_scores(), explanation.item.gold) for explanation in explained]

    def column(name: str) -> torch.Tensor:
        return torch.tensor([getattr(count, name) for count in counts], dtype=torch.float64)

    return MethodResult(
        {
            "aer": Statistic(column("overlap2"), column("size"), "one_minus"),
            "accuracy": Statistic(column("hits"), column("aligned_words")),
        }
    )


SCORERS = {"evidence": score_evidence, "cue": score_cue, "alignment": score_alignment}


def evidence_baseline(items: list[Item]) -> dict[str, float]:
    values = [random_reciprocal_rank(len(item.context_words), len(item.marks)) for item in items]
    return {"mrr": sum(values) / len(values)}


def cue_baseline(items: list[Item]) -> dict[str, float]:
    values = [len(item.marks) / len(item.context_words) for item in items]
    return {"cue_contribution": sum(values) / len(values)}


def alignment_baseline(items: list[Item]) -> dict[str, float]:
    """What a uniformly random source word per target word scores: its expected top-1 accuracy, and its AER over the
    corpus, ``1 − 2 E|A ∩ G| / (|A| + |G|)`` (every target word gets one predicted link, so ``|A|`` is fixed)."""
    hits = aligned = overlap = size = 0.0
    for item in items:
        num_source = len(item.source.split())
        for target in {target for _, target in item.gold}:
            hits += sum(1 for _, t in item.gold if t == target) / num_source
            aligned += 1
        overlap += len(item.gold) / num_source
        size += len(item.target.split()) + len(item.gold)
    return {"aer": 1 - 2 * overlap / size, "accuracy": hits / aligned}


BASELINES = {"evidence": evidence_baseline, "cue": cue_baseline, "alignment": alignment_baseline}
