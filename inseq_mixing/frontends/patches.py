"""Every change this package makes to Inseq's own behaviour, for Inseq 0.7.x, in one place.

Each is idempotent and applied by :func:`register` (called by ``import inseq_mixing``, at once when Inseq is already
imported, otherwise right after Inseq's import):

- **Outputs get ``explore()``** (:func:`add_explore`, installed by :func:`inseq_mixing.register` with the view that
  writes the page): the explorer page of an output, with others side by side.
- **Inseq's built-in value zeroing is renamed** ``inseq_value_zeroing`` (Inseq picks among same-named methods at
  random, so its ``value_zeroing`` must give up the name) **and guarded** so that a failure restores the model
  (:mod:`.inseq_adapter.builtin`).
- **Heatmap colours under numpy 2** (:func:`repair_inseq_colours`): Inseq 0.7 writes a cell colour as
  ``"rgba" + str(tuple)``. Under numpy 2 the tuple holds ``np.float64`` values whose ``str`` is
  ``np.float64(178.0)``, so the HTML says ``rgba(np.float64(178.0), ...)``: browsers reject it and ``out.show()``
  draws colourless tables. The repair replaces only that formatting, only for Inseq 0.7 and only where numpy prints
  scalars this way.
- **This package's methods join Inseq's registry**: importing :mod:`.inseq_adapter` creates one Inseq method class
  per declaration (Inseq registers a method when its class is created).
- **``inseq.load_model`` names the right loader for other kinds of models** (:func:`guide_other_kinds`, installed by
  :func:`inseq_mixing.register` with the router's word on what a model is): Inseq 0.7 loads generation models only,
  and an encoder-only or speech model given to it fails deep inside (``TypeError: 'NoneType' object is not
  iterable``); it now gets a one-line error naming :func:`inseq_mixing.load_model`.

And on each Inseq model one of this package's methods is loaded on (installed once per model by the method's
constructor, :class:`~.inseq_adapter.base.ContextMixingAttribution`):

- **The ``attributed_fn`` its user named is recorded** (:func:`record_requested_fn`): Inseq 0.7 resolves a missing
  one to the probability before a method sees it, so a logit method could not tell "not given" from "probability".
- **``step_scores`` are answered** (:func:`answer_step_scores`): Inseq 0.7 refuses them for every final-step method.
- **Token strings are made from one host copy per batch tensor** (:func:`tokens_from_host_ids`, :class:`HostCopies`):
  Inseq 0.7 converts ids one row or token at a time, each a host–device synchronisation on a GPU.

This module imports Inseq only inside its functions, so that importing it never starts Inseq's import (whose end
calls :func:`register`). A new Inseq release is checked here: each patch names the behaviour it changes and the
version it targets.
"""

import importlib
import weakref
from importlib.metadata import version

import numpy as np
import torch


def needs_colour_repair(inseq_version: str) -> bool:
    """Inseq 0.7.x with a numpy whose scalars print their type (numpy 2)."""
    return inseq_version.startswith("0.7.") and str((np.float64(1.0),)) != "(1.0,)"


def rgba_string(color: tuple) -> str:
    """CSS ``rgba(r, g, b, a)`` (or ``rgba(r, g, b)``) from a tuple of numbers of any numeric type."""
    return "rgba(" + ", ".join(str(float(channel)) for channel in color) + ")"


def repair_inseq_colours() -> bool:
    """Make Inseq's ``get_color`` write plain numbers (idempotent). Returns whether the repair is in place."""
    from inseq.utils import viz_utils

    if not needs_colour_repair(version("inseq")):
        return False
    if getattr(viz_utils.get_color, "writes_plain_numbers", False):
        return True
    original = viz_utils.get_color

    def get_color(score, min_value, max_value, cmap, return_alpha=True, return_string=True):
        color = original(score, min_value, max_value, cmap, return_alpha, return_string=False)
        return rgba_string(color) if return_string else color

    get_color.writes_plain_numbers = True
    viz_utils.get_color = get_color
    return True


#: The name Inseq's own value zeroing is registered under.
BUILTIN_VALUE_ZEROING_NAME = "inseq_value_zeroing"

_registered: list[bool] = []  # non-empty once register() has run


def rename_builtin_value_zeroing() -> None:
    """Inseq 0.7's ``value_zeroing`` gives up its name (see the module docstring); under its new name a failure
    restores the model (see :mod:`inseq_mixing.frontends.inseq_adapter.builtin`)."""
    from inseq.attr.feat.perturbation_attribution import ValueZeroingAttribution as BuiltinValueZeroing

    from .inseq_adapter.builtin import guard_builtin_value_zeroing

    BuiltinValueZeroing.method_name = BUILTIN_VALUE_ZEROING_NAME
    guard_builtin_value_zeroing(BuiltinValueZeroing)


def register() -> list[str]:
    """Apply every patch of this module once (idempotent) and put the plugin's methods in Inseq's registry. Imports
    Inseq.

    Returns:
        The names of the plugin's methods.
    """
    if not _registered:
        _registered.append(True)
        rename_builtin_value_zeroing()
        repair_inseq_colours()
        refuse_span_keywords()
        # When Inseq's import was started by the adapter itself, the adapter is half-imported here and creates the
        # classes once it resumes; otherwise this import creates them.
        importlib.import_module(f"{__package__}.inseq_adapter")
    from ..declarations import DECLARATIONS

    return list(DECLARATIONS)


def refuse_span_keywords() -> None:
    """Refuse ``spans=``, ``units=`` and ``hops=`` on an Inseq model whose method is not one of this package's (the
    gradient baselines, Inseq's own value zeroing...), before any work. Inseq 0.7 takes unknown keywords, prints
    "Unused arguments" and explains every generated token over every prompt token instead: minutes of work on a long
    prompt, and an output of another shape than the span explanation that was asked for. Models loaded with this
    package's methods send these keywords to the span front end (:func:`explain_spans`, installed on the instance,
    which this class-level check never reaches)."""
    from inseq.models import AttributionModel

    attribute = AttributionModel.attribute
    if getattr(attribute, "refuses_span_keywords", False):
        return

    def attribute_without_spans(self, *args, **kwargs):
        from .spans import SPAN_KEYWORDS

        given = [name for name in SPAN_KEYWORDS if name in kwargs]
        if given:
            method = getattr(getattr(self, "attribution_method", None), "method_name", "this method")
            raise ValueError(
                f"{given} explain spans of the generation over units of the prompt with this package's methods "
                f"(alti_logit, decompx, attn_lrp, value_zeroing, the maps), not with {method!r}, which Inseq runs "
                "token by token. Load the model with one of them, or leave these keywords out and sum the tokens' "
                "scores yourself (for integrated_gradients, input_x_gradient and deeplift the sum over a span's "
                "tokens is the attribution of the sum of their outputs)."
            )
        return attribute(self, *args, **kwargs)

    attribute_without_spans.refuses_span_keywords = True
    AttributionModel.attribute = attribute_without_spans


def add_explore(write_page) -> None:
    """Give Inseq's ``FeatureAttributionOutput`` (and so every output of this package, whose class derives from it)
    an ``explore()`` method that writes the explorer page with ``write_page`` (installed by
    :func:`inseq_mixing.register` with :func:`inseq_mixing.views.explorer.explore`: views sit above the front ends).
    Inseq 0.7 has no method of that name; an Inseq that adds one keeps its own (idempotent)."""
    import inseq

    if hasattr(inseq.FeatureAttributionOutput, "explore"):
        return

    def explore(self, path="explorer.html", others=(), **kwargs):
        """Write the explorer page of this output (and of ``others``, outputs of other methods on the same inputs,
        shown side by side) to ``path``; ``kwargs``: ``images=``, ``audio=``, ``sampling_rate=``, ``title=`` (see
        :func:`inseq_mixing.views.explorer.explore`). Returns the path written."""
        from pathlib import Path

        others = list(others) if isinstance(others, list | tuple) else [others]
        write_page([self, *others], path, **kwargs)
        return Path(path)

    inseq.FeatureAttributionOutput.explore = explore


def guide_other_kinds(refusal) -> None:
    """Make ``inseq.load_model`` refuse, in one line, a model Inseq cannot load (idempotent; see the module
    docstring): ``refusal(model, method)`` says why and what to call instead, or None for a model Inseq takes (or
    whose kind cannot be told), which goes to Inseq as before."""
    import inseq
    import inseq.models

    if getattr(inseq.load_model, "guides_other_kinds", False):
        return
    original = inseq.models.load_model

    def load_model(model, attribution_method: str | None = None, framework: str = "hf_transformers", **kwargs):
        reason = refusal(model, attribution_method)
        if reason is not None:
            raise ValueError(reason)
        return original(model, attribution_method, framework, **kwargs)

    load_model.__doc__ = original.__doc__
    load_model.guides_other_kinds = True
    inseq.load_model = inseq.models.load_model = load_model


def record_requested_fn(attribution_model) -> None:
    """Make an Inseq model remember the ``attributed_fn`` its user named (None when left to the default).

    Inseq resolves a missing ``attributed_fn`` to its default (the probability) before a method sees it, so a method
    that explains logits could not otherwise tell "not given" from "probability asked for". Later calls that pass the
    function resolved from the recorded name keep the record.
    """
    if getattr(attribution_model, "requested_attributed_fn_recorded", False):
        return
    resolve = attribution_model.get_attributed_fn

    def get_attributed_fn(attributed_fn=None):
        previous = getattr(attribution_model, "requested_attributed_fn", None)
        if not callable(attributed_fn) or attributed_fn is not resolve(previous):
            attribution_model.requested_attributed_fn = attributed_fn
        return resolve(attributed_fn)

    attribution_model.get_attributed_fn = get_attributed_fn
    attribution_model.requested_attributed_fn_recorded = True


#: Inseq's step functions that read only the model's output distribution at the explained position: computed from
#: the method's own forward pass (the model's exact logits), for every explained token at once.
OWN_PASS_STEP_SCORES = ("logit", "probability", "entropy", "crossentropy", "perplexity")

#: ``model.attribute`` arguments the step scores' own pass shares with the attribution (the rest are the method's).
STEP_SCORES_SHARED_ARGS = ("attr_pos_start", "attr_pos_end", "batch_size", "device", "attributed_fn")


def answer_step_scores(attribution_model) -> None:
    """Let this package's methods take ``step_scores`` (Inseq refuses them for every final-step method).

    The scores are Inseq's own step functions. Those of :data:`OWN_PASS_STEP_SCORES` (probability, entropy...) are
    computed from the method's one forward pass, at every explained token at once. The others (the contrastive scores,
    whose arguments such as ``contrast_targets`` are passed on, and any registered step function) come from Inseq's
    ``dummy`` method on the same inputs and generated texts (the output's ``info``): one forward pass per generated
    token, as any Inseq method pays for them. Each sequence's requested scores are added to the method's own
    (``logit``, the ``unattributed_*`` terms), which keep their values where a name is both. Other methods' calls go
    to Inseq unchanged. Installed once per Inseq model.
    """
    from inseq.attr.step_functions import check_is_step_function, get_step_scores_args

    if getattr(attribution_model, "step_scores_answered", False):
        return
    attribute = attribution_model.attribute

    def attribute_with_step_scores(input_texts, generated_texts=None, method=None, *args, **kwargs):
        requested = list(kwargs.pop("step_scores", None) or [])
        method_object = attribution_model.get_attribution_method(method, kwargs.get("override_default_attribution"))
        if not requested or args or not getattr(method_object, "mixes_context", False):
            return attribute(input_texts, generated_texts, method, *args, step_scores=requested, **kwargs)
        for name in requested:
            check_is_step_function(name)
        others = [name for name in requested if name not in OWN_PASS_STEP_SCORES]
        step_args = get_step_scores_args(others, kwargs)
        options = method_object.method.option_names()  # e.g. contrast_targets: a logit method's contrast too
        method_kwargs = {name: value for name, value in kwargs.items() if name not in step_args or name in options}
        method_object.call.own_pass_step_scores = [name for name in requested if name in OWN_PASS_STEP_SCORES]
        try:
            out = attribute(input_texts, generated_texts, method, **method_kwargs)
        finally:
            method_object.call.own_pass_step_scores = []
        if others:
            shared = {name: kwargs[name] for name in STEP_SCORES_SHARED_ARGS if name in kwargs}
            scores = attribute(
                out.info["input_texts"],
                out.info["generated_texts"],
                "dummy",
                step_scores=others,
                show_progress=False,
                **shared,
                **step_args,
            )
            for sequence, scored in zip(out.sequence_attributions, scores.sequence_attributions, strict=True):
                sequence.step_scores = {**scored.step_scores, **(sequence.step_scores or {})}
        out.info["step_scores"] = requested
        return out

    attribution_model.attribute = attribute_with_step_scores
    attribution_model.step_scores_answered = True


def explain_spans(attribution_model) -> None:
    """Send ``model.attribute(..., spans=/units=/hops=...)`` to the span front end
    (:class:`~.spans.SpanAttributionModel`): Inseq 0.7 explains one generated token per column over tokens, and has
    no argument for a span of the generation or for units of the prompt. Calls without those keywords go to Inseq,
    with one keyword of this package's taken out first: ``contribution_graphs=`` (the routes of every explained
    prediction, :mod:`inseq_mixing.declarations.graphs`, put in the output's ``info``). Installed once per model."""
    if getattr(attribution_model, "explains_spans", False):
        return
    attribute = attribution_model.attribute

    def attribute_spans(input_texts, generated_texts=None, method=None, *args, **kwargs):
        from ..declarations.graphs import GRAPH_KEYWORD, collecting_graphs, store_graphs
        from .spans import SPAN_KEYWORDS, SpanAttributionModel

        if not any(name in kwargs for name in SPAN_KEYWORDS):
            with collecting_graphs(kwargs.pop(GRAPH_KEYWORD, None)) as collector:
                out = attribute(input_texts, generated_texts, method, *args, **kwargs)
            store_graphs(out.info, collector)
            return out
        loaded = attribution_model.attribution_method.method_name
        if args or (method is not None and method != loaded):
            raise ValueError(f"spans=, units= and hops= explain with the method the model was loaded with "
                             f"({loaded!r}): pass them by keyword, without another method.")  # fmt: skip
        return SpanAttributionModel(attribution_model).attribute(input_texts, generated_texts, **kwargs)

    attribution_model.attribute = attribute_spans
    attribution_model.explains_spans = True


def tokens_from_host_ids(attribution_model) -> None:
    """Make an Inseq model turn token ids into strings from one host copy per batch tensor: its tokenizer would
    otherwise read a device tensor one element at a time (a host–device synchronisation per token), and Inseq converts
    a batch one row (or one token) at a time. Installed once per model."""
    if getattr(attribution_model, "tokens_from_host_ids", False):
        return
    convert = attribution_model._convert_ids_to_tokens
    copies = HostCopies()

    def convert_on_host(ids, *args, **kwargs):
        return convert(copies.values(ids) if isinstance(ids, torch.Tensor) else ids, *args, **kwargs)

    attribution_model._convert_ids_to_tokens = convert_on_host
    attribution_model.tokens_from_host_ids = True


class HostCopies:
    """The values of 1-D views of a 2-D integer tensor (its rows, or runs within a row), read from one host copy of the
    whole tensor (``tolist``), kept while that tensor lives unchanged. Other tensors are read whole."""

    #: How many base tensors' copies are kept (Inseq converts the source and the target ids of a batch in turn).
    KEPT = 4

    def __init__(self):
        self.kept: list[tuple[weakref.ref, int, list[list[int]]]] = []

    def values(self, ids: torch.Tensor) -> list[int]:
        base = ids._base
        if base is None or base.dim() != 2 or ids.dim() != 1 or not base.is_contiguous() or ids.stride(0) != 1:
            return ids.tolist()
        offset = ids.storage_offset() - base.storage_offset()
        row, col = divmod(offset, base.shape[1])
        if col + ids.shape[0] > base.shape[1]:
            return ids.tolist()
        return self.rows_of(base)[row][col : col + ids.shape[0]]

    def rows_of(self, base: torch.Tensor) -> list[list[int]]:
        for ref, kept_version, rows in self.kept:
            if ref() is base and kept_version == base._version:
                return rows
        rows = base.tolist()
        self.kept = [(weakref.ref(base), base._version, rows), *self.kept[: self.KEPT - 1]]
        return rows
