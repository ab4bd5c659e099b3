"""What a method declaration is: a name, a frozen options dataclass, and a pure ``compute(request, options)``.

A declaration is everything a front end needs to offer a method: the Inseq adapter
(:mod:`inseq_mixing.frontends.inseq_adapter`) generates an Inseq method class from it (the option signature Inseq
routes keyword arguments by, the docstring, the checks), the CLI lists it, the dataset runner validates options with
it, and the encoder-only and speech front ends call the same ``compute``. Nothing here imports Inseq.

Options are fields of a frozen dataclass, each made with :func:`~inseq_mixing.methods.options.option` (default, one
line of documentation, and the accepted strings where there are a few), composed from the shared pieces of
:mod:`inseq_mixing.methods.options` (chunking, encoder maps, heads, contrast), so an option shared by several methods
is written once.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ..deferred import one_read
from ..methods.compiled import compiling
from ..methods.options import Chunking, Compiling, Contrast, EncoderMaps, Heads, Layers, option
from ..methods.results import LayerMaps, LogitScores
from .graphs import graphs_collected, record_graphs

if TYPE_CHECKING:  # reading declarations (the CLI's listing) needs no torch; computing imports it
    import torch

    from ..methods.spans import SpanRows
    from ..methods.units import FrameUnits
    from ..specs import ModelSpec
    from ..trace import ModelCall, ModelTrace


@dataclass
class Request:
    """What a front end asks a method to explain, in token ids.

    Attributes:
        spec: The model's spec.
        model: The Hugging Face model (methods that run their own passes, such as AttnLRP, use it).
        attention_mask: Mask of the source ``(B, S)`` (encoder–decoders; Whisper: of its audio frames) or of the
            whole sequence ``(B, T)`` (decoder-only, encoder-only and vision models; CTC speech encoders: of their
            frames). The ids themselves are the trace's to read: a method reads what the forward pass recorded.
        target_ids: Decoder prefix ``(B, T)`` of encoder–decoders, else None.
        target_mask: Its mask.
        predicted_ids: ``(B, T)``: the token whose logit is explained at each decoder position.
        foil_ids: ``(B, T)`` contrast tokens (explain ``logit(target) − logit(foil)``), or None.
        positions: ``(B, T)`` booleans: the decoder positions whose predictions are explained.
        tracer: Returns the one traced forward pass (:func:`~inseq_mixing.trace.trace_model`); called once, when a
            method first reads :attr:`trace`.
        units: Speech models: the audio units over the frames of the audio stack
            (:class:`~inseq_mixing.methods.units.FrameUnits`); :meth:`Declaration.run` pools the result onto them.
        caller: Returns the model call the trace would run, without running it (a front end whose trace is not
            taken yet gives it): see :meth:`model_call`.
        explained_rows_only: Only the explained positions' per-position values are read (a span's rows, reduced
            per span): a method need not compute them on the rows before :meth:`first_explained_row`.
    """

    spec: ModelSpec
    model: torch.nn.Module
    attention_mask: torch.Tensor
    target_ids: torch.Tensor | None
    target_mask: torch.Tensor | None
    predicted_ids: torch.Tensor
    foil_ids: torch.Tensor | None
    positions: torch.Tensor
    tracer: Callable[[], ModelTrace]
    units: FrameUnits | None = None
    caller: Callable[[], ModelCall] | None = None
    explained_rows_only: bool = False

    @cached_property
    def trace(self) -> ModelTrace:
        return self.tracer()

    def replaced(self, **changes) -> Request:
        """This request with ``changes`` (``dataclasses.replace``), its trace kept if it has traced already (a
        replaced dataclass drops a cached property: the model would run again)."""
        found = dataclasses.replace(self, **changes)
        if "trace" in self.__dict__:
            found.__dict__["trace"] = self.__dict__["trace"]
        return found

    def model_call(self) -> ModelCall:
        """The model and arguments of the one forward pass, for a method that runs passes of its own (AttnLRP):
        built without running the model where the front end can (``caller``) and nothing has traced yet, so no
        recorded tensors (at 1,000 tokens, 0.6 GB of attention probabilities on a GPT-2-small-sized model) stay
        alive beside the method's passes; else the trace's."""
        if self.caller is not None and "trace" not in self.__dict__:
            return self.caller()
        return self.trace.call

    @property
    def decoder_mask(self) -> torch.Tensor:
        """Mask of the decoder positions ``(B, T)``."""
        return self.attention_mask if self.target_ids is None else self.target_mask

    def first_explained_row(self) -> int:
        """The first position any sentence of a decoder-only batch explains (one read of the device per batch): the
        rows before it (a prompt's) are read by nothing unless a map is rolled out. Encoder-only and encoder–decoder
        models show every row of a map (``sequence_scores``): 0."""
        if self.spec.is_encoder_only or self.spec.is_encoder_decoder:
            return 0
        explained = self.positions.any(0)
        return int(explained.byte().argmax()) if explained.numel() else 0


@dataclass(frozen=True)
class InputSize:
    """How many positions one input gives each stack of the model (its real tokens, frames or patches, padding left
    out): what a declaration's :attr:`Declaration.size_check` reads before any work.

    Attributes:
        decoder: The positions of the decoder (decoder-only, encoder-only and vision models: their one stack).
        encoder: An encoder–decoder's source positions (Whisper: its audio frames), else 0.
    """

    decoder: int
    encoder: int = 0


def attention_bytes(sizes: list[InputSize], spec: ModelSpec, element_size: int, heads: bool = True) -> int:
    """The most memory one layer's eager attention holds at once for a batch of inputs of ``sizes``: its scores and
    probabilities, ``2 × batch × heads × queries × keys`` elements (the largest of the self-attention's, the
    cross-attention's and the encoder's); what a method that reads a layer's probabilities whole (and AttnLRP's own
    passes) cannot do without. ``heads=False``: ``2 × batch × queries × keys``, one layer's map and the product it
    enters, what a method that reads a long trace by blocks of query rows holds at most
    (:attr:`Declaration.reads_rows`; the traced forward pass of such a trace runs by blocks of rows too). A token
    mixer that is not attention is frozen whole whichever way it is read (its mixing matrices, ``heads × T²``: a
    Mamba layer's one per channel, :mod:`~inseq_mixing.methods.mixers`), so its heads count either way (a shared
    attention block's mixer: the widest part it forms per pair, :attr:`~.specs.base.MixerSpec.pair_elements`)."""
    batch = len(sizes)
    decoder, encoder = max(size.decoder for size in sizes), max(size.encoder for size in sizes)
    largest = 0
    for name, stack in spec.stacks.items():
        for layer in stack.layers:
            queries = encoder if name == "encoder" else decoder
            whole = heads or getattr(layer.self_attn, "kind", None) is not None  # a mixer's matrices: frozen whole
            per_pair = getattr(layer.self_attn, "pair_elements", layer.self_attn.num_heads)
            largest = max(largest, (per_pair if whole else 1) * queries * queries)
            if layer.cross_attn is not None:
                largest = max(largest, (layer.cross_attn.num_heads if heads else 1) * decoder * encoder)
    return 2 * batch * largest * element_size


#: Options that every map method now spells ``per_layer`` (one layout for all: docs/methods/index.md), with what a
#: caller who gives the old name should write instead.
RENAMED_OPTIONS = {
    "rollout": "rollout=False is now per_layer=True (one map per layer); the default is the rollout.",
    "every_layer": "every_layer=True is now per_layer=True (the flows at every layer).",
}


#: The methods whose declarations say they read token mixers that are not attention (filled as they are declared).
MIXER_READERS: set[str] = set()


@dataclass(frozen=True)
class Declaration:
    """One method.

    Attributes:
        name: The name users load it by (``inseq.load_model(model, name)``).
        summary: One line (the ``inseq-mixing methods`` listing).
        description: The paper, the definition, the outputs and what is our extension.
        options: The frozen options dataclass.
        compute: ``compute(request, options) -> LayerMaps | LogitScores``.
        explains_logit: Whether it explains a logit (returns :class:`LogitScores`; contrast applies).
        pools_units: ``compute`` handles a request's audio units itself (value zeroing zeroes whole units); others
            return frame-level results that :meth:`run` pools.
        rank: Where it is listed (``inseq-mixing methods``, ``inseq_mixing.METHODS``, the demo, reports): lower
            first, ties by name.
        class_stem: Its Inseq class's name before ``Attribution`` (default: the name in capitalised words,
            ``value_zeroing`` → ``ValueZeroing``).
        in_demo: Whether the demo report compares it.
        compute_span: ``compute_span(request, options, spans) -> LogitScores`` with one row per span, for a method
            that explains a span in fewer passes than its tokens one by one (AttnLRP: one backward pass per span);
            None: :meth:`run_spans` sums (or averages) the per-position rows of one :meth:`run`.
        reference_word_frames: With ``convention="reference"`` on a speech model, a word's frames are those of its
            authors' speech study's code, ``ceil(r · start)`` to ``ceil(r · end)`` inclusive (``r`` frames per second;
            neighbouring words may share a frame), instead of the frames whose centre lies in the word.
        size_check: ``size_check(size, layers, options) -> str | None``: why one input of this size cannot be
            explained with these options (the estimate and what to change), or None; every front end asks it of
            every input of a call (:meth:`check_sizes`, which also refuses a batch whose traced forward pass cannot
            fit in the device's free memory) before any work, so that a refusal never comes after part of the call
            was computed.
        paper_layout: The options that give the layout its paper reads where the default differs (value zeroing and
            the attention norm: ``per_layer=True``; their default map is the layers' mean); the cue protocols, whose
            papers measure the cue's share per layer, ask for it
            (:func:`~inseq_mixing.evaluation.protocols.paper_options`).
        rows_sum_to_one: A map method whose every explained row is a distribution over the positions (ALTI,
            rollout, GlobEnc; rollout on a model with attention sinks: with the sink's share beside the row); the
            tests check it of every such method and family.
        reads_rows: The method reads a long trace's probabilities a block of query rows at a time
            (:meth:`~inseq_mixing.trace.AttentionTrace.probs_rows`), never a whole layer's: :meth:`check_sizes`
            estimates one layer's map, not one layer's attention (``heads`` times more).
        reads_mixers: The method reads token mixers that are not attention (state-space and linear-attention layers,
            short convolutions: :mod:`inseq_mixing.methods.mixers`); a method that does not refuses a model with
            them before any work (:meth:`check_model`).
        unread_mixers: The kinds of mixer a method that reads mixers still refuses, with the reason
            (``{"mamba": "..."}``).
        records: What the method reads of the trace (:func:`~inseq_mixing.trace.trace_model`'s ``records``):
            ``"all"``, or ``"attention"`` (the probabilities alone: rollout and flow), whose trace drops the value
            vectors, attention outputs and norms' inputs; read it as :meth:`trace_records`.
    """

    name: str
    summary: str
    description: str
    options: type
    compute: Callable[[Request, Any], LayerMaps | LogitScores]
    explains_logit: bool = False
    pools_units: bool = False
    rank: int = 100
    class_stem: str | None = None
    in_demo: bool = True
    compute_span: Callable[[Request, Any, SpanRows], LogitScores] | None = None
    reference_word_frames: bool = False
    size_check: Callable[[InputSize, int, Any], str | None] | None = None
    rows_sum_to_one: bool = False
    paper_layout: dict[str, Any] = field(default_factory=dict)
    reads_rows: bool = False
    records: str = "all"
    reads_mixers: bool = False
    unread_mixers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if self.reads_mixers:
            MIXER_READERS.add(self.name)

    def check_model(self, spec: ModelSpec, options=None) -> None:
        """Refuse a model whose token mixers this method does not read (``UnsupportedModelError``, naming the first
        such layer and the methods that read it), and ``per_head=True`` on a model whose layers do not all have the
        same number of heads (a hybrid's mixers and attention: ``ValueError``)."""
        if getattr(options, "per_head", False) and spec.mixers():
            counts = {layer.self_attn.num_heads for stack in spec.stacks.values() for layer in stack.layers}
            if len(counts) > 1:
                raise ValueError(f"per_head=True gives one slot per head of every layer, and this {spec.family} "
                                 f"model's layers have {sorted(counts)} heads (its token mixers' and its "
                                 "attention's): ask per_head=False.")  # fmt: skip
        from ..specs import UnsupportedModelError

        for index, layer in enumerate(spec.decoder.layers):
            kinds = getattr(layer.self_attn, "kinds", ())  # a mixer's, its parallel branches' (attention: none)
            unread = [kind for kind in kinds if kind in self.unread_mixers]
            kind = unread[0] if unread else getattr(layer.self_attn, "kind", None)
            if kind in self.unread_mixers:
                raise UnsupportedModelError(f"{self.name} does not read layer {index} of this {spec.family} model, a "
                                            f"{kind} layer: {self.unread_mixers[kind]}")  # fmt: skip
            if kind is not None and not self.reads_mixers:
                readers = ", ".join(sorted(MIXER_READERS))
                raise UnsupportedModelError(
                    f"{self.name} does not read token mixers that are not attention: layer {index} of this "
                    f"{spec.family} model mixes its tokens with a {kind} layer. Use a method that reads them "
                    f"({readers}; docs/supported-models.md)."
                )

    def trace_records(self) -> str:
        """What a trace taken for this method keeps: its :attr:`records`, everything while contribution graphs are
        collected (:func:`~.graphs.collecting_graphs`: their routes read ALTI's, the whole trace)."""
        return "all" if graphs_collected() else self.records

    def word_frames(self, options: dict) -> str:
        """How a speech front end gives a word its frames for these options (as the user gave them): ``"reference"``
        (:attr:`reference_word_frames` with ``convention="reference"``) or ``"centre"``."""
        return "reference" if self.reference_word_frames and options.get("convention") == "reference" else "centre"

    def check_sizes(self, sizes: list[InputSize], names: list[str], spec: ModelSpec, options,
                    memory: tuple[int, int | None] = (4, None), batch_size: int = 1) -> None:  # fmt: skip
        """Refuse, before any work, a call one of whose inputs :attr:`size_check` refuses, or one of whose batches
        cannot fit (``ValueError`` naming the first such input by ``names``, with the numbers).

        Args:
            sizes: Each input's positions per stack.
            names: How the errors name each input.
            spec: The model's spec.
            options: The method's options.
            memory: The bytes of one element of the model's attention probabilities, and the bytes free on the
                model's device (None: unknown, not checked).
            batch_size: Inputs per forward pass (consecutive inputs batch together).
        """
        self.check_model(spec, options)
        layers = len(spec.decoder.layers)
        for start in range(0, len(sizes), batch_size):
            batch = sizes[start : start + batch_size]
            needed = attention_bytes(batch, spec, memory[0], heads=not self.reads_rows)
            length = max(size.decoder for size in batch)
            what = (f"one layer's map and the product it enters, {length:,}²" if self.reads_rows and not spec.mixers()
                    else f"one layer's attention scores and probabilities (or a token mixer's mixing matrices), "
                    f"heads × {length:,}²")  # fmt: skip
            if memory[1] is not None and needed > memory[1]:
                raise ValueError(
                    f"{names[start]}{' and the rest of its batch' if len(batch) > 1 else ''}: {self.name} "
                    f"needs about {needed / 2**30:.1f} GiB at once ({what} positions, for {len(batch)} input(s)), and "
                    f"{memory[1] / 2**30:.1f} GiB are free: give {'batch_size=1, ' if len(batch) > 1 else ''}a "
                    "shorter input (spans= and units= explain an answer over a long context; a shorter context costs "
                    "quadratically less), or a device with more memory."
                )
        if self.size_check is None:
            return
        for size, name in zip(sizes, names, strict=True):
            reason = self.size_check(size, layers, options)
            if reason is not None:
                raise ValueError(f"{name}: {reason}")

    @property
    def class_name(self) -> str:
        """The name of its Inseq method class: ``value_zeroing`` → ``ValueZeroingAttribution``."""
        stem = self.class_stem or "".join(word.capitalize() for word in self.name.split("_"))
        return f"{stem}Attribution"

    def run(self, request: Request, options) -> LayerMaps | LogitScores:
        """``compute`` (its hot steps compiled when the options say ``compile=True``, :mod:`.methods.compiled`; its
        checks on device values read back together at the end, :mod:`inseq_mixing.deferred`), its result pooled onto
        the request's audio units when it has some (speech models: key frames summed per unit, query frames averaged;
        see :mod:`inseq_mixing.methods.units`); a pooled read-out's per-position shares of the logit summed
        (:func:`~inseq_mixing.methods.head.pooled_scores`)."""
        from ..trace import materialized

        self.check_model(request.spec, options)
        with compiling(getattr(options, "compile", False)), one_read(), materialized(request.model):
            result = self.compute(request, options)
            record_graphs(request)
        head = request.spec.head
        if head is not None and head.pooling and isinstance(result, LogitScores):
            from ..methods.head import pooled_scores

            result = pooled_scores(result)
        if request.units is None or self.pools_units:
            return result
        return request.units.pool(result)

    def run_spans(self, request: Request, options, spans: SpanRows) -> LayerMaps | LogitScores:
        """The result with one row per span of ``spans`` (:mod:`inseq_mixing.methods.spans`): the method's own span
        computation where it has one, else :meth:`run` on the spans' positions, its rows reduced per span."""
        if self.compute_span is not None:
            from ..trace import materialized

            self.check_model(request.spec, options)
            with compiling(getattr(options, "compile", False)), one_read(), materialized(request.model):
                result = self.compute_span(request, options, spans)
                record_graphs(request, spans.positions)
            return result
        spanned = request.replaced(positions=spans.positions, explained_rows_only=True)
        return spans.reduce(self.run(spanned, options))

    def run_hops(self, request: Request, options, spans: SpanRows, generated, hops: int):
        """The spans' result after ``hops`` hops through the generated tokens (:mod:`inseq_mixing.methods.spans`):
        the method run on every decoder row, each generated token's row the hop matrix
        (:func:`~inseq_mixing.methods.spans.hop_weights`), the spans' rows passed back through it ``hops`` times.

        Returns:
            The spans' result (one row per span) and each hop's part over the keys ``(B, N, K, hops + 1)``, whose sum
            over the last axis is the scores after the hops.

        Raises:
            ValueError: Options or a result that give more than one map per token (per layer, per head): a hop reads
                one row per generated token. Said before the work where the options tell.
        """
        from ..methods.spans import hop_weights, hopped, keys_of

        refusal = ("hops pass a span's score through each generated token's one row; {what}: ask for one map per "
                   "token (per_layer=False, per_head=False), or use a method that rolls out (alti, globenc, "
                   "attention_rollout) or a logit method.")  # fmt: skip
        if getattr(options, "per_head", False) or getattr(options, "per_layer", False):  # known before the work
            raise ValueError(refusal.format(what=f"{self.name} gives one per layer or head with these options"))
        result = self.run(request, options)
        rows = keys_of(result)
        if rows.dim() != 3:
            slots = f"{len(result.axis or [])} slots per row ({(result.axis or ['?'])[0]}, ...)"
            raise ValueError(refusal.format(what=f"{self.name} gave {slots}"))
        weights = hop_weights(rows, generated)
        result = spans.reduce(result)
        return result, hopped(keys_of(result), weights, generated, hops)

    def option_fields(self) -> list[dataclasses.Field]:
        """The option fields, the method's own first, then those of the shared pieces it inherits."""
        fields = {item.name: item for item in dataclasses.fields(self.options)}
        ordered = [
            name for cls in self.options.__mro__ for name in vars(cls).get("__annotations__", {}) if name in fields
        ]
        return [fields[name] for name in dict.fromkeys(ordered)]

    def option_names(self) -> list[str]:
        return [item.name for item in self.option_fields()]

    def make_options(self, values: dict[str, Any]):
        """The options dataclass from ``values`` (checked by :meth:`check_options`), defaults filled in."""
        self.check_options(values)
        return self.options(**values)

    def check_options(self, values: dict[str, Any]) -> None:
        """Refuse unknown option names and wrongly typed values, naming what is accepted.

        Raises:
            ValueError: An unknown name, or a string outside the option's choices.
            TypeError: A boolean option given a non-boolean, an integer option given anything but a positive integer.
        """
        names = self.option_names()
        unknown = sorted(set(values) - set(names))
        if unknown:
            hint = " Contrastive sources are not supported: use contrast_targets." * ("contrast_sources" in unknown)
            renamed = sorted(set(unknown) & set(RENAMED_OPTIONS)) if "per_layer" in names else []
            hint += "".join(f" {RENAMED_OPTIONS[name]}" for name in renamed)
            raise ValueError(f"Unknown option(s) {unknown} for method {self.name!r}: its options are {names}.{hint}")
        fields = {item.name: item for item in self.option_fields()}
        for name, value in values.items():
            choices = fields[name].metadata.get("choices")
            if choices is not None and value not in choices:
                raise ValueError(f"{name}={value!r} is not valid for {self.name!r}: use one of {list(choices)}.")
            kind = fields[name].type
            if kind is bool and not isinstance(value, bool):
                raise TypeError(f"{name} takes True or False, not {value!r}.")
            if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise TypeError(f"{name} takes a positive integer, not {value!r}.")

    def options_doc(self) -> str:
        """Google-style ``Args:`` lines of the options (default and choices included)."""
        lines = []
        for item in self.option_fields():
            choices = item.metadata.get("choices")
            accepted = f" One of {', '.join(repr(choice) for choice in choices)}." if choices else ""
            lines.append(f"    {item.name} ({_type_name(item.type)}, default {item.default!r}): {item.metadata['doc']}"
                         f"{accepted}")  # fmt: skip
        return "\n".join(lines)

    @property
    def docstring(self) -> str:
        """Summary, description and options: the docstring of the generated Inseq class."""
        return f"{self.summary}\n\n{self.description}\n\nOptions:\n{self.options_doc()}\n"


def _type_name(kind) -> str:
    if kind is type(None):
        return "None"
    if isinstance(kind, type):
        return kind.__name__
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        return " | ".join(_type_name(arg) for arg in typing.get_args(kind))
    return str(kind).replace("typing.", "")


# ----- labelled axes and the per-head layouts shared by several methods -----


def layer_axis(layers: int, prefix: str = "") -> list[str]:
    """Labels of a per-layer axis: ``"layer 0"``, ... (``prefix`` names the stack, e.g. ``"decoder "``)."""
    return [f"{prefix}layer {layer}" for layer in range(layers)]


def head_axis(layers: int, heads: int, residual: bool = False, prefix: str = "") -> list[str]:
    """Labels of a layer-major (layer, head) axis; with ``residual``, each layer ends with its residual slot."""
    slots = [f"head {head}" for head in range(heads)] + (["residual"] if residual else [])
    return [f"{prefix}layer {layer} {slot}" for layer in range(layers) for slot in slots]


def head_axis_maps(target: torch.Tensor, self_source=None, cross_source=None, encoder=None) -> dict:
    """Per-head maps ``(B, L, H, T, ·)`` laid out with one layer-major slot axis ``(B, slots, T, ·)``;
    encoder–decoders: the self-attention heads' slots, then the cross-attention heads' (which carry no target token).
    Returns the ``target``, ``source`` (and ``encoder``, from ``(B, L, H, S, S)``) fields."""
    import torch

    flat = target.flatten(1, 2)
    fields = {"target": flat}
    if cross_source is not None:
        self_source = torch.zeros_like(cross_source) if self_source is None else self_source
        fields["source"] = torch.cat([self_source.flatten(1, 2), cross_source.flatten(1, 2)], dim=1)
        fields["target"] = torch.cat([flat, torch.zeros_like(flat)], dim=1)
    if encoder is not None:
        fields["encoder"] = encoder.flatten(1, 2)
    return fields


def logit_scores(scores, terms: dict, spec: ModelSpec, per_head: bool) -> LogitScores:
    """A logit method's :class:`LogitScores` from its math's scores (``target``, ``source``, ``logit``,
    ``logit_after_softcap``, and with ``per_head`` the ``target_heads`` ``(B, L, H, T, T)`` and ``source_heads``
    ``(B, 2, L, H, T, S)`` through self- and cross-attention), the per-head maps laid out on one labelled slot axis."""
    result = LogitScores(scores.target, scores.source, scores.logit, terms, scores.logit_after_softcap)
    if per_head:
        layers, heads = scores.target_heads.shape[1:3]
        sources = [None] if scores.source_heads is None else scores.source_heads.unbind(1)
        fields = head_axis_maps(scores.target_heads, *sources)
        result.target, result.source = fields["target"], fields.get("source")
        result.axis = self_and_cross_axis(spec, layers, heads)
    return result


def self_and_cross_axis(spec: ModelSpec, layers: int, heads: int, residual: bool = False) -> list[str]:
    """Labels of a :func:`head_axis_maps` slot axis: decoder-only models' heads, or self- then cross-attention's."""
    if not spec.is_encoder_decoder:
        return head_axis(layers, heads, residual)
    cross = head_axis(layers, heads, residual, "cross-attention ")
    return head_axis(layers, heads, residual, "self-attention ") + cross


__all__ = [
    "Chunking",
    "Compiling",
    "Contrast",
    "Declaration",
    "EncoderMaps",
    "Heads",
    "InputSize",
    "Layers",
    "Request",
    "option",
]
