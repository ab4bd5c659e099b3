"""What :func:`~.evaluate.evaluate` returns, for every kind of model: each method's statistics, the paired tests
between methods, and the one loop that scores each method and keeps the ones that failed. Below :mod:`.evaluate`
and :mod:`.speech`, which both fill it."""

import json
from dataclasses import dataclass, field
from functools import cached_property
from itertools import combinations
from pathlib import Path

from .comparison import each_method
from .explain import Explanation
from .items import Skipped
from .metrics import Statistic, bootstrap_interval, is_degenerate, mean_statistic, nan_mean, paired_permutation_test

#: The headline metric of each protocol (the first of its metrics).
METRICS = {
    "evidence": ("mrr",),
    "cue": ("cue_contribution",),
    "alignment": ("aer", "accuracy"),
    "faithfulness": ("comprehensiveness_prob", "sufficiency_prob", "comprehensiveness_logit", "sufficiency_logit"),
}
#: Metrics where lower is better.
LOWER_IS_BETTER = {"aer", "sufficiency_prob", "sufficiency_logit", "deletion_auc"}


@dataclass
class MethodResult:
    """One method's scores: per metric a :class:`~.metrics.Statistic` over the items, and for per-layer methods
    under the ``cue`` protocol the per-layer cue contributions."""

    statistics: dict[str, Statistic]
    per_layer: Statistic | None = None
    layer_statistics: list[Statistic] = field(default_factory=list)


@dataclass
class Evaluation:
    """The result of :func:`evaluate`.

    Attributes:
        protocol: The protocol.
        results: Method → :class:`MethodResult`.
        baseline: What a uniform random ranking scores on the same items (per metric), where it has a closed form or
            was measured.
        failed: Method → the error that stopped it.
        examples: Method → a few :class:`~.explain.Explanation` for the report's heatmaps.
        draws: Bootstrap and permutation draws.
        seed: Seed of the resampling.
        skipped: Rows left out of every method's scores, each with its reason (kinds: ``bad row``, ``unknown``,
            ``target equals foil``, ``not explainable``).
        unknown_words: Row → context words the tokenizer maps (in part) to its unknown token; they keep their
            scores.
        metric_names: The metrics when they are not the protocol's (speech evaluations, :mod:`.speech`).
        target_tokens: Which tokens of a target word were explained (``first`` or ``whole``, see
            :mod:`.targets`), for ``evidence`` and ``cue``.
        description: What the metrics mean, in words, when the protocol's usual description does not say it (the
            image protocols).
    """

    protocol: str
    results: dict[str, MethodResult] = field(default_factory=dict)
    baseline: dict[str, float] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    examples: dict[str, list[Explanation]] = field(default_factory=dict)
    draws: int = 1000
    seed: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    unknown_words: dict[int, list[str]] = field(default_factory=dict)
    metric_names: tuple[str, ...] | None = None
    target_tokens: str | None = None
    description: str | None = None

    def report(self, path="evaluation.html", **kwargs):
        """Write this evaluation's HTML report to ``path`` (``title=``: its title) and return the path: the page
        ``inseq-mixing evaluate --out`` writes (tables with their intervals, paired tests, per-layer figures, example
        heatmaps, skipped rows). The writer is the views' (:mod:`inseq_mixing.hooks`, installed on registration)."""
        from ..hooks import WRITERS

        if "evaluation" not in WRITERS:
            raise RuntimeError("import inseq_mixing (with Inseq installed) to write reports.")
        return WRITERS["evaluation"](self, path, **kwargs)

    def skipped_counts(self) -> dict[str, int]:
        """How many rows were skipped, by kind."""
        counts: dict[str, int] = {}
        for skip in self.skipped:
            counts[skip.kind] = counts.get(skip.kind, 0) + 1
        return counts

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metrics, headline first: the protocol's, or those a speech evaluation sets (``metric_names``)."""
        return self.metric_names or METRICS[self.protocol]

    def method_summary(self, method: str) -> dict:
        """``{METRIC: value, "ci": [low, high], "n": items, OTHER: value, "OTHER_ci": [...], ...}``."""
        return self.summaries[method]

    @cached_property
    def summaries(self) -> dict[str, dict]:
        """:meth:`method_summary` of every method, resampled once (the table, the figure and the JSON share it)."""
        return {method: self._summarise(method) for method in self.results}

    def _summarise(self, method: str) -> dict:
        result = self.results[method]
        summary = {}
        for index, metric in enumerate(self.metrics):
            statistic = result.statistics[metric]
            interval = list(bootstrap_interval(statistic, self.draws, seed=self.seed))
            summary[metric] = float(statistic.value())
            summary["ci" if index == 0 else f"{metric}_ci"] = interval
            if is_degenerate(statistic, interval):
                summary.setdefault("degenerate", []).append(metric)
        summary["n"] = len(result.statistics[self.metrics[0]])
        if result.per_layer is not None:
            summary["per_layer"] = [float(value) for value in result.per_layer.value()]
            summary["per_layer_ci"] = [
                list(bootstrap_interval(layer, self.draws, seed=self.seed)) for layer in result.layer_statistics
            ]
        return summary

    def pairs(self) -> list[dict]:
        """Paired permutation tests of the headline metric between every two methods."""
        return self.pair_tests

    @cached_property
    def pair_tests(self) -> list[dict]:
        """:meth:`pairs`, computed once."""
        metric = self.metrics[0]
        rows = []
        for first, second in combinations(self.results, 2):
            a, b = self.results[first].statistics[metric], self.results[second].statistics[metric]
            rows.append(
                {
                    "method_a": first,
                    "method_b": second,
                    "metric": metric,
                    "difference": float(a.value() - b.value()),
                    "p_value": paired_permutation_test(a, b, self.draws, self.seed),
                    "test": "paired permutation (items swapped between the two methods)",
                }
            )
        if self.protocol == "blankout" and self.results:  # the cue words' silence against a random word's
            statistics = next(iter(self.results.values())).statistics
            cue, control = statistics["audio_cue_drop"], statistics["audio_random_drop"]
            both = (cue.den > 0) & (control.den > 0)  # rows with a control word
            cue, control = Statistic(cue.num[both], cue.den[both]), Statistic(control.num[both], control.den[both])
            rows.append(
                {
                    "method_a": "audio_cue_drop",
                    "method_b": "audio_random_drop",
                    "metric": "probability drop",
                    "difference": float(cue.value() - control.value()),
                    "p_value": paired_permutation_test(cue, control, self.draws, self.seed),
                    "test": "paired permutation (each row's two drops swapped): cue words against a random word",
                }
            )
        return rows

    def to_dict(self) -> dict:
        return {
            "protocol": self.protocol,
            "methods": {method: self.method_summary(method) for method in self.results},
            "baseline": self.baseline,
            "pairs": self.pairs(),
            "failed": self.failed,
            "lower_is_better": [metric for metric in self.metrics if metric in LOWER_IS_BETTER],
            "target_tokens": self.target_tokens,
            "skipped": [skip.to_dict() for skip in self.skipped],
            "skipped_counts": self.skipped_counts(),
            "unknown_words": {str(row): words for row, words in self.unknown_words.items()},
        }

    def to_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1, ensure_ascii=False), encoding="utf-8")
        return path

    @property
    def shown_metrics(self) -> tuple[str, ...]:
        """The metrics of the terminal table: a speech evaluation's every metric (blank-out's three drops), the first
        two of the others (the rest are in the JSON and the report)."""
        return self.metrics if self.metric_names else self.metrics[:2]

    def summary_rows(self) -> list[dict]:
        """One row per method (and the random baseline) for a terminal table."""
        rows = []
        for method in self.results:
            summary = self.method_summary(method)
            row = {"method": method, "n": summary["n"]}
            if self.random_models:
                row["model"] = "random init (another model)" if method.endswith(RANDOM_SUFFIX) else "as given"
            for index, metric in enumerate(self.shown_metrics):
                low, high = summary["ci" if index == 0 else f"{metric}_ci"]
                row[metric] = summary[metric]
                degenerate = " degenerate" if metric in summary.get("degenerate", ()) else ""
                row[f"{metric} 95% CI"] = f"[{low:.3f}, {high:.3f}]{degenerate}"
            rows.append(row)
        if self.baseline:
            shown = {key: value for key, value in self.baseline.items() if key in self.shown_metrics}
            rows.append({"method": "random", **shown})
        return rows

    @property
    def random_models(self) -> bool:
        """Whether some rows are methods run on a randomly initialised copy of the model (``random_baseline``)."""
        return any(method.endswith(RANDOM_SUFFIX) for method in self.results)

    def notes(self) -> list[str]:
        """What the terminal says under the table: the intervals that cannot vary, and what the random-init rows
        are."""
        notes = []
        for method in self.results:
            degenerate = self.method_summary(method).get("degenerate")
            if degenerate:
                notes.append(f"{method}: the 95% interval of {', '.join(degenerate)} is degenerate (one item, or "
                             "every item alike): it cannot vary, and says nothing of the uncertainty")  # fmt: skip
        if self.random_models:
            notes.append(f"rows ending in{RANDOM_SUFFIX!r} are the methods on a randomly initialised copy of the "
                         "model: another model, whose probabilities and scores sit at its own level")  # fmt: skip
        return notes


def faithfulness_result(rows: list[dict]) -> MethodResult:
    """One method's faithfulness result from its per-token (or per-entry) AOPC rows."""
    return MethodResult({name: mean_statistic([row[name] for row in rows]) for name in METRICS["faithfulness"]})


def faithfulness_baseline(rows: list[dict]) -> dict[str, float]:
    """The random rankings' AOPC (the rows' ``random_*`` values) averaged over the rows."""
    return {name: nan_mean([row[f"random_{name}"] for row in rows]) for name in METRICS["faithfulness"]}


def score_methods(evaluation: Evaluation, methods: list[str], score, examples: int, show_progress: bool) -> None:
    """Each method's result and first explanations from ``score(method) -> (MethodResult, explanations)``; a method
    that fails is reported in ``evaluation.failed`` and left out, the others kept.

    Raises:
        RuntimeError: Every method failed.
    """
    done = each_method(methods, score, evaluation.failed, "evaluate", show_progress, "evaluating", stacklevel=4)
    for method, (result, explained) in done.items():
        evaluation.results[method] = result
        evaluation.examples[method] = explained[:examples]


#: What a method's name gets on a randomly initialised copy of the model (the random-baseline rows).
RANDOM_SUFFIX = " (random init)"


def random_copy(model, seed: int):
    """A randomly initialised model of the same configuration (transformers' own initialisation)."""
    import torch

    torch.manual_seed(seed)
    copy = type(model)(model.config)
    return copy.to(next(model.parameters()).device).eval()
