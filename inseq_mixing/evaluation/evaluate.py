"""``evaluate``: score attribution methods over an annotated dataset with the papers' protocols, with bootstrap
intervals and paired tests between methods."""

import torch

from ..frontends import as_front_end, identify, load_model
from .explain import Explanation, explain_items, is_per_layer
from .items import EvaluationInputError, Item, read_items_skipping
from .metrics import (
    Statistic,
    alignment_counts,
    cue_share,
    mean_statistic,
    random_reciprocal_rank,
    reciprocal_rank,
)
from .scores import Evaluation, MethodResult, faithfulness_baseline, faithfulness_result, score_methods
from .targets import TARGET_TOKENS, prepare_targets


def evaluate(
    model,
    methods: list[str] | None = None,
    data=None,
    protocol: str | None = None,
    *,
    tokenizer=None,
    batch_size: int = 16,
    device: str | None = None,
    method_kwargs: dict[str, dict] | None = None,
    draws: int = 1000,
    seed: int = 0,
    examples: int = 2,
    random_draws: int = 3,
    show_progress: bool = False,
    target_tokens: str = "first",
    random_baseline: bool = False,
    processor=None,
    replacement: str = "mean",
    steps: int = 10,
    hops: int = 0,
    separator: str = "\n\n",
    **columns: str,
) -> Evaluation:
    """Evaluate ``methods`` on annotated ``data`` with one of the papers' protocols.

    Protocols (see :mod:`inseq_mixing.evaluation.metrics` for the definitions):

    * ``evidence``: reciprocal rank of the best-ranked evidence word among the context words (ALTI-logit paper); with a
      ``foil`` column the explanation is contrastive. Metric ``mrr``; baseline: the expected MRR of a random ranking.
    * ``cue``: share of the target word's scores on its cue words (Value Zeroing paper), per layer for per-layer
      methods (``per_layer``; the headline value is their mean), the total for rolled-out and logit methods. Metric
      ``cue_contribution``; baseline: the share of cue words among the context words.
    * ``alignment``: ``aer`` and top-1 ``accuracy`` of the source word with the highest score for each target word
      against gold Pharaoh alignments (ALTI+ paper); encoder–decoders only.
    * ``faithfulness``: AOPC comprehensiveness and sufficiency of every generated token (:mod:`.faithfulness`),
      with random rankings as the baseline.
    * ``context``: generation models: the rank of the gold passage among the passages of a retrieval-style prompt
      when the whole answer is explained as one span (``mrr``, ``recall_at_1``) and the answer's probability drop
      without the top-ranked passage, against a random ranking; per hop with ``hops`` (:mod:`.context`, our protocol).

    Speech models (Whisper, wav2vec 2.0 / HuBERT CTC) take the speech study's ``cue`` (audio and text cues, with
    ``random_baseline``) and ``blankout`` protocols (see :mod:`.speech` for their rows and metrics), and
    ``faithfulness`` with units silenced instead of tokens replaced (:mod:`.speech_faithfulness`, our extension).
    Image classifiers take ``faithfulness`` by patches (deletion and insertion curves and AOPC, patches replaced by
    the image's mean colour or its blur) and ``pointing`` (the pointing game and the share of the scores inside a
    gold box or set of patches), with ``random_baseline`` (see :mod:`.vision`, our extension).

    Every metric comes with a percentile bootstrap 95% interval over the items and every two methods with a paired
    permutation test of the headline metric; an interval that cannot vary (one item, or every item alike) is reported
    as degenerate (``summary["degenerate"]``).

    A row that cannot be evaluated is skipped, with its reason, in :attr:`Evaluation.skipped` (the JSON's
    ``skipped``, and the report): a missing value, a marked word not in the context, a fractional index, a target
    mapped to the unknown token, a target and foil sharing their explained token (the ALTI-logit paper skips these
    too). Only a file with no usable row is an error.

    Args:
        model: A Hugging Face model (with ``tokenizer``), an Inseq ``AttributionModel``, or a model name or local path;
            or a stored run (an ``attribute_dataset`` folder, or :func:`~inseq_mixing.load_run`'s ``Run``): its
            method is then evaluated on its stored attributions with the faithfulness protocol, nothing attributed
            again (:func:`.stored.evaluate_run`, which also takes another model object for the run).
        methods: Registered attribution method names.
        data: A JSONL/CSV/Parquet path, a ``datasets.Dataset``, a DataFrame or a list of dicts (see
            :mod:`.items` for the columns).
        protocol: ``"evidence"``, ``"cue"``, ``"alignment"`` or ``"faithfulness"``.
        tokenizer: The tokenizer of a model object (a fast one: words are found from its offsets).
        batch_size: Rows per batch.
        device: Device to run on (default: Inseq's choice, or the model's).
        method_kwargs: Per method, its options (e.g. ``{"integrated_gradients": {"n_steps": 50}}``).
        draws: Bootstrap resamples and permutations.
        seed: Seed of the resampling.
        examples: Items kept per method for the report's heatmaps.
        random_draws: Random rankings per token for the faithfulness baseline.
        show_progress: Show a progress bar over the methods.
        target_tokens: For ``evidence`` and ``cue``: explain the ``"first"`` token of ``" " + target`` (the
            ALTI-logit paper's convention for multi-token words), or the ``"whole"`` word (the sum over its tokens,
            which for logit methods is a sum of logits of different predictions, not a logit); see :mod:`.targets`.
        random_baseline: Speech ``cue`` and the image protocols: also run every method on a randomly initialised
            copy of the model.
        processor: Speech and vision models given as objects: their processor.
        replacement: Image ``faithfulness``: what a removed patch becomes, ``"mean"`` or ``"blur"``.
        steps: Image ``faithfulness``: the points of each curve beyond 0.
        hops: ``context``: hops through the answer's own tokens (:mod:`inseq_mixing.methods.spans`).
        separator: ``context``: what joins the passages and the question (and cuts a passages text).
        **columns: Column names by role: ``source``, ``prefix``, ``target``, ``foil``, ``evidence``, ``cues``,
            ``alignment``; ``context``: ``passages``, ``question``, ``answer``, ``gold`` (e.g.
            ``prefix="one_prefix_prefix"``; ``prefix_column=...`` is accepted too); speech: ``audio``, ``words``,
            ``transcript``.

    Returns:
        An :class:`Evaluation` (``to_json``, ``summary_rows``); ``views.eval_report.write_evaluation_report`` writes
        its HTML report.

    Raises:
        EvaluationInputError: A missing column, or no row that can be evaluated (naming the rows and why).
        ValueError: Unknown methods or options, a batch size or number of draws below 1.
        RuntimeError: Every method failed.
    """
    import inseq

    from ..runs import Run
    from ..runs.store import is_run_folder
    from .comparison import check_methods
    from .stored import evaluate_run

    if isinstance(model, Run) or is_run_folder(model):  # a stored run: its attributions, not attributed again
        settings = {"draws": draws, "seed": seed, "examples": examples, "random_draws": random_draws}
        return evaluate_run(model, protocol or "faithfulness", device=device, show_progress=show_progress, **settings)
    if methods is None or data is None or protocol is None:
        raise ValueError("Give the methods, the data and the protocol (or a stored run as the first argument).")
    check_methods(methods)
    for name, value in (("batch_size", batch_size), ("draws", draws)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, not {value!r}.")
    if target_tokens not in TARGET_TOKENS:
        raise ValueError(f"target_tokens must be one of {TARGET_TOKENS}, not {target_tokens!r}.")
    columns = {role.removesuffix("_column"): name for role, name in columns.items()}
    found = identify(model)
    if protocol == "context":
        from .context import evaluate_context

        if not found.is_generation:
            raise ValueError("The context protocol explains the answer of a generation model (decoder-only or "
                             "encoder–decoder), not of this model.")  # fmt: skip
        base = as_front_end(model, methods[0], found, tokenizer=tokenizer, device=device)
        return evaluate_context(base, methods, data, method_kwargs=method_kwargs, hops=hops, separator=separator,
                                batch_size=batch_size, draws=draws, seed=seed, examples=examples,
                                show_progress=show_progress, columns=columns)  # fmt: skip
    if found.is_vision:
        from .vision import evaluate_vision

        model = as_front_end(model, methods[0], found, processor=processor, device=device)
        return evaluate_vision(model, methods, data, protocol, method_kwargs=method_kwargs, replacement=replacement,
                               steps=steps, random_draws=random_draws, random_baseline=random_baseline, draws=draws,
                               seed=seed, examples=examples, show_progress=show_progress, columns=columns)  # fmt: skip
    if found.is_speech:
        from .speech import evaluate_speech
        from .speech_faithfulness import evaluate_speech_faithfulness

        model = as_front_end(model, methods[0], found, processor=processor)
        if protocol == "faithfulness":
            if random_baseline:
                raise ValueError("random_baseline is for the cue protocol; faithfulness has its random rankings.")
            return evaluate_speech_faithfulness(model, methods, data, method_kwargs=method_kwargs, draws=draws,
                                                seed=seed, examples=examples, random_draws=random_draws,
                                                show_progress=show_progress, columns=columns)  # fmt: skip
        return evaluate_speech(model, methods, data, protocol, processor=processor, method_kwargs=method_kwargs,
                               random_baseline=random_baseline, draws=draws, seed=seed, show_progress=show_progress,
                               **columns)  # fmt: skip
    if protocol == "blankout" or random_baseline:
        raise ValueError("The blankout protocol and random_baseline are for speech and image models.")

    if found.is_encoder:
        model = as_front_end(model, methods[0], found, tokenizer=tokenizer, device=device)
        settings = {"device": device, "batch_size": batch_size, "draws": draws, "seed": seed,
                    "examples": examples, "random_draws": random_draws, "show_progress": show_progress}  # fmt: skip
        return _evaluate_encoder(model, methods, data, protocol, method_kwargs or {}, columns, **settings)
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
    method_kwargs = method_kwargs or {}
    if protocol == "faithfulness":
        return _faithfulness(base, methods, items, batch_size, method_kwargs, random_draws, evaluation, examples)

    def score(method: str):
        attribution_model = inseq.load_model(base.model, method, tokenizer=base.tokenizer)
        explained = explain_items(attribution_model, items, batch_size, method_kwargs.get(method, {}))
        return SCORERS[protocol](explained), explained

    score_methods(evaluation, methods, score, examples, show_progress)
    evaluation.baseline = BASELINES[protocol](items)
    return evaluation


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


def _faithfulness(base, methods, items, batch_size, method_kwargs, random_draws, evaluation, examples) -> Evaluation:
    """AOPC over every generated token of every row, through :func:`~inseq_mixing.compare` batch by batch."""
    from .compare import compare

    rows: dict[str, dict[tuple, dict]] = {}
    for start in range(0, len(items), batch_size):
        batch = items[start : start + batch_size]
        inputs = [item.source if base.is_encoder_decoder else item.prefix for item in batch]
        result = compare(
            base,
            methods,
            inputs,
            [item.generated_text for item in batch],
            method_kwargs=method_kwargs,
            random_draws=random_draws,
        )
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


def _evaluate_encoder(model, methods, data, protocol, method_kwargs, columns, *, device, batch_size, draws, seed,
                      examples, random_draws, show_progress) -> Evaluation:  # fmt: skip
    """:func:`evaluate` on an encoder-only model (:mod:`.encoders`): the rows every method can explain, then each
    method on them."""
    from .encoders import encoder_faithfulness, explain_encoder_items, explainable

    if protocol == "alignment":
        raise EvaluationInputError("The alignment protocol needs an encoder–decoder model (source and target words).")
    items, skipped = read_items_skipping(data, protocol, True, columns)
    evaluation = Evaluation(protocol, draws=draws, seed=seed, skipped=skipped)
    kept = []
    for item in items:  # the rows no method can explain, with the reason, before any method runs
        refused = explainable(model, item)
        if refused is None:
            kept.append(item)
        else:
            evaluation.skipped.append(refused)
    evaluation.skipped.sort(key=lambda skip: skip.row)
    if not kept:
        reasons = "; ".join(skip.reason for skip in evaluation.skipped[:3])
        raise EvaluationInputError(f"No row of the data can be evaluated: {reasons}.")
    faithfulness_rows = {}

    def score(method: str):
        attribution = load_model(model, method)  # the same model and tokenizer, with this method
        explained = explain_encoder_items(attribution, kept, batch_size, method_kwargs.get(method, {}))
        if protocol != "faithfulness":
            return SCORERS[protocol](explained), explained
        rows = encoder_faithfulness(attribution, explained, random_draws=random_draws, seed=seed)
        faithfulness_rows[method] = rows
        return faithfulness_result(rows), explained

    score_methods(evaluation, methods, score, examples, show_progress)
    if protocol == "faithfulness":
        evaluation.baseline = faithfulness_baseline(next(iter(faithfulness_rows.values())))
    else:
        evaluation.baseline = BASELINES[protocol](kept)
    return evaluation
