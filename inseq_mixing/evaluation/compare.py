"""Run several attribution methods (the plugin's and Inseq's Captum-based ones) on the same inputs and forced targets,
and score each generated token's attributions for faithfulness and agreement between methods."""

from ..frontends import identify
from .comparison import Comparison, check_methods
from .faithfulness import DEFAULT_FRACTIONS
from .protocols import ComparisonSettings, comparison


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
            over the patches (:func:`.vision.compare_vision`). A vision-language decoder's processor: ``inputs``
            are ``(images, prompt)`` pairs and ``targets`` answers (default: the greedy ones); each answer is
            explained as one span and scored by AOPC with its first image's tokens removed, the agreement over those
            tokens (:func:`.vlm.compare_vlm`).
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
    found = identify(model)
    settings = ComparisonSettings(tokenizer=tokenizer, processor=processor, replacement_token=replacement_token,
                                  fractions=fractions, random_draws=random_draws, method_kwargs=method_kwargs or {},
                                  show_progress=show_progress, max_new_tokens=max_new_tokens,
                                  attributed_fn=attributed_fn)  # fmt: skip
    return comparison(found)(model, methods, inputs, targets, found, settings)
