"""What :func:`~.compare.compare` returns and the readings it shares with the other protocols: each method's
token-level scores of an Inseq output, its candidate context tokens, and the method-name check. Below
:mod:`.compare`, :mod:`.encoders` and :mod:`.explain`, which all read it."""

import csv
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import inseq
import torch
from tqdm.auto import tqdm

from .faithfulness import TokenExample
from .metrics import nan_mean

METRICS = ("comprehensiveness_prob", "sufficiency_prob", "comprehensiveness_logit", "sufficiency_logit")


@dataclass
class Comparison:
    """Each method's Inseq output and the per-token metrics.

    Attributes:
        outputs: Method name → Inseq ``FeatureAttributionOutput``.
        tokens: One row per (sentence, method, generated token): the metrics of :mod:`.faithfulness`, with random
            baselines under ``random_*``.
        agreement: One row per (sentence, generated token, pair of methods): Spearman rank correlation of their scores
            over the candidate context tokens.
        failed: Method name → the error it raised; the other methods are compared without it.
        images: The images compared (an image classifier's comparison), which the report draws the scores over; else
            None.
    """

    outputs: dict = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    tokens: list[dict] = field(default_factory=list)
    agreement: list[dict] = field(default_factory=list)
    images: list | None = None

    def summary(self) -> list[dict]:
        """Per method, the mean of every metric over all generated tokens, and the mean agreement with each other
        method."""
        rows = []
        for method in self.outputs:
            mine = [row for row in self.tokens if row["method"] == method]
            summary = {"method": method, "explains": explained_quantity(self.outputs[method]), "tokens": len(mine)}
            for key in [*METRICS, *(f"random_{name}" for name in METRICS)]:
                summary[key] = nan_mean(row[key] for row in mine)
            for other in self.outputs:
                if other != method:
                    pairs = [
                        row["spearman"]
                        for row in self.agreement
                        if {row["method_a"], row["method_b"]} == {method, other}
                    ]
                    summary[f"spearman_{other}"] = nan_mean(pairs)
            rows.append(summary)
        return rows

    def to_csv(self, path: str | Path) -> Path:
        """Write the per-token rows as CSV."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(self.tokens[0]) if self.tokens else ["method"])
            writer.writeheader()
            writer.writerows(self.tokens)
        return path

    def to_json(self, path: str | Path) -> Path:
        """Write per-token rows, agreement rows and the summary as JSON."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        content = {
            "summary": self.summary(),
            "tokens": self.tokens,
            "agreement": self.agreement,
            "failed": self.failed,
        }
        path.write_text(json.dumps(content, indent=1, ensure_ascii=False), encoding="utf-8")
        return path


def token_level_scores(seq) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Source ``(S, generated)`` and target ``(T, generated)`` scores of one sequence output: gradient methods'
    per-dimension scores are reduced by their L2 norm (Inseq's default), per-layer scores by their mean."""
    granular = type(seq).__name__.startswith("Granular")

    def collapse(scores):
        if scores is None or scores.ndim == 2:
            return scores
        scores = scores.float()
        if granular:
            return torch.linalg.vector_norm(scores, dim=-1)
        return scores.flatten(2).mean(-1)

    return collapse(seq.source_attributions), collapse(seq.target_attributions)


def token_examples(seq, special_ids: set[int]):
    """For each generated token of a sequence output: its :class:`TokenExample` and its column index."""
    source_ids = None if seq.source_attributions is None else torch.tensor([token.id for token in seq.source])
    target_ids = torch.tensor([token.id for token in seq.target])
    for column, position in enumerate(range(seq.attr_pos_start, len(seq.target))):
        example = TokenExample(source_ids, target_ids, position, torch.zeros(0, dtype=torch.bool))
        context = example.context_ids
        example.candidates = torch.tensor([int(i) not in special_ids for i in context], dtype=torch.bool)
        yield example, column


def candidate_scores(seq_scores, example: TokenExample, column: int) -> torch.Tensor:
    source, target = seq_scores
    parts = [] if source is None else [source[:, column]]
    parts.append(target[: example.position, column])
    return torch.cat(parts).nan_to_num()[example.candidates]


def each_method(methods: list[str], run, failed: dict[str, str], caller: str, show_progress: bool, desc: str,
                stacklevel: int = 3) -> dict:  # fmt: skip
    """``run(method)`` for every method, in order: what each returns, by method; a method that raises is recorded in
    ``failed`` (its error in one line), reported with a warning naming ``caller``, and left out, the others kept.

    Raises:
        RuntimeError: Every method failed.
    """
    results = {}
    bar = tqdm(methods, desc=desc, unit="method", disable=not show_progress)
    for method in bar:
        bar.set_postfix_str(method)  # which method is running: one can take most of a minute
        try:
            results[method] = run(method)
        except Exception as error:  # keep what the other methods computed; report this one
            failed[method] = f"{type(error).__name__}: {error}"
            warnings.warn(f"{caller}: {method} failed and is left out ({failed[method]})", stacklevel=stacklevel)
    if not results:
        raise RuntimeError(f"Every method failed: {failed}")
    return results


def texts_of(inputs) -> list[str]:
    """``compare``'s inputs as texts (one text or a list), or ``ValueError``: an ``(images, prompt)`` pair (the command
    line's ``--image``) is a vision-language model's input."""
    texts = [inputs] if isinstance(inputs, str) else list(inputs)
    if not all(isinstance(text, str) for text in texts):
        raise ValueError("compare on this model takes texts; (images, prompt) pairs (--image) are for "
                         "vision-language models.")  # fmt: skip
    return texts


def check_methods(methods: list[str]) -> None:
    """Refuse an empty method list or names Inseq does not know."""
    if not methods:
        raise ValueError("Give at least one attribution method.")
    unknown = [name for name in methods if name not in inseq.list_feature_attribution_methods()]
    if unknown:
        raise ValueError(f"Unknown attribution method(s) {unknown}: see inseq.list_feature_attribution_methods().")


def explained_quantity(output) -> str:
    """What an output's scores explain, in one word or two: ``logit``, ``contrast_logits_diff``, ``probability`` (an
    Inseq gradient method's default), ... or ``map`` for a context-mixing map, which explains no output."""
    info = getattr(output, "info", None) or {}
    quantity = info.get("attributed_fn")
    if quantity is None:
        return "?"
    quantity = str(quantity)
    return "map" if " map" in quantity else quantity.removesuffix("_fn")  # Inseq records its functions' names


def with_explained(method: str, options: dict, attributed_fn: str | None) -> dict:
    """A method's keyword arguments with the comparison's ``attributed_fn`` (None: the method's own default), unless
    they name their own or the method gives maps (which explain no output)."""
    from ..declarations import DECLARATIONS

    maps = method in DECLARATIONS and not DECLARATIONS[method].explains_logit
    if attributed_fn is None or maps or "attributed_fn" in options:
        return dict(options)
    return {**options, "attributed_fn": attributed_fn}


def fill_one_entry(comparison: Comparison, done: dict, candidate_scores) -> Comparison:
    """A comparison whose inputs each explain one entry (an encoder's mask or label, an image's label): each
    method's output and per-input AOPC rows from ``done`` (method → ``(output, rows)``), and the Spearman agreement
    of every two methods over the scores ``candidate_scores(sequence)`` of the items AOPC may remove."""
    from itertools import combinations

    from .faithfulness import rank_correlation

    scores = {}
    for method, (out, rows) in done.items():
        comparison.outputs[method] = out
        for sentence, row in enumerate(rows):
            comparison.tokens.append({"method": method, "sentence": sentence, "position": 0, **row})
        scores[method] = [candidate_scores(sequence) for sequence in out.sequence_attributions]
    for first, second in combinations(scores, 2):
        for sentence, (a, b) in enumerate(zip(scores[first], scores[second], strict=True)):
            comparison.agreement.append({"sentence": sentence, "position": 0, "method_a": first, "method_b": second,
                                         "spearman": rank_correlation(a, b)})  # fmt: skip
    return comparison
