"""The generation kind's protocols (encoder–decoders and decoder-only models): the text protocols (evidence, cue,
alignment, faithfulness) of :func:`~.evaluate.evaluate`, the method comparison of :func:`~.compare.compare`, and the
faithfulness of a stored run (:func:`~.stored.evaluate_run`). The context protocol is :mod:`.context`'s."""

from itertools import combinations

import inseq
from tqdm.auto import tqdm

from ..frontends import as_front_end
from .comparison import (
    Comparison,
    candidate_scores,
    each_method,
    texts_of,
    token_examples,
    token_level_scores,
    with_explained,
)
from .explain import Explanation, explain_items
from .faithfulness import DEFAULT_FRACTIONS, faithfulness, random_baseline, rank_correlation, target_scores
from .items import EvaluationInputError, read_items_skipping
from .protocols import ComparisonSettings, paper_options
from .scores import Evaluation, faithfulness_baseline, faithfulness_result, score_methods
from .targets import prepare_targets
from .text_scores import BASELINES, SCORERS


def evaluate_generation(model, methods: list[str], data, protocol: str, found, settings) -> Evaluation:
    """The evidence, cue, alignment or faithfulness protocol on a generation model (see ``evaluate``)."""
    tokenizer, device, batch_size = settings.tokenizer, settings.device, settings.batch_size
    draws, seed, columns, target_tokens = settings.draws, settings.seed, settings.columns, settings.target_tokens
    examples, random_draws, show_progress = settings.examples, settings.random_draws, settings.show_progress
    base = as_front_end(model, methods[0], found, tokenizer=tokenizer, device=device)
    items, skipped = read_items_skipping(data, protocol, base.is_encoder_decoder, columns)
    evaluation = Evaluation(protocol, draws=draws, seed=seed, skipped=skipped)
    if protocol in ("evidence", "cue"):
        items, not_explainable = prepare_targets(base.tokenizer, items, base.is_encoder_decoder, target_tokens)
        evaluation.skipped = sorted([*skipped, *not_explainable], key=lambda skip: skip.row)
        evaluation.target_tokens = target_tokens
        evaluation.unknown_words = {
            item.row: [item.context_words[word] for word in item.unknown] for item in items if item.unknown
        }
    if not items:
        reasons = "; ".join(skip.reason for skip in evaluation.skipped[:3])
        more = f" (and {len(evaluation.skipped) - 3} more)" if len(evaluation.skipped) > 3 else ""
        raise EvaluationInputError(f"No row of the data can be evaluated: {reasons}{more}.")
    method_kwargs = settings.method_kwargs
    if protocol == "faithfulness":
        return generation_faithfulness(base, methods, items, batch_size, method_kwargs, random_draws, evaluation,
                                       examples)  # fmt: skip

    def score(method: str):
        attribution_model = inseq.load_model(base.model, method, tokenizer=base.tokenizer)
        options = paper_options(method, method_kwargs.get(method, {}), protocol)
        explained = explain_items(attribution_model, items, batch_size, options)
        return SCORERS[protocol](explained), explained

    score_methods(evaluation, methods, score, examples, show_progress)
    evaluation.baseline = BASELINES[protocol](items)
    return evaluation


def generation_faithfulness(base, methods, items, batch_size, method_kwargs, random_draws, evaluation,
                            examples) -> Evaluation:  # fmt: skip
    """AOPC over every generated token of every row, through :func:`~inseq_mixing.compare` batch by batch."""
    rows: dict[str, dict[tuple, dict]] = {}
    for start in range(0, len(items), batch_size):
        batch = items[start : start + batch_size]
        inputs = [item.source if base.is_encoder_decoder else item.prefix for item in batch]
        result = compare_generation(base, methods, inputs, [item.generated_text for item in batch], None,
                                    ComparisonSettings(method_kwargs=method_kwargs, random_draws=random_draws,
                                                       fractions=DEFAULT_FRACTIONS))  # fmt: skip
        evaluation.failed.update(result.failed)
        for token in result.tokens:
            key = (batch[token["sentence"]].row, token["position"])
            rows.setdefault(token["method"], {})[key] = token
        for method, output in result.outputs.items():
            kept = evaluation.examples.setdefault(method, [])
            for item, seq in zip(batch, output.sequence_attributions, strict=True):
                if len(kept) < examples:
                    kept.append(Explanation(item, seq, None, []))
    methods = [method for method in methods if method in rows and method not in evaluation.failed]
    if not methods:
        raise RuntimeError(f"Every method failed: {evaluation.failed}")
    keys = sorted(set.intersection(*(set(rows[method]) for method in methods)))
    for method in methods:
        evaluation.results[method] = faithfulness_result([rows[method][key] for key in keys])
    evaluation.baseline = faithfulness_baseline([rows[methods[0]][key] for key in keys])
    return evaluation


def compare_generation(model, methods: list[str], inputs, targets, found, settings) -> Comparison:
    """``compare`` on a generation model: every method on the same texts and forced targets (the greedy generation
    when none are given), each generated token's AOPC and the methods' rank agreement (:func:`score_comparison`)."""
    tokenizer, method_kwargs = settings.tokenizer, settings.method_kwargs
    fractions, random_draws, show_progress = settings.fractions, settings.random_draws, settings.show_progress
    max_new_tokens, attributed_fn = settings.max_new_tokens, settings.attributed_fn
    replacement_token = settings.replacement_token
    inputs = texts_of(inputs)
    targets = [targets] if isinstance(targets, str) else targets
    base = as_front_end(model, methods[0], found, tokenizer=tokenizer)
    hf_model, tokenizer = base.model, base.tokenizer
    if targets is None:  # one generation, forced for every method
        from ..frontends.generation import generate_targets, generation_length

        targets = generate_targets(base, inputs, generation_length(base, max_new_tokens))
    comparison = Comparison()

    def attribute(method: str):
        attribution_model = inseq.load_model(hf_model, method, tokenizer=tokenizer)
        options = with_explained(method, method_kwargs.get(method, {}), attributed_fn)
        return attribution_model.attribute(inputs, targets, attribute_target=True, show_progress=False, **options)

    comparison.outputs = each_method(methods, attribute, comparison.failed, "compare", show_progress, "attributing",
                                     stacklevel=4)  # fmt: skip
    return score_comparison(comparison, hf_model, tokenizer, fractions, random_draws, show_progress, replacement_token)


def stored_faithfulness(front, run, ids, sequences, random_draws: int, seed: int, show_progress: bool):
    """A stored generation run's faithfulness: every generated token's AOPC (:func:`score_comparison`)."""
    from inseq.data import FeatureAttributionOutput

    method = run.manifest["method"]
    comparison = Comparison(outputs={method: FeatureAttributionOutput(sequence_attributions=sequences)})
    score_comparison(comparison, front.model, front.tokenizer, DEFAULT_FRACTIONS, random_draws, show_progress)
    return comparison.tokens, None


def score_comparison(comparison: Comparison, hf_model, tokenizer, fractions=DEFAULT_FRACTIONS, random_draws: int = 3,
                     show_progress: bool = False, replacement_token: str | None = None) -> Comparison:  # fmt: skip
    """Score the outputs of ``comparison`` (method → Inseq output on the same texts, generation models): each
    generated token's AOPC under every method, with a random-ranking baseline, and the rank agreement of each pair
    of methods; filled into ``comparison`` and returned. The outputs may be new or read from a stored run."""
    special_ids = set(tokenizer.all_special_ids)
    replacement_id = tokenizer.convert_tokens_to_ids(replacement_token) if replacement_token else None
    if replacement_id is None:
        replacement_id = tokenizer.unk_token_id if tokenizer.unk_token_id is not None else tokenizer.pad_token_id
    scores = {method: [token_level_scores(seq) for seq in out.sequence_attributions]
              for method, out in comparison.outputs.items()}  # fmt: skip
    methods = list(comparison.outputs)
    reference = comparison.outputs[methods[0]].sequence_attributions
    total = sum(len(seq.target) - seq.attr_pos_start for seq in reference)
    description = f"faithfulness: each generated token's top-ranked context removed, {len(methods)} method(s)"
    progress = tqdm(total=total, desc=description, unit="token", disable=not show_progress)
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
