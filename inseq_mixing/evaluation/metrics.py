"""The metrics of the papers' evaluation protocols, on word-level scores, and their statistics.

* **Reciprocal rank of the evidence** (Ferrando et al., ACL 2023, ALTI-logit): rank the context words by score,
  highest first; the item's score is ``1 / rank`` of the best-ranked evidence word. Ties share the mean of the ranks
  they span (a word tied with ``t`` others at ranks ``r .. r + t`` gets rank ``r + t / 2``), so a method that gives
  every word the same score gets the rank a random ranking gets on average for a single evidence word.
* **Cue contribution** (Mohebbi et al., EACL 2023, Value Zeroing): the share of a target's context-mixing scores that
  lands on its cue words, ``Σ_{w ∈ cues} |s_w| / Σ_{w ∈ context} |s_w|`` (absolute values, so that signed logit
  methods give a share in [0, 1]).
* **Alignment error rate** (Och & Ney, 2003, as used by Ferrando et al., EMNLP 2022, ALTI+): every gold link is
  "sure", ``AER = 1 − 2 |A ∩ G| / (|A| + |G|)`` over the whole corpus, where ``A`` links each target word to the source
  word with the highest score; **top-1 accuracy** is the share of gold-aligned target words whose predicted source
  word is one of their gold ones.

Every metric is a ratio of per-item sums, ``f(Σ num / Σ den)`` (``den`` = 1 for per-item means), so one bootstrap
and one paired test serve them all: items are resampled (or swapped between methods) as units.
"""

import math
from dataclasses import dataclass

import torch


def tied_ranks(scores: torch.Tensor) -> torch.Tensor:
    """1-based ranks of ``scores`` (highest first), tied values sharing the mean of their ranks."""
    scores = scores.double()
    higher = (scores[None, :] > scores[:, None]).sum(1)
    equal = (scores[None, :] == scores[:, None]).sum(1)
    return higher + (equal + 1).double() / 2


def reciprocal_rank(scores: torch.Tensor, evidence: list[int]) -> float:
    """``1 / rank`` of the best-ranked evidence word among ``scores`` (one per context word)."""
    if not evidence:
        raise ValueError("An item needs at least one evidence word.")
    return float(1 / tied_ranks(scores)[evidence].min())


def random_reciprocal_rank(num_words: int, num_evidence: int) -> float:
    """Expected reciprocal rank of the best of ``num_evidence`` evidence words under a uniform random ranking of
    ``num_words`` words: ``Σ_r (1/r) · C(n − r, m − 1) / C(n, m)``."""
    total = math.comb(num_words, num_evidence)
    return sum(
        math.comb(num_words - rank, num_evidence - 1) / total / rank for rank in range(1, num_words - num_evidence + 2)
    )


def cue_share(scores: torch.Tensor, cues: list[int]) -> torch.Tensor:
    """Share of ``|scores|`` on the cue words; ``scores`` is ``(words,)`` or ``(words, layers)``. NaN if all are 0."""
    magnitude = scores.double().abs()
    total = magnitude.sum(0)
    return magnitude[cues].sum(0) / total.where(total > 0, torch.tensor(float("nan"), dtype=total.dtype))


def parse_pharaoh(text: str) -> set[tuple[int, int]]:
    """Gold links from Pharaoh format ``"0-0 1-2 2-1"`` (source word - target word, 0-based); ``p`` links
    (``"1p2"``, possible) count as gold too."""
    links = set()
    for pair in str(text).split():
        separator = "-" if "-" in pair else "p"
        source, _, target = pair.partition(separator)
        if not (source.isdigit() and target.isdigit()):
            raise ValueError(f"{pair!r} is not a Pharaoh link 'source-target' of two word indices")
        links.add((int(source), int(target)))
    return links


@dataclass
class AlignmentCounts:
    """Per-item counts for AER and top-1 accuracy: ``2|A ∩ G|``, ``|A| + |G|``, correct and gold-aligned words."""

    overlap2: int
    size: int
    hits: int
    aligned_words: int


def alignment_counts(word_scores: torch.Tensor, gold: set[tuple[int, int]]) -> AlignmentCounts:
    """Counts of one sentence pair from its ``(source words, target words)`` scores: each target word's predicted link
    is its highest-scoring source word (the first one on ties)."""
    predicted = {(int(word_scores[:, target].argmax()), target) for target in range(word_scores.shape[1])}
    gold_targets = {target for _, target in gold}
    hits = sum((source, target) in gold for source, target in predicted if target in gold_targets)
    overlap = len(predicted & gold)
    return AlignmentCounts(2 * overlap, len(predicted) + len(gold), hits, len(gold_targets))


@dataclass
class Statistic:
    """A metric over items as ``transform(Σ num / Σ den)``; ``transform`` is ``"identity"`` or ``"one_minus"``."""

    num: torch.Tensor
    den: torch.Tensor
    transform: str = "identity"

    def value(self, index: torch.Tensor | None = None) -> torch.Tensor:
        """The metric (``index``: resampled items, ``(draws, items)``; one value per draw)."""
        num, den = (self.num, self.den) if index is None else (self.num[index], self.den[index])
        ratio = num.sum(-1) / den.sum(-1)
        return 1 - ratio if self.transform == "one_minus" else ratio

    def __len__(self) -> int:
        return len(self.num)


def nan_mean(values) -> float:
    """The mean of the values that are not NaN (NaN when none is)."""
    values = [value for value in values if not math.isnan(value)]
    return sum(values) / len(values) if values else float("nan")


def mean_statistic(values) -> Statistic:
    """The mean of per-item values."""
    values = torch.as_tensor(values, dtype=torch.float64)
    return Statistic(values, torch.ones_like(values))


def bootstrap_interval(
    statistic: Statistic, draws: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the metric, resampling items with replacement (``(nan, nan)`` without items
    or draws: see :func:`is_degenerate`)."""
    if len(statistic) == 0 or draws < 1:
        return float("nan"), float("nan")
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(len(statistic), (draws, len(statistic)), generator=generator)
    values = statistic.value(index)
    tail = (1 - level) / 2
    low, high = torch.quantile(values, torch.tensor([tail, 1 - tail], dtype=values.dtype))
    return float(low), float(high)


def is_degenerate(statistic: Statistic, interval) -> bool:
    """Whether a bootstrap interval says nothing about the spread: fewer than two items, an undefined bound, or no
    spread among the resamples (every item alike)."""
    low, high = interval
    return len(statistic) < 2 or math.isnan(low) or math.isnan(high) or low == high


def paired_permutation_test(first: Statistic, second: Statistic, draws: int = 1000, seed: int = 0) -> float:
    """Two-sided p-value of the difference between two methods' metrics on the same items: each item's pair of
    values is swapped between the methods at random, ``p = (1 + #{|Δ*| ≥ |Δ|}) / (1 + draws)``."""
    if len(first) != len(second):
        raise ValueError("A paired test needs both methods scored on the same items.")
    observed = abs(float(first.value() - second.value()))
    generator = torch.Generator().manual_seed(seed)
    swap = torch.rand(draws, len(first), generator=generator) < 0.5

    def permuted(mine: Statistic, other: Statistic) -> Statistic:
        return Statistic(
            torch.where(swap, other.num, mine.num), torch.where(swap, other.den, mine.den), mine.transform
        )

    differences = (permuted(first, second).value() - permuted(second, first).value()).abs()
    return float((1 + (differences >= observed - 1e-12).sum()) / (1 + draws))


def defined_mean(values: list[float]) -> Statistic:
    """The mean over the images where the value is defined (a gold share without positive scores is not): the
    others weigh 0, so that every method keeps one entry per image for the paired tests."""
    values = torch.as_tensor(values, dtype=torch.float64)
    defined = values.isfinite()
    return Statistic(values.nan_to_num(0.0) * defined, defined.double())


#: What deletion and insertion curves over ranked items give (:func:`ranking_metrics`).
CURVE_METRICS = ("deletion_auc", "insertion_auc", "comprehensiveness_prob", "sufficiency_prob")


def ranking_metrics(read, ranking: torch.Tensor, patches: int, steps: int) -> dict:
    """The deletion and insertion curves of one ranking of ``patches`` items (highest first; image patches, a
    vision-language decoder's image tokens) and the metrics read from them (:data:`CURVE_METRICS`); ``read(kept)``
    gives the explained probability (first of what it returns) for masks ``(n, patches)`` of the items kept."""
    counts = [round(patches * step / steps) for step in range(steps + 1)]
    masks = []  # per curve point: the patches kept
    for inserted in (False, True):  # deletion, insertion
        for count in counts:
            kept = torch.full((patches,), not inserted)  # deletion starts from the image, insertion from none of it
            kept[ranking[:count]] = inserted
            masks.append(kept)
    probability = read(torch.stack(masks))[0].reshape(2, len(counts))
    fractions = torch.tensor(counts, dtype=torch.float64) / patches
    deletion, insertion = probability.double()
    original = deletion[0]
    inner = slice(1, steps)  # the fractions strictly between 0 and 1
    return {
        "deletion_auc": float(torch.trapezoid(deletion, fractions)),
        "insertion_auc": float(torch.trapezoid(insertion, fractions)),
        "comprehensiveness_prob": float((original - deletion[inner]).mean()),
        "sufficiency_prob": float((original - insertion[inner]).mean()),
    }
