"""Attributing a whole dataset: padded batches through one trace and the method math each, a resumable store, and
several processes (CPU or GPUs, one machine or several) under ``torchrun`` or ``accelerate launch``.

The plugin's methods are final-step methods whose scores are padding-invariant, so a batch of sentences of different
lengths is traced once and each sentence's output is the one ``model.attribute`` gives it alone. Inseq builds the
outputs (tokens, positions, step scores) exactly as in ``model.attribute``.
"""

import hashlib
import json
import logging
import os
import time
import warnings
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from ..declarations import DECLARATIONS
from ..frontends import identify, is_front_end
from ..trace import state_tensors
from .data import DatasetInputError, Example, fingerprint_examples, read_examples
from .store import FORMAT, RunStore, RunStoreError, ShardScan, Writer, sequence_to_row

logger = logging.getLogger(__name__)

#: Arguments of Inseq's ``model.attribute`` that a dataset run accepts besides the method's own options.
INSEQ_ARGUMENTS = ("attribute_target", "attributed_fn", "attr_pos_start", "attr_pos_end", "skip_special_tokens")
#: Arguments that explain spans of each generation over context units (:mod:`inseq_mixing.frontends.spans`), the
#: same for every row: kind names (``spans="sentences"``, ``units="passages"``) or one list for all rows.
SPAN_ARGUMENTS = ("spans", "units", "hops", "separator", "language")
#: Contrastive explanations need a foil text per example, which a dataset run does not take (yet).
PER_EXAMPLE_ARGUMENTS = ("contrast_targets", "contrast_targets_alignments")
#: Manifest entries that must match for a run to resume in a store.
IDENTITY_KEYS = ("model", "method", "options", "dtype", "data", "batching")


@dataclass
class RunSummary:
    """What a call of :func:`attribute_dataset` did.

    Attributes:
        out: The store folder.
        examples: Examples in the data.
        attributed: Examples attributed by this call (this process).
        skipped: Examples found already stored (this process's share).
        seconds: Wall time of the attribution loop.
    """

    out: Path
    examples: int
    attributed: int
    skipped: int
    seconds: float
    redone: dict[int, str] = field(default_factory=dict)
    stray: list[str] = field(default_factory=list)
    rank: int = 0
    processes: int = 1

    @property
    def examples_per_second(self) -> float:
        return self.attributed / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        process = f"process {self.rank} of {self.processes}: " if self.processes > 1 else ""
        notes = "".join(
            f"\nredid batch {batch}: its shard {reason}" for batch, reason in sorted(self.redone.items())
        ) + (f"\nignored file(s) in the shards folder that are not shards: {self.stray}" if self.stray else "")
        if not self.attributed:
            return (
                f"{process}nothing to do: all {self.skipped} examples"
                + (" of this process's share" if self.processes > 1 else "")
                + f" are already in {self.out}"
                + notes
            )
        return (
            f"{process}attributed {self.attributed} examples in {self.seconds:.1f} s "
            f"({self.examples_per_second:.2f} ex/s), {self.skipped} already stored, {self.examples} in the data → "
            f"{self.out}" + notes
        )


def attribute_dataset(
    model,
    method: str,
    data,
    out: str | Path,
    *,
    tokenizer=None,
    processor=None,
    batch_size: int = 16,
    device: str | None = None,
    dtype: str | torch.dtype | None = None,
    source_column: str | None = None,
    target_column: str | None = None,
    id_column: str | None = None,
    words_column: str | None = "words",
    max_new_tokens: int | None = None,
    show_progress: bool = True,
    **method_kwargs,
) -> RunSummary:
    """Attribute every example of ``data`` with ``method`` and store the results in ``out``.

    Examples go through the model in padded batches (one trace and one pass of the method math per batch). Each
    finished batch is written to its own checksummed shard at once, so a killed run started again with the same
    arguments skips the finished batches and redoes damaged or partial ones; a finished run started again does
    nothing. Under ``torchrun`` or ``accelerate launch`` with several processes, the batches are split over the
    processes (gloo on CPU, one GPU per process otherwise), which write into the same store; each shard's index names
    the rank that wrote it and the manifest the number of processes of every session.

    Speech models (Whisper, wav2vec 2.0 / HuBERT CTC and bare encoders) take rows of audio files: the source column
    (default ``audio``) holds each file's path, ``words`` its forced alignment (a JSON list of ``[word, start_s,
    end_s]``; without one, windows of ``window_s`` seconds), and the target column Whisper's transcript (default
    ``transcript``; missing: the greedy one) or a CTC or bare encoder's frame indices (default ``frames``; missing: the
    frames greedy decoding emits, or every frame).
    Scores are stored per audio unit, each example as ``.attribute`` gives it alone.

    Args:
        model: A model name or local path, a Hugging Face model (with ``tokenizer``, or a speech model's
            ``processor``), an Inseq ``AttributionModel``, or this package's encoder or speech attribution model.
        method: One of the plugin's methods (``inseq_mixing.METHODS``, batched through one trace per batch), or any
            of Inseq's (e.g. ``integrated_gradients``, through Inseq's own loop, one example at a time).
        data: A ``.jsonl``/``.csv``/``.parquet`` path, a ``datasets.Dataset``, a DataFrame or a list of dicts.
        out: Folder of the run store (created if missing).
        tokenizer: Tokenizer of a Hugging Face model object.
        processor: Processor of a speech model object (its feature extractor and tokenizer).
        batch_size: Examples per batch (and per shard). Part of the run's identity: resume with the same value.
        device: Device to run on (default: the model's, or each Accelerate process's own).
        dtype: Run the model in this dtype (``"float32"``, ``"bfloat16"``, ``"float16"``); for a model given as an
            object, convert it yourself.
        source_column: Column of the source text (decoder-only models: the prompt; speech models: the audio path).
            Default ``source`` (speech models: ``audio``).
        target_column: Column of the target (decoder-only: the full text, prompt included). Rows without one, or
            data without the column, get the model's greedy generation, as in Inseq. Default ``target`` (Whisper:
            ``transcript``; CTC and bare speech encoders: ``frames``).
        id_column: Column of unique ids (default: the row number).
        words_column: Speech models: the column of word intervals.
        max_new_tokens: Generation models: the longest generated target of a row without one (default: the model's
            generation config; if it sets no length, transformers' default of 20 new tokens, said once per run).
            Part of the run's identity when given.
        show_progress: Show a progress bar (main process only).
        **method_kwargs: The method's options (as for ``model.attribute``) and ``attribute_target`` (default True
            for encoder–decoders), ``attributed_fn``, ``attr_pos_start``, ``attr_pos_end``, ``skip_special_tokens``;
            or, to explain spans of each generation over context units, ``spans``, ``units``, ``hops``,
            ``separator``, ``language`` (as for ``model.attribute``; the same for every row); speech models:
            ``window_s`` and ``prompt_ids`` (as for their ``.attribute``).

    Missing targets are generated in batches that give each example exactly what ``model.generate`` gives it alone
    (attention mask on padded encoder inputs; decoder-only prompts grouped by length, so none is padded). A
    decoder-only example with an empty prompt is attributed as Inseq does it: from the BOS token.

    Returns:
        A :class:`RunSummary`. Read the results with :func:`~inseq_mixing.load_run`.

    Raises:
        DatasetInputError: Unreadable or empty data, a missing column, missing or repeated ids, a decoder-only target
            that does not start with its prompt.
        RunStoreError: ``out`` holds a run of another model, method, option set or dataset.
        ValueError: An unknown method or option.
    """
    check_method(method)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}.")
    found = identify(model)  # the one config read of a name or folder
    source_column = source_column or found.run_columns[0]
    target_column = target_column or found.run_columns[1]
    examples = read_examples(
        data, source_column, target_column, id_column, words_column if found.reads_words else None
    )
    state, device = distributed_state(device)
    writer = Writer(rank=state.process_index, processes=state.num_processes)
    attribution_model = load_attribution_model(model, method, tokenizer, device, dtype, processor, found)
    inseq_args, options = split_arguments(attribution_model, method_kwargs, max_new_tokens)
    length = generation_length(attribution_model, max_new_tokens, any(example.target is None for example in examples))
    check_targets(attribution_model, examples, length, inseq_args)
    batches = length_sorted_batches(examples, batch_size)
    identity = {**options, **({"max_new_tokens": max_new_tokens} if max_new_tokens is not None else {})}
    manifest = build_manifest(attribution_model, method, identity, inseq_args, examples, batch_size, model)
    store = RunStore(out)
    store.check(manifest, IDENTITY_KEYS)  # every process refuses another run's store before anyone waits
    if state.is_main_process:
        store.open(manifest, IDENTITY_KEYS, processes=state.num_processes)
    state.wait_for_everyone()
    scan = store.scan()
    mine = [number for number in range(len(batches)) if number % state.num_processes == state.process_index]
    todo = [number for number in mine if number not in scan.valid]
    skipped = sum(len(batches[number]) for number in mine if number in scan.valid)
    summary = RunSummary(Path(out), len(examples), 0, skipped, 0.0, rank=writer.rank, processes=writer.processes)
    summary.redone = {number: reason for number, reason in scan.damaged.items() if number in mine}
    summary.stray = scan.stray if state.is_main_process else []
    ShardScan({}, summary.redone, summary.stray).warn(store.root, "their batches are redone")
    start = time.perf_counter()
    with _progress(sum(len(batches[n]) for n in todo), show_progress and state.is_main_process) as bar:
        for number in todo:
            progress = _BatchProgress(bar)
            rows = attribute_batch(attribution_model, batches[number], inseq_args, options, length, progress)
            store.write_shard(number, rows, writer)
            summary.attributed += len(rows)
            progress.done(len(rows))
    summary.seconds = time.perf_counter() - start
    state.wait_for_everyone()
    return summary


def distributed_state(device: str | None):
    """Accelerate's process state under ``torchrun`` / ``accelerate launch`` (or a single process), and the device
    this process runs on.

    On a machine without CUDA (or with ``device="cpu"``, or Accelerate's ``--cpu``), several processes meet over gloo
    and each runs on ``"cpu"``; with CUDA, each process takes the GPU of its local rank (NCCL), unless ``device`` names
    one.
    """
    from accelerate import PartialState

    wants_cpu = (device is not None and str(device).startswith("cpu")) or not torch.cuda.is_available()
    wants_cpu = wants_cpu or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")
    state = PartialState(cpu=wants_cpu)
    if device is None and state.num_processes > 1:
        device = "cpu" if state.device.type == "cpu" else str(state.device)
    return state, device


def load_attribution_model(model, method: str, tokenizer, device: str | None, dtype, processor=None, found=None):
    """The front end of ``model`` with ``method`` (:func:`inseq_mixing.frontends.load_model`: Inseq's model for
    generation models, the encoder or speech front end for the others; ``found``: what
    :func:`~inseq_mixing.frontends.identify` found for it). A model object belongs to the caller: it is never
    converted, and a ``dtype`` it does not run in is refused. A name that cannot be loaded raises ``ValueError``
    naming it."""
    from ..frontends import load_model

    torch_dtype = _torch_dtype(dtype)
    found = found or identify(model)
    if isinstance(model, str | Path):
        try:
            return load_model(str(model), method, tokenizer=tokenizer, processor=processor, device=device,
                              dtype=torch_dtype, found=found)  # fmt: skip
        except Exception as error:  # a missing folder, no tokenizer files, an unsupported architecture...
            raise ValueError(f"Could not load model {str(model)!r}: {type(error).__name__}: {error}") from error
    _refuse_other_dtype(model.model if is_front_end(model) else model, torch_dtype)
    return load_model(model, method, tokenizer=tokenizer, processor=processor, device=device, found=found)


def _refuse_other_dtype(model: torch.nn.Module, dtype: torch.dtype | None) -> None:
    """A model object belongs to the caller: a run never converts it, and refuses a ``dtype`` it does not run in."""
    current = next(model.parameters()).dtype
    if dtype is not None and current != dtype:
        raise ValueError(
            f"The model runs in {current}; convert it to {dtype} before the run (a dataset run converts only the "
            "models it loads from a name or folder, never the model object it is given)."
        )


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def _torch_dtype(dtype) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r}; choose one of {list(DTYPES)}.")
    return DTYPES[dtype]


def check_method(method: str) -> None:
    """Refuse a method that is neither the plugin's nor Inseq's, naming them."""
    if method in DECLARATIONS:
        return
    import inseq

    if method not in inseq.list_feature_attribution_methods():
        raise ValueError(
            f"Unknown method {method!r} for a dataset run; choose one of the plugin's {list(DECLARATIONS)} or "
            f"Inseq's {sorted(set(inseq.list_feature_attribution_methods()) - set(DECLARATIONS))}."
        )


def is_own_front_end(attribution_model) -> bool:
    """Whether the model is one of this package's front ends (encoder-only, speech...), which a run drives through
    its hooks (:class:`~inseq_mixing.frontends.common.FrontEndModel`), rather than Inseq's own model."""
    from ..frontends.common import FrontEndModel

    return isinstance(attribution_model, FrontEndModel)


def is_declared(attribution_model) -> bool:
    """Whether the model's method is one of the plugin's (batched through one trace) rather than Inseq's own."""
    return getattr(attribution_model.attribution_method, "declaration", None) is not None


def split_arguments(attribution_model, kwargs: dict, max_new_tokens: int | None = None) -> tuple[dict, dict]:
    """Split ``kwargs`` into Inseq's attribute arguments (or a front end's own) and the method's options, rejecting
    unknown names."""
    if is_own_front_end(attribution_model):  # its own arguments and the method's options, checked by it
        return attribution_model.run_arguments(dict(kwargs), max_new_tokens)
    method = attribution_model.attribution_method
    if not is_declared(attribution_model):
        return _split_inseq_arguments(attribution_model, kwargs)
    known = method.method.option_names()
    unknown = sorted(set(kwargs) - set(known) - set(INSEQ_ARGUMENTS) - set(SPAN_ARGUMENTS))
    if unknown:
        raise ValueError(
            f"Unknown option(s) {unknown} for {method.method_name}; its options are {known}, and a dataset run "
            f"also takes {list(INSEQ_ARGUMENTS)} (or, for spans of each generation, {list(SPAN_ARGUMENTS)})."
        )
    spans = {name: kwargs[name] for name in SPAN_ARGUMENTS if name in kwargs}
    if spans:
        mixed = sorted(set(kwargs) & set(INSEQ_ARGUMENTS))
        if mixed:
            raise ValueError(f"{mixed} are not taken with {sorted(spans)}: spans= says what is explained.")
        from ..frontends.spans import check_span_arguments

        check_span_arguments(**spans)
        options = {name: value for name, value in kwargs.items() if name in known}
        method.method.check_options(options)
        return spans, options
    per_example = sorted(set(kwargs) & set(PER_EXAMPLE_ARGUMENTS))
    if per_example:
        raise ValueError(f"{per_example} take one text per call: use model.attribute for contrastive explanations.")
    method.method.check_options({name: value for name, value in kwargs.items() if name in known})
    inseq_args = {name: kwargs[name] for name in INSEQ_ARGUMENTS if name in kwargs}
    inseq_args.setdefault("attribute_target", True)
    if not attribution_model.is_encoder_decoder:
        inseq_args["attribute_target"] = False  # decoder-only: the target side is the whole context
    return inseq_args, {name: value for name, value in kwargs.items() if name in known}


def _split_inseq_arguments(attribution_model, kwargs: dict) -> tuple[dict, dict]:
    """Inseq's own methods (gradient baselines, ...): their options are those their ``attribute`` takes (e.g.
    ``n_steps`` for Integrated Gradients); unknown names are refused instead of Inseq's "Unused arguments" warning."""
    method = attribution_model.attribution_method
    candidates = {name: value for name, value in kwargs.items() if name not in INSEQ_ARGUMENTS}
    per_example = sorted(set(candidates) & set(PER_EXAMPLE_ARGUMENTS))
    if per_example:
        raise ValueError(f"{per_example} take one text per call: use model.attribute for contrastive explanations.")
    options, unused = method.get_attribution_args(**candidates)
    if unused:
        raise ValueError(f"Unknown option(s) {sorted(unused)} for {method.method_name}; a dataset run also takes "
                         f"{list(INSEQ_ARGUMENTS)}.")  # fmt: skip
    inseq_args = {name: kwargs[name] for name in INSEQ_ARGUMENTS if name in kwargs}
    inseq_args.setdefault("attribute_target", attribution_model.is_encoder_decoder)
    return inseq_args, options


#: The new tokens transformers generates when neither the call nor the model's generation config sets a length.
TRANSFORMERS_DEFAULT_NEW_TOKENS = 20


def generation_length(attribution_model, max_new_tokens: int | None = None, generates: bool = True) -> dict:
    """The keyword arguments that cap each generated target: ``max_new_tokens`` when given, the model's own
    generation config when it sets a length (``{}``), else transformers' default made explicit, with a warning (once,
    when ``generates``: some row has no target) that says which length is used and how to set it.

    Raises:
        ValueError: ``max_new_tokens`` is not a positive integer.
    """
    if max_new_tokens is not None:
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, not {max_new_tokens!r}.")
        return {"max_new_tokens": max_new_tokens}
    if is_own_front_end(attribution_model):  # what it generates (Whisper's greedy transcripts) it caps itself
        return {}
    config = attribution_model.model.generation_config
    if config.max_new_tokens is not None or config.max_length is not None:
        return {}
    if generates:
        warnings.warn(
            f"The model's generation config sets no length: each generated target has at most "
            f"{TRANSFORMERS_DEFAULT_NEW_TOKENS} new tokens (transformers' default). Set max_new_tokens= "
            "(--max-new-tokens) to change it.",
            GenerationLengthWarning,
            stacklevel=3,
        )
    return {"max_new_tokens": TRANSFORMERS_DEFAULT_NEW_TOKENS}


class GenerationLengthWarning(UserWarning):
    """Targets are generated at a length the user did not choose (the model's config sets none)."""


def check_targets(
    attribution_model, examples: list[Example], length: dict | None = None, front: dict | None = None
) -> None:
    """Every row checked before any work, each error naming the row and its id: decoder-only targets are the full
    text, each must start with its prompt (Inseq's convention), and a prompt whose generation (capped by ``length``,
    :func:`generation_length`) would run past a table of absolute positions (GPT-2's ``n_positions``) is refused;
    encoder rows are validated by their front end, speech rows too (their audio read, their word intervals cut into
    units, with the front end's arguments ``front``)."""
    if is_own_front_end(attribution_model):  # every row checked by the front end before any work
        names = [f"Row {example.index} (id {example.id!r})" for example in examples]
        sources, targets, words = row_fields(examples)
        try:
            attribution_model.check_rows(sources, targets, words, front or {}, names)
        except ValueError as error:
            raise DatasetInputError(str(error)) from error
        return
    spans = {name: value for name, value in (front or {}).items() if name in SPAN_ARGUMENTS}
    if spans:
        check_span_rows(attribution_model, [example for example in examples if example.target is not None], spans)
    if attribution_model.is_encoder_decoder:
        return
    for example in examples:
        if example.target is not None and not example.target.startswith(example.source):
            raise DatasetInputError(
                f"Row {example.index} (id {example.id!r}): the target of a decoder-only model is the full text and "
                f"must start with the prompt {example.source!r}; it is {example.target!r}."
            )
        if example.source and not attribution_model.encode(example.source).input_ids.shape[1]:
            raise DatasetInputError(
                f"Row {example.index} (id {example.id!r}): the prompt {example.source!r} gives no token with this "
                "tokenizer: give it text, or leave it empty (an empty prompt starts from the BOS token)."
            )
    prompts = [
        (example.source, f"Row {example.index} (id {example.id!r})") for example in examples if not example.target
    ]
    check_prompts_fit(attribution_model, prompts, length)


def check_span_rows(attribution_model, examples: list[Example], spans: dict, targets: list[str] | None = None) -> None:
    """Each row's spans and units found in its texts by the span front end (its tokenizer alone, no model run), an
    error naming the row and its id: before any work for the rows with a target, and before the batch is attributed
    for those whose target was just generated (``targets``: their texts)."""
    from ..frontends.spans import SpanAttributionModel

    front = SpanAttributionModel(attribution_model)
    settings = {name: spans[name] for name in ("spans", "units", "separator", "language") if name in spans}
    texts = targets if targets is not None else [example.target for example in examples]
    for example, text in zip(examples, texts, strict=True):
        try:
            front.item_of(f"Row {example.index} (id {example.id!r})", example.source, text, **settings)
        except ValueError as error:
            raise DatasetInputError(str(error)) from error


def row_fields(examples: list[Example]) -> tuple[list, list, list]:
    """The sources, target texts (None: the model's own) and word intervals (None where not given) of ``examples``,
    as a front end's :meth:`~inseq_mixing.frontends.common.FrontEndModel.check_rows` takes them."""
    words = [None if example.words is None else list(example.words) for example in examples]
    return [example.source for example in examples], [example.target for example in examples], words


def check_prompts_fit(attribution_model, prompts: list[tuple[str, str]], length: dict | None = None) -> None:
    """Refuse a decoder-only prompt to generate from whose generation could run past the model's table of absolute
    positions (the model would fail inside ``generate`` with an ``IndexError``).

    Args:
        attribution_model: The Inseq model.
        prompts: ``(prompt, where)`` pairs; ``where`` names the prompt in the error (e.g. its row).
        length: The generation's cap (:func:`generation_length`; default: the model's generation config).

    Raises:
        DatasetInputError: Naming the first prompt that does not fit, the lengths, and what to do.
    """
    from ..specs import get_spec

    if attribution_model.is_encoder_decoder or not prompts:
        return
    limit = get_spec(attribution_model.model).max_positions
    if limit is None:
        return
    config = attribution_model.model.generation_config
    new_tokens = (length or {}).get("max_new_tokens") or config.max_new_tokens
    for prompt, where in prompts:
        tokens = attribution_model.encode(decoder_only_prompt(attribution_model, prompt)[0]).input_ids.shape[1]
        longest = tokens + new_tokens if new_tokens else max(config.max_length or 0, tokens + 20)
        if longest > limit:
            raise DatasetInputError(
                f"{where}: the prompt has {tokens} tokens, and its generation may reach {longest} positions, but this "
                f"model has position embeddings for {limit}. Give its target (the full text), or shorten the prompt."
            )


def length_sorted_batches(examples: list[Example], batch_size: int) -> list[list[Example]]:
    """Batches of examples of similar length (less padding); the same data always gives the same batches."""
    ordered = sorted(examples, key=lambda ex: len(ex.source) + len(ex.target or ""))
    return [ordered[start : start + batch_size] for start in range(0, len(ordered), batch_size)]


def attribute_batch(
    attribution_model,
    batch: list[Example],
    inseq_args: dict,
    options: dict,
    length: dict | None = None,
    progress: "_BatchProgress | None" = None,
) -> list[dict]:
    """Attribute one batch (generating missing targets first, capped by ``length``) and return its store rows, in
    batch order; ``progress`` is told what is being done, and each example done where they are done one by one."""
    progress = progress or _BatchProgress(None)
    if is_own_front_end(attribution_model):  # inseq_args: the front end's own arguments (speech: window_s...)
        attributed = attribution_model.attribute_rows(*row_fields(batch), inseq_args, options)
        return [
            sequence_to_row(sequence, example, example.source, text)
            for (sequence, text), example in zip(attributed, batch, strict=True)
        ]
    sources, targets, _ = row_fields(batch)
    missing = [idx for idx, target in enumerate(targets) if target is None]
    if missing:
        progress.doing(f"generating {len(missing)} target(s)")
        generated = generate_targets(attribution_model, [sources[idx] for idx in missing], length)
        for idx, text in zip(missing, generated, strict=True):
            targets[idx] = text
    if any(name in inseq_args for name in SPAN_ARGUMENTS):  # spans over units: the span front end, one call
        from ..frontends.spans import SpanAttributionModel

        if missing:  # the rows whose target was just generated, named as the others were before any work
            check_span_rows(attribution_model, [batch[idx] for idx in missing], inseq_args,
                            [targets[idx] for idx in missing])  # fmt: skip
        progress.doing("attributing spans")
        sequences = (
            SpanAttributionModel(attribution_model)
            .attribute(sources, targets, batch_size=len(sources), show_progress=False, **inseq_args, **options)
            .sequence_attributions
        )
    elif is_declared(attribution_model):
        sequences = attribute_texts(attribution_model, sources, targets, inseq_args, options).sequence_attributions
    else:  # Inseq's own methods, through Inseq's loop: each example exactly as model.attribute gives it
        progress.doing("attributing")
        sequences = []
        for source, target in zip(sources, targets, strict=True):
            sequences.append(
                attribution_model.attribute(
                    source, target, show_progress=False, **inseq_args, **options
                ).sequence_attributions[0]
            )
            progress.one()
    return [
        sequence_to_row(sequence, example, source, target)
        for sequence, example, source, target in zip(sequences, batch, sources, targets, strict=True)
    ]


def generate_targets(attribution_model, sources: list[str], cap: dict | None = None) -> list[str]:
    """What ``attribution_model.generate(source)`` gives each source alone (the target ``model.attribute(source)``
    attributes), computed in batches, each generation capped by ``cap`` (:func:`generation_length`).

    Encoder–decoders: one ``generate`` call on the right-padded sources with their attention mask (the decoder starts
    alike for all). Decoder-only models: one call per prompt length, so no prompt is padded and every ``max_length``
    or ``min_length`` counts as it does alone. Texts are decoded as Inseq decodes one generation: special tokens kept
    for decoder-only models, dropped for encoder–decoders.
    """
    prompts = [decoder_only_prompt(attribution_model, source)[0] for source in sources]
    tokenizer = attribution_model.tokenizer
    lengths: list[int] = []
    if attribution_model.is_encoder_decoder:
        groups = [list(range(len(prompts)))]
    else:
        lengths = [attribution_model.encode(prompt).input_ids.shape[1] for prompt in prompts]
        by_length: dict[int, list[int]] = {}
        for idx, length in enumerate(lengths):
            by_length.setdefault(length, []).append(idx)
        groups = list(by_length.values())
    texts: list[str] = [""] * len(prompts)
    for group in groups:
        padding_side, tokenizer.padding_side = tokenizer.padding_side, "right"
        try:
            inputs = attribution_model.encode([prompts[idx] for idx in group])
        finally:
            tokenizer.padding_side = padding_side
        with torch.no_grad():
            sequences = attribution_model.model.generate(
                input_ids=inputs.input_ids,
                attention_mask=inputs.attention_mask,
                return_dict_in_generate=True,
                **(cap or {}),
            ).sequences
        for row, idx in enumerate(group):
            ids = sequences[row]
            if not attribution_model.is_encoder_decoder:
                ids = _until_end_of_sequence(ids, lengths[idx], attribution_model.model.generation_config)
            text = attribution_model.decode(ids[None], skip_special_tokens=attribution_model.is_encoder_decoder)
            texts[idx] = text[0] if isinstance(text, list) else text
    return texts


def _until_end_of_sequence(ids: torch.Tensor, prompt_length: int, config) -> torch.Tensor:
    """A batched decoder-only generation cut where it would have stopped alone: after its first end-of-sequence token
    (the batch pads finished rows until the longest ends)."""
    ends = config.eos_token_id
    ends = [] if ends is None else [ends] if isinstance(ends, int) else list(ends)
    generated = ids[prompt_length:]
    hits = torch.isin(generated, torch.tensor(ends, device=ids.device)).nonzero()
    return ids if not len(hits) else ids[: prompt_length + int(hits[0, 0]) + 1]


def decoder_only_prompt(attribution_model, source: str, target: str | None = None) -> tuple[str, str | None]:
    """Inseq's convention for an empty decoder-only prompt: it becomes the BOS token, and the target starts with it.

    Raises:
        DatasetInputError: An empty prompt for a tokenizer without a BOS token.
    """
    if attribution_model.is_encoder_decoder or source:
        return source, target
    bos = attribution_model.bos_token
    if not bos:
        raise DatasetInputError(
            "An empty prompt is attributed from the BOS token, and this tokenizer has none: give every row a prompt."
        )
    if target is not None and not target.startswith(bos):
        target = f"{bos} {target}"
    return bos, target


def attribute_texts(attribution_model, sources: list[str], targets: list[str], inseq_args: dict, options: dict):
    """Inseq's attribution of a whole batch of (source, target) pairs in one step of the final-step method.

    Inseq gives a whole batch one first attributed position, which does not fit prompts of different lengths in a
    left-padded decoder-only batch: such a batch is right-padded (causal attention makes the padding invisible to real
    tokens), attributed from position 1, and each sequence then keeps the columns after its own prompt, as
    ``model.attribute`` gives them for the sequence alone. An empty decoder-only prompt becomes the BOS token, as in
    ``model.attribute`` (:func:`decoder_only_prompt`).
    """
    from inseq.attr.feat import extract_args
    from inseq.data.attribution import merge_attributions

    if not attribution_model.is_encoder_decoder:
        pairs = [decoder_only_prompt(attribution_model, s, t) for s, t in zip(sources, targets, strict=True)]
        sources, targets = [source for source, _ in pairs], [target for _, target in pairs]
    method = attribution_model.attribution_method
    args = dict(inseq_args)
    attributed_fn = attribution_model.get_attributed_fn(args.pop("attributed_fn", None))
    attribution_args, attributed_fn_args, step_scores_args = extract_args(
        method,
        attributed_fn,
        [],
        default_args=attribution_model.formatter.get_step_function_reserved_args(),
        **options,
    )
    common = {
        "show_progress": False,
        "attributed_fn": attributed_fn,
        "attribution_args": attribution_args,
        "attributed_fn_args": attributed_fn_args,
        "step_scores_args": step_scores_args,
        "attribute_target": args.pop("attribute_target"),
        "skip_special_tokens": args.pop("skip_special_tokens", False),
    }
    if attribution_model.is_encoder_decoder:
        outputs = method.prepare_and_attribute(sources, targets, batch_size=len(sources), **common, **args)
        return merge_attributions(outputs)
    tokenizer = attribution_model.tokenizer
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "right"
    try:
        batch = attribution_model.formatter.prepare_inputs_for_attribution(
            attribution_model, targets, False, common["skip_special_tokens"]
        )
    finally:
        tokenizer.padding_side = padding_side
    special = not common["skip_special_tokens"]
    starts = [
        max(attribution_model.encode(source, add_special_tokens=special).input_ids.shape[1],
            args.get("attr_pos_start") or 0)
        for source in sources
    ]  # fmt: skip
    with method.explaining_from(starts):  # the methods skip the prompt rows that keep_generated drops
        output = method.attribute(batch, attr_pos_start=1, attr_pos_end=None, **common)
    for sequence, start in zip(output.sequence_attributions, starts, strict=True):
        end = min(len(sequence.target), args.get("attr_pos_end") or len(sequence.target))
        keep_generated(sequence, start, end)
    return output


def keep_generated(sequence, start: int, end: int) -> None:
    """Restrict a decoder-only sequence output to the generated positions ``start:end`` (the prompt is its source)."""
    first, last = start - sequence.attr_pos_start, end - sequence.attr_pos_start
    sequence.target_attributions = sequence.target_attributions[:, first:last]
    sequence.step_scores = {name: score[first:last] for name, score in (sequence.step_scores or {}).items()}
    sequence.source = sequence.target[:start]
    sequence.attr_pos_start, sequence.attr_pos_end = start, end


def build_manifest(attribution_model, method, options, inseq_args, examples, batch_size, model_arg) -> dict:
    """What identifies a run (model, method, options, data, batching), and the package versions that made it."""
    hf_model = attribution_model.model
    return {
        "format": FORMAT,
        "model": {
            "name": str(model_arg) if isinstance(model_arg, str | Path) else attribution_model.model_name,
            "class": type(hf_model).__name__,
            "config_sha": _sha(hf_model.config.to_json_string(use_diff=False)),
            "weights_sha": weights_fingerprint(hf_model),
        },
        "method": method,
        "options": json.loads(json.dumps({**options, **inseq_args}, sort_keys=True, default=repr)),
        "dtype": str(hf_model.dtype).removeprefix("torch."),
        "data": {"sha": fingerprint_examples(examples)},
        "examples": len(examples),
        "batching": {"batch_size": batch_size, "order": "length"},
        "versions": {name: _version(name) for name in ("inseq-mixing", "inseq", "transformers", "torch")},
    }


def weights_fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter's and buffer's name, dtype, shape and bytes (the whole ``state_dict``, in order): any
    change to any weight, however small or late in the network, gives another fingerprint.

    It reads every byte of the weights once per run and process (tensors are copied to the host one at a time): 1.4 to
    1.5 GB/s measured on a 2-core CPU (``benchmarks/bench_fingerprint.py``), so about 10 s for a 7B model in bfloat16
    (14 GB). A model dispatched with offloaded weights is read from where accelerate keeps them, one weight at a time,
    and fingerprints as the same model on one device.
    """
    digest = hashlib.sha256()
    for name, value in state_tensors(model):
        digest.update(f"{name}|{value.dtype}|{tuple(value.shape)}|".encode())
        if value.numel():
            digest.update(value.reshape(-1).cpu().contiguous().view(torch.uint8).numpy().data)
    return digest.hexdigest()[:16]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


class _BatchProgress:
    """One batch's share of the run's bar: what is being done (generating targets, attributing), each example done
    where the batch does them one by one (Inseq's own methods), the rest when the batch is stored."""

    def __init__(self, bar):
        self.bar, self.counted = bar, 0

    def doing(self, what: str) -> None:
        if self.bar is not None:
            self.bar.set_description(what)

    def one(self) -> None:
        self.counted += 1
        if self.bar is not None:
            self.bar.update(1)

    def done(self, examples: int) -> None:
        """The batch is stored: its examples not counted yet are."""
        if self.bar is not None:
            self.bar.update(examples - self.counted)
            self.bar.set_description("attributing")


class _progress:
    """A tqdm bar over examples (examples/s and time left), or nothing."""

    def __init__(self, total: int, show: bool):
        self.total, self.show = total, show

    def __enter__(self):
        from tqdm.auto import tqdm

        self.bar = tqdm(
            total=self.total,
            unit="ex",
            desc="attributing",
            disable=not self.show or not self.total,
            dynamic_ncols=True,
        )
        return self.bar

    def __exit__(self, *exc):
        self.bar.close()


__all__ = ["DatasetInputError", "RunStoreError", "RunSummary", "attribute_dataset"]
