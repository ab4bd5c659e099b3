"""Run several attribution methods (the plugin's and Inseq's Captum-based ones) on the same inputs and forced targets,
and score each generated token's attributions for faithfulness and agreement between methods."""

import csv
import json
import math
import warnings
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

import inseq
import torch
from tqdm.auto import tqdm

from .faithfulness import (
    DEFAULT_FRACTIONS,
    TokenExample,
    faithfulness,
    random_baseline,
    rank_correlation,
    target_scores,
)

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
    """

    outputs: dict = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    tokens: list[dict] = field(default_factory=list)
    agreement: list[dict] = field(default_factory=list)

    def summary(self) -> list[dict]:
        """Per method, the mean of every metric over all generated tokens, and the mean agreement with each other
        method."""
        rows = []
        for method in self.outputs:
            mine = [row for row in self.tokens if row["method"] == method]
            summary = {"method": method, "tokens": len(mine)}
            for key in [*METRICS, *(f"random_{name}" for name in METRICS)]:
                summary[key] = _mean(row[key] for row in mine)
            for other in self.outputs:
                if other != method:
                    pairs = [
                        row["spearman"]
                        for row in self.agreement
                        if {row["method_a"], row["method_b"]} == {method, other}
                    ]
                    summary[f"spearman_{other}"] = _mean(pairs)
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


def _mean(values) -> float:
    values = [value for value in values if not math.isnan(value)]
    return sum(values) / len(values) if values else float("nan")


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


def check_methods(methods: list[str]) -> None:
    """Refuse an empty method list or names Inseq does not know."""
    if not methods:
        raise ValueError("Give at least one attribution method.")
    unknown = [name for name in methods if name not in inseq.list_feature_attribution_methods()]
    if unknown:
        raise ValueError(f"Unknown attribution method(s) {unknown}: see inseq.list_feature_attribution_methods().")


def compare(
    model,
    methods: list[str],
    inputs: str | list[str],
    targets: str | list[str] | None = None,
    tokenizer=None,
    replacement_token: str | None = None,
    fractions=DEFAULT_FRACTIONS,
    random_draws: int = 3,
    method_kwargs: dict[str, dict] | None = None,
    show_progress: bool = False,
    max_new_tokens: int | None = None,
) -> Comparison:
    """Run ``methods`` on the same inputs and forced targets and score them.

    Args:
        model: A Hugging Face model, an Inseq ``AttributionModel``, or a model name or local path.
        methods: Registered attribution method names (e.g. ``["alti_logit", "decompx", "integrated_gradients"]``).
        inputs: Source texts (encoder–decoders) or prompts (decoder-only models); encoder-only models: the texts
            (a masked LM's with its mask token).
        targets: Target texts (decoder-only: the whole sequence). If None, the model's greedy generation (as
            ``model.generate`` gives it, capped by ``max_new_tokens``) is forced for every method. Encoder-only models:
            the masked word or the label, default the prediction; the first explained entry of each text is scored,
            by deleting tokens (:mod:`.encoders`).
        tokenizer: The tokenizer, when ``model`` is a model object.
        replacement_token: The token that replaces perturbed context tokens (default: the unknown token, else pad).
        fractions: Shares of the candidate tokens removed (or kept) at each point of the perturbation curve.
        random_draws: Random rankings averaged for the baseline.
        method_kwargs: Per method, keyword arguments for ``model.attribute`` (e.g. ``{"integrated_gradients":
            {"n_steps": 50}}``).
        show_progress: Show progress bars over the methods and over the generated tokens scored.
        max_new_tokens: The longest generated target when ``targets`` is None (default: the model's generation
            config; if it sets no length, transformers' default of 20 new tokens, with a warning saying so).

    Returns:
        A :class:`Comparison`. A method that raises is recorded in ``failed`` (with a warning) and the others are
        compared without it.

    Raises:
        RuntimeError: Every method failed.
    """
    check_methods(methods)
    inputs = [inputs] if isinstance(inputs, str) else list(inputs)
    targets = [targets] if isinstance(targets, str) else targets
    method_kwargs = method_kwargs or {}
    from ..encoders import EncoderAttributionModel, is_encoder_only_model

    if isinstance(model, EncoderAttributionModel) or is_encoder_only_model(model):
        from ..encoders import load_model as load_any_model
        from .encoders import compare_encoder

        if not isinstance(model, EncoderAttributionModel):
            model = load_any_model(model, methods[0], tokenizer=tokenizer)
        return compare_encoder(model, methods, inputs, targets, fractions, random_draws, method_kwargs, show_progress)
    base = model if isinstance(model, inseq.models.AttributionModel) else None
    if base is None:
        base = inseq.load_model(model, methods[0], tokenizer=tokenizer)
    hf_model, tokenizer = base.model, base.tokenizer
    if targets is None:  # one generation, forced for every method
        from ..runs.runner import generate_targets, generation_length

        targets = generate_targets(base, inputs, generation_length(base, max_new_tokens))
    special_ids = set(tokenizer.all_special_ids)
    replacement_id = tokenizer.convert_tokens_to_ids(replacement_token) if replacement_token else None
    if replacement_id is None:
        replacement_id = tokenizer.unk_token_id if tokenizer.unk_token_id is not None else tokenizer.pad_token_id
    comparison = Comparison()
    scores = {}
    for method in tqdm(methods, desc="attributing", disable=not show_progress):
        try:
            attribution_model = inseq.load_model(hf_model, method, tokenizer=tokenizer)
            out = attribution_model.attribute(
                inputs, targets, attribute_target=True, show_progress=False, **method_kwargs.get(method, {})
            )
        except Exception as error:  # keep what the other methods computed; report this one
            comparison.failed[method] = f"{type(error).__name__}: {error}"
            warnings.warn(f"compare: {method} failed and is left out ({comparison.failed[method]})", stacklevel=2)
            continue
        comparison.outputs[method] = out
        scores[method] = [token_level_scores(seq) for seq in out.sequence_attributions]
    if not comparison.outputs:
        raise RuntimeError(f"Every method failed: {comparison.failed}")
    methods = list(comparison.outputs)
    reference = comparison.outputs[methods[0]].sequence_attributions
    total = sum(len(seq.target) - seq.attr_pos_start for seq in reference)
    progress = tqdm(total=total, desc="faithfulness", disable=not show_progress)
    for sentence, seq in enumerate(reference):
        for example, column in token_examples(seq, special_ids):
            progress.update()
            if not example.candidates.any():
                continue
            token = seq.target[example.position].token
            ranked = {method: candidate_scores(scores[method][sentence], example, column) for method in methods}
            original = target_scores(hf_model, example, example.context_ids[None])
            baseline = random_baseline(hf_model, example, fractions, replacement_id, random_draws, original=original)
            for method, values in ranked.items():
                metrics = faithfulness(
                    hf_model, example, values, fractions, replacement_id, baseline=baseline, original=original
                )
                row = {"sentence": sentence, "method": method, "position": example.position, "token": token}
                comparison.tokens.append({**row, **metrics})
            for first, second in combinations(methods, 2):
                comparison.agreement.append(
                    {
                        "sentence": sentence,
                        "position": example.position,
                        "method_a": first,
                        "method_b": second,
                        "spearman": rank_correlation(ranked[first], ranked[second]),
                    }
                )
    progress.close()
    return comparison
