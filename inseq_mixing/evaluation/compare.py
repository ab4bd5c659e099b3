"""Run several attribution methods (the plugin's and Inseq's Captum-based ones) on the same inputs and forced targets,
and score each generated token's attributions for faithfulness and agreement between methods."""

from itertools import combinations

import inseq
from tqdm.auto import tqdm

from ..frontends import as_front_end, identify
from .comparison import (
    Comparison,
    candidate_scores,
    check_methods,
    each_method,
    token_examples,
    token_level_scores,
    with_explained,
)
from .faithfulness import DEFAULT_FRACTIONS, faithfulness, random_baseline, rank_correlation, target_scores


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
    attributed_fn: str | None = "logit",
    processor=None,
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
        processor: An image classifier's image processor, when ``model`` is a model object: ``inputs`` are then
            images (paths, PIL images, arrays) and ``targets`` labels; each image's label is scored by AOPC with
            patches replaced by the image's mean colour ([CLS] and the like never), and the methods' agreement is
            over the patches (:func:`.vision.compare_vision`).
        replacement_token: The token that replaces perturbed context tokens (default: the unknown token, else pad).
        fractions: Shares of the candidate tokens removed (or kept) at each point of the perturbation curve.
        random_draws: Random rankings averaged for the baseline.
        method_kwargs: Per method, keyword arguments for ``model.attribute`` (e.g. ``{"integrated_gradients":
            {"n_steps": 50}}``).
        show_progress: Show progress bars over the methods and over the generated tokens scored.
        max_new_tokens: The longest generated target when ``targets`` is None (default: the model's generation
            config; if it sets no length, transformers' default of 20 new tokens, with a warning saying so).
        attributed_fn: What every method explains, so that the methods are compared on one quantity: ``"logit"``
            (the default; what the logit methods explain, and the gradient baselines then too), or None for each
            method's own default (Inseq's gradient methods: the probability). A method's ``method_kwargs`` may set its
            own. The summary names each method's quantity (``explains``; ``map`` for context-mixing maps).

    Returns:
        A :class:`Comparison`. A method that raises is recorded in ``failed`` (with a warning) and the others are
        compared without it.

    Raises:
        RuntimeError: Every method failed.
    """
    check_methods(methods)
    method_kwargs = method_kwargs or {}
    found = identify(model)
    if found.is_vision:
        from .vision import compare_vision

        model = as_front_end(model, methods[0], found, processor=processor)
        images = list(inputs) if isinstance(inputs, list | tuple) else [inputs]
        targets = targets if isinstance(targets, list | tuple) or targets is None else [targets]
        return compare_vision(model, methods, images, targets, fractions, random_draws, method_kwargs, show_progress,
                              attributed_fn)  # fmt: skip
    inputs = [inputs] if isinstance(inputs, str) else list(inputs)
    targets = [targets] if isinstance(targets, str) else targets
    if found.is_encoder:
        from .encoders import compare_encoder

        model = as_front_end(model, methods[0], found, tokenizer=tokenizer)
        return compare_encoder(model, methods, inputs, targets, fractions, random_draws, method_kwargs, show_progress,
                               attributed_fn)  # fmt: skip
    base = as_front_end(model, methods[0], found, tokenizer=tokenizer)
    hf_model, tokenizer = base.model, base.tokenizer
    if targets is None:  # one generation, forced for every method
        from ..runs.runner import generate_targets, generation_length

        targets = generate_targets(base, inputs, generation_length(base, max_new_tokens))
    comparison = Comparison()

    def attribute(method: str):
        attribution_model = inseq.load_model(hf_model, method, tokenizer=tokenizer)
        options = with_explained(method, method_kwargs.get(method, {}), attributed_fn)
        return attribution_model.attribute(inputs, targets, attribute_target=True, show_progress=False, **options)

    comparison.outputs = each_method(methods, attribute, comparison.failed, "compare", show_progress, "attributing")
    return score_comparison(comparison, hf_model, tokenizer, fractions, random_draws, show_progress, replacement_token)


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
