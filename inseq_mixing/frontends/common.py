"""What every front end of this package shares: the one attribution loop, the model object's device and name, the
hooks of a dataset run, its argument checks.

No math, no layout (that is :mod:`.layout`'s), and no decision on what kind a model is (that is :mod:`.router`'s).
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch
from torch import nn

from ..declarations.graphs import GRAPH_KEYWORD, collecting_graphs, store_graphs
from ..memory import available_bytes
from ..methods.blocks import upcast
from ..trace import eval_mode

#: Inseq's step scores this package's own front ends answer, from the model's logits at the explained entries.
STEP_SCORES = ("logit", "probability", "entropy")

#: Inseq's gradient baselines, by name, as Captum classes on the input embeddings.
GRADIENT_METHODS = ("integrated_gradients", "deeplift", "saliency", "input_x_gradient")
#: The options of Captum's ``attribute`` each gradient baseline takes (``baselines``: a number, a token whose
#: embedding stands at every position, e.g. the mask or pad token, or a tensor broadcastable to ``(tokens,
#: d_model)``; ``return_convergence_delta``: Captum's completeness gap, as the step score ``convergence_delta``).
GRADIENT_OPTIONS = {
    "integrated_gradients": ("n_steps", "method", "internal_batch_size", "baselines", "return_convergence_delta"),
    "deeplift": ("baselines", "return_convergence_delta"),
    "saliency": ("abs",),
    "input_x_gradient": (),
}


def first_block_input(runner: nn.Module, first: nn.Module, kwargs: dict) -> torch.Tensor:
    """What the block ``first`` reads in a forward pass of ``runner`` on ``kwargs`` (without gradients), detached: the
    input the gradient baselines attribute."""
    recorded = {}

    def record(_module, args, call) -> None:  # a pre-hook that returns something would replace the arguments
        recorded["input"] = (args[0] if args else call["hidden_states"]).detach()

    handle = first.register_forward_pre_hook(record, with_kwargs=True)
    try:
        with torch.no_grad():
            runner(**kwargs)
    finally:
        handle.remove()
    return recorded["input"]


@contextmanager
def first_block_input_replaced(first: nn.Module, embeds: torch.Tensor) -> Iterator[None]:
    """Inside, the block ``first`` reads ``embeds`` instead of its input (Captum's forward functions: the explained
    quantity as a function of that input); the hook removed on exit, whatever happens."""

    def replace(_module, args, call):
        if args:
            return (embeds, *args[1:]), call
        return args, {**call, "hidden_states": embeds}

    handle = first.register_forward_pre_hook(replace, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def captum_method(name: str, forward: nn.Module):
    """Captum's class of the gradient baseline ``name`` on ``forward`` (DeepLift reads the module, the others its
    forward function)."""
    import captum.attr

    classes = {"integrated_gradients": captum.attr.IntegratedGradients, "deeplift": captum.attr.DeepLift,
               "saliency": captum.attr.Saliency, "input_x_gradient": captum.attr.InputXGradient}  # fmt: skip
    return classes[name](forward if name == "deeplift" else forward.forward)


class PreparedBatch(Protocol):
    """What :meth:`FrontEndModel.prepare` returns: one batch ready for the method (``request``: the declaration's
    :class:`~inseq_mixing.declarations.Request`, or None for a method the front end runs itself), and its size."""

    request: Any

    @property
    def size(self) -> int: ...


class FrontEndModel:
    """The base of the package's own front ends (models Inseq does not load: encoder-only, speech, the next
    modality). It owns what they share:

    - :meth:`attribute_items`, the one attribution loop: the method's options checked against its declaration before
      any work, the model in eval mode (its mode restored after, also on error), batches with a progress bar, the
      ``info`` dictionary, the ``inseq.FeatureAttributionOutput``;
    - the hooks a dataset run calls (:mod:`inseq_mixing.runs.runner` calls these and never asks which front end it
      holds): :meth:`run_arguments`, :meth:`check_rows`, :meth:`attribute_rows`.

    A front end's ``attribute`` turns its user's arguments into one item per input and calls :meth:`attribute_items`;
    it fills two hooks: :meth:`prepare` (items → a batch with its ``Request``) and :meth:`present` (one row of the
    method's result → an Inseq sequence, laid out with :mod:`.layout`).
    """

    model: nn.Module
    method: str
    #: The method's declaration (:mod:`inseq_mixing.declarations`), or None for a method the front end runs itself.
    declaration: Any

    #: Keyword arguments of ``attribute`` a dataset run passes on besides the method's options.
    RUN_ARGUMENTS: tuple[str, ...] = ()
    #: Whether the front end generates its targets where none is given (then a run's ``max_new_tokens`` caps them).
    GENERATES = False

    #: What one input is called in the progress bar (``"text"``, ``"utterance"``, ``"image"``).
    item_name = "example"

    def run_arguments(self, kwargs: dict, max_new_tokens: int | None = None) -> tuple[dict, dict]:
        """``kwargs`` split into this front end's own arguments (:data:`RUN_ARGUMENTS`) and the method's options,
        both checked (an unknown name raises ``ValueError`` listing the known ones); ``max_new_tokens`` caps what the
        front end generates, where it generates."""
        own = {name: kwargs[name] for name in self.RUN_ARGUMENTS if name in kwargs}
        options = {name: value for name, value in kwargs.items() if name not in self.RUN_ARGUMENTS}
        try:
            self.check_options(options)
        except ValueError as error:
            if not self.RUN_ARGUMENTS:
                raise
            raise ValueError(f"{error} A dataset run of this model also takes {list(self.RUN_ARGUMENTS)}.") from None
        if self.GENERATES and max_new_tokens is not None:
            own["max_new_tokens"] = max_new_tokens
        return own, options

    #: The options each gradient baseline takes in this front end (where it runs them: its ``declaration`` None).
    GRADIENT_OPTIONS: dict[str, tuple[str, ...]] = GRADIENT_OPTIONS

    def check_options(self, options: dict) -> None:
        """Refuse options the method does not take (``ValueError`` naming them): the declaration's, or a gradient
        baseline's Captum options (:attr:`GRADIENT_OPTIONS`)."""
        if self.declaration is not None:
            self.declaration.check_options(options)
            return
        known = self.GRADIENT_OPTIONS[self.method]
        if set(options) - set(known):
            raise ValueError(
                f"Unknown option(s) {sorted(set(options) - set(known))} for {self.method}: it takes {list(known)} "
                "(Captum's own names)."
            )

    def make_options(self, options: dict) -> dict:
        """The declared method's options as its computation takes them (defaults filled in); a gradient baseline's
        as given."""
        return self.declaration.make_options(options) if self.declaration is not None else dict(options)

    def inseq_keywords(self, options: dict, targets, contrastive: bool) -> tuple[object, list[str]]:
        """Inseq's names for this front end's arguments, taken out of ``options`` (what an Inseq user passes by
        habit): ``generated_texts`` is ``targets``; ``attributed_fn`` is checked (these front ends explain the logit
        of each explained entry, ``contrast_logits_diff`` with foils); ``step_scores`` are
        answered from the model's logits (:data:`STEP_SCORES`).

        Args:
            options: The keyword arguments ``attribute`` did not name (Inseq's names are removed from it).
            targets: The targets given by their own name (None: not given).
            contrastive: Whether foils were given.

        Returns:
            The targets, and the step scores asked for.
        """
        generated = options.pop("generated_texts", None)
        if generated is not None:
            if targets is not None:
                raise ValueError("Give the targets once: targets= or generated_texts= (Inseq's name), not both.")
            targets = generated
        function = options.pop("attributed_fn", None)
        if function is not None:
            expected = "contrast_logits_diff" if contrastive else "logit"
            if function != expected:
                raise ValueError(
                    f"attributed_fn={function!r}: {type(self).__name__} explains {expected!r} (the logit of each "
                    "explained entry; with foils=, the target's minus the foil's). Inseq's other functions are "
                    "offered on generation models through inseq.load_model; here, step_scores=['probability'] gives "
                    "the probabilities."
                )
        steps = options.pop("step_scores", None) or []
        steps = [steps] if isinstance(steps, str) else list(steps)
        unknown = [name for name in steps if name not in STEP_SCORES]
        if unknown:
            raise ValueError(
                f"step_scores {unknown}: this front end gives {list(STEP_SCORES)}, read from the model's logits at "
                "the explained entries."
            )
        if steps and getattr(self, "task", None) is None:
            raise ValueError(f"step_scores: {type(self.model).__name__} is a bare encoder and has no output to score.")
        return targets, steps

    # ----- the one pre-loop, and the one attribution loop -----

    #: Why a front end takes no foils (``None``: it takes them, through :meth:`call_foils`).
    NO_FOILS: str | None = "this front end explains the logits of its own outputs, without a foil"

    def attribute_inputs(self, inputs: list, targets=None, foils=None, *, batch_size: int, show_progress: bool,
                         method_options: dict, call: dict | None = None):  # fmt: skip
        """What every front end's ``attribute`` ends in once its inputs are a list: the batch size checked, the foils
        (:meth:`call_foils`) and Inseq's keywords (:meth:`inseq_keywords`) taken out of ``method_options``, one item
        per input (:meth:`items`: a bad input is named before any work), the call's settings
        (:meth:`call_settings`), the work announced (:meth:`before_work`), then the batches (:meth:`attribute_items`,
        as many items per batch as :meth:`batch_size_for` allows) with the output's ``info``
        (:meth:`info_entries`).

        Args:
            inputs: One entry per input (texts, images, utterances), in order.
            targets, foils: As the front end's ``attribute`` takes them.
            batch_size: Inputs per forward pass, as the user asked.
            show_progress: Show a progress bar.
            method_options: The method's options, with Inseq's keywords among them (taken out here).
            call: The front end's own arguments of this call (positions, words, windows, ...), passed by name to
                :meth:`items` and :meth:`call_settings`.
        """
        if not inputs:
            raise ValueError(f"Give at least one {self.item_name}.")
        check_batch_size(batch_size)
        call = call or {}
        foils = self.call_foils(plain(foils), method_options)
        targets, steps = self.inseq_keywords(method_options, targets, foils is not None)
        items = self.items(inputs, targets, foils, **call)
        settings = self.call_settings(method_options, **call)
        self.before_work(items)
        return self.attribute_items(items, batch_size=self.batch_size_for(batch_size), show_progress=show_progress,
                                    method_options=method_options, info=self.info_entries(items, settings),
                                    settings=settings, step_scores=steps)  # fmt: skip

    def call_foils(self, foils, options: dict):
        """The call's foils, from ``foils=`` or Inseq's ``contrast_targets=`` (taken out of ``options``); here
        refused with :data:`NO_FOILS` (front ends that take foils fill this hook)."""
        contrast = [name for name in ("contrast_targets", "contrast_targets_alignments")
                    if options.pop(name, None) is not None]  # fmt: skip
        if contrast or foils is not None:
            raise ValueError(f"{contrast[0] if contrast else 'foils'}: {self.NO_FOILS}.")
        return None

    def items(self, inputs: list, targets, foils, **call) -> list:
        """One item per input as :meth:`prepare` takes them (each read and checked, named in errors)."""
        raise NotImplementedError

    def call_settings(self, options: dict, **call):
        """What every :meth:`prepare` of this call reads besides its items (None here)."""
        return None

    def before_work(self, items: list) -> None:
        """What the front end readies once the inputs are checked, before the first batch (nothing here)."""

    def info_entries(self, items: list, settings=None) -> dict:
        """The front end's entries of the output's ``info``."""
        return {}

    def batch_size_for(self, batch_size: int) -> int:
        """The batch size this model runs (a model whose padding changes the real rows runs one input at a time)."""
        return batch_size

    def attribute_items(
        self,
        items: list,
        *,
        batch_size: int,
        show_progress: bool,
        method_options: dict,
        info: dict,
        settings=None,
        step_scores: list[str] = (),
    ):
        """Attribute ``items`` (one per input, as the front end's :meth:`prepare` takes them) in batches.

        Args:
            items: One entry per input, in order.
            batch_size: Items per forward pass.
            show_progress: Show a progress bar: it counts inputs (moving by a batch at a time) and says what is being
                done (the traced forward pass, the method).
            method_options: The method's options as the user gave them (checked here, before any work).
            info: The front end's own entries of the output's ``info`` (the method, the model and the options are
                added here).
            settings: Passed to every :meth:`prepare` call (the front end's per-call arguments).
            step_scores: Inseq's step scores to add (:meth:`inseq_keywords`), read from :meth:`output_logits`.

        Returns:
            ``inseq.FeatureAttributionOutput``, one sequence per item.
        """
        from tqdm.auto import tqdm

        from .output import ExplainedOutput

        method_options = dict(method_options)
        graphs = method_options.pop(GRAPH_KEYWORD, None)
        self.check_options(method_options)
        options = self.make_options(method_options)
        self.check_sizes(items, options, settings, batch_size)
        sequences, axis = [], None
        bar = tqdm(total=len(items), disable=not show_progress, desc=self.method, unit=self.item_name)
        with eval_mode(self.model), bar, collecting_graphs(graphs) as collector:
            for start in range(0, len(items), batch_size):
                chunk = items[start : start + batch_size]
                bar.set_postfix_str("forward pass, traced")
                batch = self.prepare(chunk, settings)
                bar.set_postfix_str(f"{self.method} on {len(chunk)} {self.item_name}(s)")
                batch_sequences, batch_axis = self.explain(batch, options)
                if step_scores:
                    self.add_step_scores(batch, batch_sequences, step_scores)
                sequences += batch_sequences
                axis = batch_axis if batch_axis is not None else axis
                bar.update(len(chunk))
        info = {
            "attribution_method": self.method,
            "model_name": self.model_name,
            "model_class": type(self.model).__name__,
            **info,
            "step_scores": list(step_scores),
            "attribution_args": dict(method_options),
        }
        if axis is not None:
            info["score_axis"] = list(axis)
        store_graphs(info, collector)
        return ExplainedOutput(sequence_attributions=sequences, step_attributions=None, info=info)

    def check_sizes(self, items: list, options, settings=None, batch_size: int = 1) -> None:
        """Every item's size checked by the method (:meth:`~inseq_mixing.declarations.Declaration.check_sizes`: a
        request that cannot be met, or a batch that cannot fit in the device's free memory, is refused before any
        batch runs, naming the item)."""
        if self.declaration is None:
            return
        sizes = self.input_sizes(items, settings)
        memory = (next(self.model.parameters()).element_size(), available_bytes(self.device))
        self.declaration.check_sizes(sizes, [item.name for item in items], self.spec, options, memory, batch_size)

    def input_sizes(self, items: list, settings=None) -> list:
        """Each item's :class:`~inseq_mixing.declarations.InputSize` (the positions of each stack the trace will
        hold for it, an upper bound where the model generates), found without running the model."""
        raise NotImplementedError

    def prepare(self, items: list, settings) -> PreparedBatch:
        """One batch of items made ready: inputs encoded, the model traced, what is explained found."""
        raise NotImplementedError

    def explain(self, batch: PreparedBatch, options: dict) -> tuple[list, list[str] | None]:
        """One batch's sequences and the labels of their extra axis (or None): the declaration's computation on the
        batch's ``Request``, each row presented."""
        result = self.declaration.run(batch.request, options)
        return [self.present(batch, result, row) for row in range(batch.size)], result.axis

    def present(self, batch: PreparedBatch, result, row: int):
        """Row ``row`` of the method's ``result`` as an Inseq sequence (:mod:`.layout`)."""
        raise NotImplementedError

    def output_logits(self, batch: PreparedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's logits ``(B, positions, outputs)`` and the explained output at each position ``(B,
        positions)``, for Inseq's step scores."""
        raise NotImplementedError

    @torch.no_grad()
    def add_step_scores(self, batch: PreparedBatch, sequences: list, names: list[str]) -> None:
        """Inseq's step scores ``names`` of each sequence's explained entries, from :meth:`output_logits` (a logit
        method's own ``logit`` is kept: it is the same number)."""
        logits, ids = self.output_logits(batch)
        cells = [(row, cell) for row, explained in enumerate(batch.explained) for cell in explained]
        rows, columns = (torch.tensor(index, device=logits.device) for index in zip(*cells, strict=True))
        chosen = upcast(logits[rows, columns])  # (entries, outputs): only the explained entries' rows
        log_probs = chosen.log_softmax(-1)
        explained = ids[rows, columns].to(chosen.device)[:, None]
        values = {
            "logit": chosen.gather(-1, explained)[:, 0],
            "probability": log_probs.gather(-1, explained)[:, 0].exp(),
            "entropy": torch.special.entr(log_probs.exp()).sum(-1),
        }
        start = 0
        for row, sequence in enumerate(sequences):
            count = len(batch.explained[row])
            for name in names:
                sequence.step_scores.setdefault(name, values[name][start : start + count].cpu())
            start += count

    def source_words(self, sequence, text: str) -> list[int]:
        """How the positions of a sequence's source group into the whitespace-separated words of ``text`` (the
        evaluation protocols work on words): per source position, its word's index, or -1 for none (special tokens,
        silences)."""
        raise NotImplementedError

    # ----- a dataset run's hooks -----

    def check_rows(self, sources: list, targets: list, words: list, own: dict, names: list[str]) -> None:
        """Refuse, before any work, a row this front end cannot explain (``ValueError`` naming it by ``names``):
        ``targets`` are the rows' target texts (None: the model's own prediction), ``words`` their word intervals
        (None where not given), ``own`` this front end's arguments (:meth:`run_arguments`)."""
        raise NotImplementedError

    def attribute_rows(self, sources: list, targets: list, words: list, own: dict, options: dict,
                       names: list[str] | None = None, progress=None) -> list:  # fmt: skip
        """One batch of rows (as :meth:`check_rows` takes them) attributed in one call: per row, its Inseq sequence
        output and the text its target is stored under (the given one, or what the model predicted). ``names``
        name the rows in errors; ``progress`` (``doing(text)``, ``one()``) is told what is being done."""
        raise NotImplementedError

    def row_targets(self, targets: list, names: list[str] | None = None) -> list:
        """The rows' target texts as this front end's targets (:meth:`split_target`), errors naming the row."""
        split = []
        for index, text in enumerate(targets):
            try:
                split.append(None if text is None else self.split_target(text))
            except ValueError as error:
                name = names[index] if names is not None else f"Row {index}"
                raise ValueError(f"{name}: {error}") from None
        return split

    def split_target(self, text: str):
        """A target text as the front end's target."""
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def model_name(self) -> str:
        return getattr(self.model.config, "name_or_path", "") or type(self.model).__name__


def saved_model(name: str, config, heads: tuple[str, ...] | None = None):
    """A model saved under ``name``, loaded as the class its config names (``architectures[0]``) when transformers
    has it (and, with ``heads``, its name ends with one of them), else as the bare ``AutoModel``: what each kind's
    loader (``load_saved``) shares."""
    import transformers

    architecture = ((config.architectures if config is not None else None) or [""])[0]
    named = heads is None or architecture.endswith(heads)
    loader = getattr(transformers, architecture, None) if named else None
    return (loader or transformers.AutoModel).from_pretrained(name)


def plain(values):
    """NumPy and torch values as Python ones, so that every check reads them alike: arrays and tensors as (nested)
    lists, their scalars (``np.int64(2)``, ``torch.tensor(2)``) as ``int`` / ``float`` / ``str``."""
    if isinstance(values, str) or values is None:
        return values
    if hasattr(values, "tolist"):  # numpy arrays and scalars, torch tensors, pandas series
        return values.tolist()
    if isinstance(values, list | tuple):
        return [plain(value) for value in values]
    return values


def check_batch_size(batch_size) -> None:
    """Refuse a batch size that is not a positive integer, naming it."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}.")
