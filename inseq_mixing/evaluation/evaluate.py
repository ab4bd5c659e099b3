"""``evaluate``: score attribution methods over an annotated dataset with the papers' protocols, with bootstrap
intervals and paired tests between methods. The protocols are looked up by the model's kind and the protocol's name
(:mod:`.protocols`); each kind's live in its own module."""

from ..frontends import identify
from .protocols import Settings, check_settings, lookup
from .scores import Evaluation
from .targets import TARGET_TOKENS


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
      outputs (``per_layer``; the headline value is their mean), the total for rolled-out and logit methods. Value
      zeroing and the attention norm are read per layer, as their papers read them, unless ``method_kwargs`` choose a
      layout (``per_layer``, ``rollout``, ``per_head``). Metric ``cue_contribution``; baseline: the share of cue words
      among the context words.
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
    gold box or set of patches), with ``random_baseline`` (see :mod:`.vision`, our extension). Vision–language decoders
    take ``pointing``: an answer explained as one span over its first image's tokens, scored against the box the
    answer names (see :mod:`.vlm`, our extension; rows ``images``, ``prompt``, ``answer``, ``box``).

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
    entry = lookup(found, protocol)
    settings = Settings(tokenizer=tokenizer, processor=processor, batch_size=batch_size, device=device,
                        method_kwargs=method_kwargs or {}, draws=draws, seed=seed, examples=examples,
                        random_draws=random_draws, show_progress=show_progress, target_tokens=target_tokens,
                        random_baseline=random_baseline, replacement=replacement, steps=steps, hops=hops,
                        separator=separator, columns=columns)  # fmt: skip
    check_settings(entry, settings)
    return entry(model, methods, data, found, settings)
