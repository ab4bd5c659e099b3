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
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from ..frontends import identify, is_front_end, run_front_end
from ..frontends.generation import check_method
from ..trace import state_tensors
from .data import DatasetInputError, Example, fingerprint_examples, read_examples
from .store import FORMAT, RunStore, RunStoreError, ShardScan, Writer, sequence_to_row

logger = logging.getLogger(__name__)

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
    images_column: str = "images",
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
        processor: Processor of a speech model object (its feature extractor and tokenizer), or of a
            vision-language one (its image processor and tokenizer).
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
        images_column: Vision-language models: the column of each prompt's image files (a path, or a JSON list of
            paths, one per placeholder in the prompt, in order); the prompt is the source column (default
            ``prompt``), the answer the target column (default ``answer``; missing: the greedy answer).
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
    extra = images_column if found.reads_images else words_column if found.reads_words else None
    examples = read_examples(data, source_column, target_column, id_column, extra, images=found.reads_images)
    state, device = distributed_state(device)
    writer = Writer(rank=state.process_index, processes=state.num_processes)
    attribution_model = load_attribution_model(model, method, tokenizer, device, dtype, processor, found)
    front = run_front_end(attribution_model)
    own, options = front.run_arguments(method_kwargs, max_new_tokens)
    names = [f"Row {example.index} (id {example.id!r})" for example in examples]
    try:  # every row checked by the front end before any work
        front.check_rows(*row_fields(examples), own, names)
    except ValueError as error:
        raise DatasetInputError(str(error)) from error
    batches = length_sorted_batches(examples, batch_size)
    identity = {**options, **({"max_new_tokens": max_new_tokens} if max_new_tokens is not None else {})}
    manifest = build_manifest(front, method, identity, own, examples, batch_size, model)
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
            rows = attribute_batch(front, batches[number], own, options, progress)
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


def row_fields(examples: list[Example]) -> tuple[list, list, list]:
    """The sources, target texts (None: the model's own) and word intervals (None where not given) of ``examples``,
    as a front end's :meth:`~inseq_mixing.frontends.common.FrontEndModel.check_rows` takes them."""
    words = [None if example.words is None else list(example.words) for example in examples]
    return [example.source for example in examples], [example.target for example in examples], words


def attribute_batch(front, batch: list[Example], own: dict, options: dict, progress: "_BatchProgress | None" = None):
    """One batch attributed by the front end (:meth:`~inseq_mixing.frontends.common.FrontEndModel.attribute_rows`),
    as its store rows, in batch order; ``progress`` is told what is being done."""
    names = [f"Row {example.index} (id {example.id!r})" for example in batch]
    attributed = front.attribute_rows(*row_fields(batch), own, options, names=names,
                                      progress=progress or _BatchProgress(None))  # fmt: skip
    return [
        sequence_to_row(sequence, example, example.source, text)
        for (sequence, text), example in zip(attributed, batch, strict=True)
    ]


def length_sorted_batches(examples: list[Example], batch_size: int) -> list[list[Example]]:
    """Batches of examples of similar length (less padding); the same data always gives the same batches."""
    ordered = sorted(examples, key=lambda ex: len(ex.source) + len(ex.target or ""))
    return [ordered[start : start + batch_size] for start in range(0, len(ordered), batch_size)]


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
