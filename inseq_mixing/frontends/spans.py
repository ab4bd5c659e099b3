"""Spans of a generation explained over context units: which passages of a long prompt an answer used.

``model.attribute(prompt, generated, spans=..., units=..., hops=...)`` on a generation model loaded with one of this
package's methods (Inseq's ``model``; any of the keywords sends the call here) explains each **span** of the
generated text as one quantity (its summed logit, or its mean row for map methods; the math and its conventions are
:mod:`inseq_mixing.methods.spans`'s) over **context units** of the text (tokens, sentences, passages, given
documents or character spans), optionally after **hops** through the generated tokens before the span.

- ``spans``: ``"answer"`` (default: the generated text's tokens, markup such as an end-of-sequence left out; an
  unknown word's token is the word's), ``"sentences"`` (the generated text's sentences), or a list of character spans
  ``(start, end)`` of the generated text, or of strings found in it in order (not an empty list).
- ``units``: ``"tokens"`` (default), ``"sentences"`` (the prompt's, found by ``sentencex``), ``"passages"`` (the
  prompt cut at ``separator``, a blank line by default), or a list of documents (strings found in the prompt in
  order) or of character spans ``(start, end)`` of the prompt. Whatever no unit covers (special tokens, the text
  between documents) is one more unit, ``"(rest of the text)"``; the generated text's own tokens are units too,
  its sentences unless ``units="tokens"``. Units partition the tokens: nothing is dropped.
- ``hops``: how many times a span's score on generated tokens is passed back through their own explanations.

The output is Inseq's (``show()``, ``save()``, ``aggregate()``): one sequence per input, ``source`` the units,
``target`` the spans, ``source_attributions`` ``(units, spans[, slots])``; logit methods put each span's summed
``logit`` and terms in the step scores; with hops, ``sequence_scores["hops"]`` ``(units, spans, hops + 1)`` holds each
hop's part. ``info`` names the full texts of the units (``units``) and spans (``spans``), each unit's tokens
(``unit_keys``: indices into the decoder's tokens, which for a decoder-only model are the whole text's, then, after
them, into an encoder–decoder's source tokens) and each span's (``span_tokens``, the decoder tokens it explains). No
math here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..declarations import DECLARATIONS, InputSize, Request
from ..declarations.graphs import GRAPH_KEYWORD
from ..methods.blocks import upcast
from ..methods.results import LogitScores
from ..methods.spans import SpanRows, keys_of, unit_scores
from ..methods.units import FrameUnits
from ..trace import ModelCall, forward_arguments, trace_model
from .common import FrontEndModel, check_batch_size
from .layout import logit_step_scores, row_steps, sequence_output, token_list, tokens_first
from .words import markup_ids

#: The keywords of ``model.attribute`` that send a call here.
SPAN_KEYWORDS = ("spans", "units", "hops")
#: Every argument of a span explanation (a dataset run takes them, the same for every row).
SPAN_SETTINGS = (*SPAN_KEYWORDS, "separator", "language")
#: How a unit or span label is shortened for the heatmap (its whole text is in ``info``).
LABEL_CHARACTERS = 40
REST = "(rest of the text)"
UNIT_KINDS = ("tokens", "sentences", "passages")
SPAN_KINDS = ("answer", "sentences")


@dataclass
class SpanItem:
    """One input made ready: token ids, and which tokens make each span and each unit.

    ``ids`` are the decoder's tokens (decoder-only: the whole text; encoder–decoders: the start token and the
    target), ``source_ids`` an encoder–decoder's source. Keys are the decoder's tokens, then the source's.
    """

    name: str
    ids: list[int]
    source_ids: list[int] | None
    generated: list[bool]  # per key
    span_tokens: list[list[int]]  # per span, its decoder tokens
    span_texts: list[str]
    unit_keys: list[list[int]]  # per unit, its keys
    unit_texts: list[str]
    foil_ids: list[int] | None = None  # the decoder tokens of a contrast text, as long as ``ids``


@dataclass
class SpanBatch:
    items: list[SpanItem]
    request: Request
    spans: SpanRows
    units: torch.Tensor  # (B, U, K)
    generated: torch.Tensor  # (B, K)
    hops: int
    unit_scores: torch.Tensor | None = None  # (B, [slots,] N, U): the spans' scores over the units, once explained
    hop_units: torch.Tensor | None = None  # (B, N, hops + 1, U): each hop's part, with hops

    @property
    def size(self) -> int:
        return len(self.items)


class SpanAttributionModel(FrontEndModel):
    """A generation model (Inseq's ``AttributionModel`` with one of this package's methods) explaining spans over
    context units (see the module docstring)."""

    item_name = "text"

    def __init__(self, inseq_model):
        self.inseq_model = inseq_model
        self.model = inseq_model.model
        self.tokenizer = inseq_model.tokenizer
        self.method = inseq_model.attribution_method.method_name
        self.declaration = DECLARATIONS.get(self.method)
        if self.declaration is None:
            raise ValueError(
                f"spans=, units= and hops= are options of this package's methods, not of {self.method!r}."
            )
        self.spec = inseq_model.attribution_method.spec
        if not getattr(self.tokenizer, "is_fast", False):
            raise ValueError("Spans and units are found by character offsets: load a fast tokenizer (use_fast=True).")

    def attribute(
        self,
        input_texts: str | list[str],
        generated_texts: str | list[str] | None = None,
        *,
        spans="answer",
        units="tokens",
        hops: int = 0,
        separator: str = "\n\n",
        language: str = "en",
        batch_size: int = 1,
        show_progress: bool = True,
        generation_args: dict | None = None,
        **options,
    ):
        """Explain spans of each generation over context units (see the module docstring).

        Args:
            input_texts: The prompts (encoder–decoders: the sources).
            generated_texts: Decoder-only: each prompt followed by its generation (Inseq's convention);
                encoder–decoders: the targets. None: generated by the model (``generation_args``).
            spans: What is explained (see the module docstring); a list of lists gives each input its own.
            units: What the scores are over (see the module docstring); a list of lists gives each input its own.
            hops: Hops through the generated tokens (0: none).
            separator: What cuts the prompt into passages (``units="passages"``).
            language: The language code ``sentencex`` splits sentences by.
            batch_size: Inputs per forward pass.
            show_progress: Show a progress bar.
            generation_args: Keyword arguments of the generation when ``generated_texts`` is None.
            **options: The method's options; ``contrast_targets=`` (logit methods): a contrast text per input, as
                long as the generated text in tokens (decoder-only: with the same prompt): a span then explains
                the sum over its tokens of the target's logit minus the foil's.

        Returns:
            ``inseq.FeatureAttributionOutput``: per input, the units as ``source``, the spans as ``target``.
        """
        check_batch_size(batch_size)
        check_span_arguments(spans, units, hops)
        foils = self._call_foils(options, hops)
        self.check_options(options)
        return self._attribute_checked(input_texts, generated_texts, foils, spans, units, hops, (separator, language),
                                       batch_size, show_progress, generation_args, options)  # fmt: skip

    def _call_foils(self, options: dict, hops: int):
        """The call's contrast texts, and the keywords a span call refuses, taken out of ``options``."""
        if options.pop("contrast_targets_alignments", None) is not None:
            raise ValueError("contrast_targets_alignments: a span's foil is a contrast text as long as the generated "
                             "text in tokens, aligned one to one; give contrast_targets only.")  # fmt: skip
        foils = options.pop("contrast_targets", None)
        if foils is not None and hops:
            raise ValueError("hops pass a span's score through each generated token's own explanation, which is not "
                             "contrastive: use contrast_targets without hops.")  # fmt: skip
        for name in ("attr_pos_start", "attr_pos_end", "attributed_fn", "step_scores"):
            if options.pop(name, None) is not None:
                raise ValueError(f"{name} is not taken with spans=: spans= says what is explained.")
        if options.pop(GRAPH_KEYWORD, False):
            raise ValueError(
                "contribution_graphs=True is not taken with spans=: a contribution graph is the route of one "
                "prediction (one position's state after the last layer, Ferrando & Voita 2024), and a span sums "
                "several predictions, whose routes do not add up to one; explain the answer's tokens without spans= "
                "(model.attribute(prompt, generated, contribution_graphs=True)) for each token's route."
            )
        return foils

    def _attribute_checked(self, input_texts, generated_texts, foils, spans, units, hops: int, settings: tuple,
                           batch_size: int, show_progress: bool, generation_args, options: dict):  # fmt: skip
        """:meth:`attribute` once its arguments and the method's options are checked (a dataset run checked them
        once, before any work: its batches come here)."""
        prompts = [input_texts] if isinstance(input_texts, str) else list(input_texts)
        if generated_texts is None:
            continuations = generated_continuations(self.inseq_model, prompts, generation_args or {})
            generated_texts = [prompt + continuation for prompt, continuation in zip(prompts, continuations,
                                                                                     strict=True)]  # fmt: skip
            if self.spec.is_encoder_decoder:
                generated_texts = continuations
        generated = [generated_texts] if isinstance(generated_texts, str) else list(generated_texts)
        if len(generated) != len(prompts):
            raise ValueError(f"{len(prompts)} input text(s) but {len(generated)} generated text(s): give one each.")
        foils = [foils] if isinstance(foils, str) else foils
        if foils is not None and not self.declaration.explains_logit:
            raise ValueError(f"contrast_targets: {self.method} explains no logit, so no logit difference.")
        if foils is not None and len(foils) != len(prompts):
            raise ValueError(f"contrast_targets gives {len(foils)} text(s) for {len(prompts)} input(s): one each.")
        per_row_spans = _per_row(spans, len(prompts), "spans")
        per_row_units = _per_row(units, len(prompts), "units")
        items = [
            self._item(f"Input {index}", prompt, text, row_spans, row_units, settings, None if foils is None else
                       foils[index])
            for index, (prompt, text, row_spans, row_units) in enumerate(
                zip(prompts, generated, per_row_spans, per_row_units, strict=True)
            )
        ]  # fmt: skip
        info = {
            "explained": "spans of the generated text: each span's summed logit"
            + (" minus its contrast text's" if foils is not None else "")
            + " (map methods: its mean row), over context units"
            + (f", after {hops} hop(s) through the generated tokens" if hops else ""),
            "input_texts": prompts,
            "generated_texts": generated,
            "spans": [item.span_texts for item in items],
            "units": [item.unit_texts for item in items],
            "unit_keys": [item.unit_keys for item in items],
            "span_tokens": [item.span_tokens for item in items],
            "hops": hops,
        }
        out = self.attribute_items(items, batch_size=batch_size, show_progress=show_progress,
                                   method_options=options, info=info, settings=hops)  # fmt: skip
        if foils is not None:
            out.info["attribution_args"]["contrast_targets"] = foils
        return out

    # ----- a dataset run's hooks (the generation front end hands its span rows here) -----

    def check_rows(self, sources: list, targets: list, words: list, own: dict, names: list[str]) -> None:
        """Each row's spans and units found in its texts (the tokenizer alone, no model run), an error naming the
        row; rows without a target yet (None) are checked once it is generated (:meth:`attribute_rows`). The span
        arguments in ``own`` were checked once, by the run's :meth:`run_arguments`."""
        spans, units, _, settings = _run_settings(own)
        for name, source, text in zip(names, sources, targets, strict=True):
            if text is not None:
                self._item(name, source, text, spans, units, settings, None)

    def attribute_rows(self, sources: list, targets: list, words: list, own: dict, options: dict,
                       names: list[str] | None = None, progress=None, generated: list[int] = ()) -> list:  # fmt: skip
        """One batch of span rows in one call, every target given (``generated``: the rows whose target the model
        just generated, checked now as the others were before any work)."""
        names = names or [f"Row {index}" for index in range(len(sources))]
        self.check_rows([sources[i] for i in generated], [targets[i] for i in generated], [], own,
                        [names[i] for i in generated])  # fmt: skip
        if progress is not None:
            progress.doing("attributing spans")
        spans, units, hops, settings = _run_settings(own)
        out = self._attribute_checked(sources, targets, None, spans, units, hops, settings, len(sources), False, None,
                                      dict(options))  # fmt: skip
        return list(zip(out.sequence_attributions, targets, strict=True))

    # ----- inputs -----

    def item_of(self, name: str, prompt: str, text: str, spans="answer", units="tokens", separator: str = "\n\n",
                language: str = "en") -> SpanItem:  # fmt: skip
        """One input's tokens, spans and units, found from the tokenizer alone (no model runs): what
        :meth:`attribute` would explain for it, or the ``ValueError`` it would raise, naming the input ``name``."""
        check_span_arguments(spans, units)
        return self._item(name, prompt, text, spans, units, (separator, language), None)

    def _item(self, name: str, prompt: str, text: str, spans, units, settings, foil: str | None) -> SpanItem:
        """One input's tokens, spans, units and contrast tokens, every error naming the input."""
        try:
            item = self._make_item(name, prompt, text, spans, units, settings)
            if foil is not None:
                item.foil_ids = self._foil_ids(prompt, foil, item)
            return item
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from None

    def _foil_ids(self, prompt: str, foil: str, item: SpanItem) -> list[int]:
        """The decoder tokens of a contrast text, checked one to one against the generated text's."""
        if self.spec.is_encoder_decoder:
            ids = [self.model.config.decoder_start_token_id, *self.tokenizer(text_target=foil)["input_ids"]]
        else:
            if not foil.startswith(prompt):
                raise ValueError("the contrast text must start with the prompt, as the generated text does.")
            ids = list(self.tokenizer(foil)["input_ids"])
        if len(ids) != len(item.ids):
            raise ValueError(f"the contrast text has {len(ids)} tokens and the generated text {len(item.ids)}: a "
                             "span's foil is aligned one to one; give a contrast text as long.")  # fmt: skip
        return ids

    def _make_item(self, name, prompt, text, spans, units, settings) -> SpanItem:
        separator, language = settings
        tokenizer = self.tokenizer
        if self.spec.is_encoder_decoder:
            source = tokenizer(prompt, return_offsets_mapping=True)
            target = tokenizer(text_target=text, return_offsets_mapping=True)
            start = self.model.config.decoder_start_token_id
            ids = [start, *target["input_ids"]]
            answer_offsets = [(0, 0), *target["offset_mapping"]]
            source_ids, source_offsets = list(source["input_ids"]), list(source["offset_mapping"])
            first_generated, answer = 1, text
            keys = len(ids) + len(source_ids)
            generated = [index >= 1 for index in range(len(ids))] + [False] * len(source_ids)
            prompt_keys = [(len(ids) + index, offset) for index, offset in enumerate(source_offsets)]
            answer_keys = [(index, offset) for index, offset in enumerate(answer_offsets) if index >= 1]
        else:
            if not text.startswith(prompt):
                raise ValueError("the generated text must start with its prompt (Inseq's convention for "
                                 "decoder-only models): give the prompt followed by its generation.")  # fmt: skip
            encoded = tokenizer(text, return_offsets_mapping=True)
            ids, offsets = list(encoded["input_ids"]), list(encoded["offset_mapping"])
            first_generated = next((index for index, (begin, end) in enumerate(offsets)
                                    if end > begin and begin >= len(prompt)), len(ids))  # fmt: skip
            source_ids, answer, keys = None, text[len(prompt) :], len(ids)
            generated = [index >= first_generated for index in range(len(ids))]
            prompt_keys = [(index, offsets[index]) for index in range(first_generated)]
            answer_keys = [(index, (begin - len(prompt), end - len(prompt)))
                           for index, (begin, end) in enumerate(offsets) if index >= first_generated]  # fmt: skip
        if first_generated >= len(ids):
            raise ValueError("the generated text adds no token to the prompt: there is nothing to explain.")
        special = markup_ids(tokenizer)  # an unknown word's token is the word's: it stays in its unit and span
        key_ids = ids + (source_ids or [])
        answer_tokens = [(key, offset) for key, offset in answer_keys if key_ids[key] not in special]
        span_texts, span_tokens = [], []
        for begin, end in _span_ranges(spans, answer, language):
            tokens = [key for key, (first, last) in answer_tokens if first < end and begin < last]
            if not tokens:
                raise ValueError(f"the span {answer[begin:end]!r} ({begin}, {end}) covers no generated token.")
            span_texts.append(answer[begin:end])
            span_tokens.append(tokens)
        unit_keys, unit_texts = self._units(units, prompt, answer, prompt_keys, answer_tokens, key_ids, special,
                                            (separator, language))  # fmt: skip
        covered = {key for members in unit_keys for key in members}
        rest = [key for key in range(keys) if key not in covered]
        if rest:
            unit_keys.append(rest)
            unit_texts.append(REST)
        return SpanItem(name, ids, source_ids, generated, span_tokens, span_texts, unit_keys, unit_texts)

    def _units(self, units, prompt, answer, prompt_keys, answer_tokens, key_ids, special, settings):
        """Each unit's keys and text: the prompt's units, then the generated text's sentences; a token belongs to the
        first unit it overlaps."""
        separator, language = settings
        if units == "tokens":
            chosen = [key for key, _ in prompt_keys if key_ids[key] not in special] + [key for key, _ in answer_tokens]
            return [[key] for key in chosen], list(self.tokenizer.convert_ids_to_tokens([key_ids[k] for k in chosen]))
        prompt_tokens = [(key, (first, last)) for key, (first, last) in prompt_keys
                         if last > first and key_ids[key] not in special]  # fmt: skip
        unit_keys, unit_texts, taken = [], [], set()
        for tokens, texts in (
            (prompt_tokens, [(prompt[b:e], (b, e)) for b, e in _unit_ranges(units, prompt, separator, language)]),
            (
                answer_tokens,
                [(f"(generated) {answer[b:e].strip()}", (b, e)) for b, e in sentence_ranges(answer, language)],
            ),
        ):
            for text, (begin, end) in texts:
                members = [key for key, (first, last) in tokens if first < end and begin < last and key not in taken]
                taken.update(members)
                if members:
                    unit_keys.append(members)
                    unit_texts.append(text)
        return unit_keys, unit_texts

    def input_sizes(self, items: list[SpanItem], settings=None) -> list[InputSize]:
        """Each input's decoder tokens and (encoder–decoders) source tokens."""
        return [InputSize(len(item.ids), len(item.source_ids or [])) for item in items]

    # ----- batches -----

    def prepare(self, items: list[SpanItem], hops: int) -> SpanBatch:
        """A batch of inputs padded (decoder-only on the left, as Inseq does; encoder–decoders on the right), its
        request, its spans' rows, its units' keys."""
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        device = next(self.model.parameters()).device
        length = max(len(item.ids) for item in items)
        left = not self.spec.is_encoder_decoder
        offset = [length - len(item.ids) if left else 0 for item in items]
        ids = torch.full((len(items), length), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, item in enumerate(items):
            cells = slice(offset[row], offset[row] + len(item.ids))
            ids[row, cells], mask[row, cells] = torch.tensor(item.ids), 1
        predicted = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], pad)], 1)
        foils = None
        if items[0].foil_ids is not None:
            foils = ids.clone()
            for row, item in enumerate(items):
                foils[row, offset[row] : offset[row] + len(item.ids)] = torch.tensor(item.foil_ids)
            foils = torch.cat([foils[:, 1:], torch.full_like(foils[:, :1], pad)], 1).to(device)
        source = source_mask = None
        sources = 0
        if self.spec.is_encoder_decoder:
            sources = max(len(item.source_ids) for item in items)
            source = torch.full((len(items), sources), pad, dtype=torch.long)
            source_mask = torch.zeros_like(source)
            for row, item in enumerate(items):
                source[row, : len(item.source_ids)], source_mask[row, : len(item.source_ids)] = (
                    torch.tensor(item.source_ids), 1)  # fmt: skip

        def key(row: int, index: int) -> int:  # an item's key as a batch key (padding moves the decoder's tokens)
            count = len(items[row].ids)
            return index + offset[row] if index < count else length + index - count

        spans_count = max(len(item.span_tokens) for item in items)
        units_count = max(len(item.unit_keys) for item in items)
        members = torch.zeros(len(items), spans_count, length)
        units = torch.zeros(len(items), units_count, length + sources)
        generated = torch.zeros(len(items), length + sources, dtype=torch.bool)
        for row, item in enumerate(items):
            for span, tokens in enumerate(item.span_tokens):
                members[row, span, [key(row, token) - 1 for token in tokens]] = 1  # predicted one position earlier
            for unit, keys in enumerate(item.unit_keys):
                units[row, unit, [key(row, index) for index in keys]] = 1
            generated[row, [key(row, index) for index, flag in enumerate(item.generated) if flag]] = True
        ids, mask, predicted, members, units, generated = (
            value.to(device) for value in (ids, mask, predicted, members, units, generated))  # fmt: skip
        spans = SpanRows(members)
        positions = spans.positions
        if hops:
            positions = positions | (generated[:, :length].roll(-1, 1) & mask.bool())  # the rows predicting them
        if source is not None:
            source, source_mask = source.to(device), source_mask.to(device)
            input_ids, input_mask, target_ids, target_mask = source, source_mask, ids, mask
        else:
            input_ids, input_mask, target_ids, target_mask = ids, mask, None, None
        model, spec, records = self.model, self.spec, self.declaration.trace_records  # what the method reads
        request = Request(
            spec=spec,
            model=model,
            attention_mask=input_mask,
            target_ids=target_ids,
            target_mask=target_mask,
            predicted_ids=predicted,
            foil_ids=foils,
            positions=positions,
            tracer=lambda: trace_model(  # no step score reads the full-vocabulary logits: the head's product skipped
                model, input_ids, input_mask, target_ids, target_mask, spec=spec, full_logits=False, records=records()
            ),
            caller=lambda: ModelCall(
                model, forward_arguments(model, spec, input_ids, input_mask, target_ids, target_mask)
            ),  # fmt: skip
        )
        return SpanBatch(items, request, spans, units, generated, hops)

    def explain(self, batch: SpanBatch, options) -> tuple[list, list[str] | None]:
        """The spans' scores over keys (one pass where the method has one, else the per-position rows reduced), hops
        through the generated keys, units summed; one sequence per input."""
        if getattr(options, "unit_components", False):
            return self._unit_components(batch, options)
        result, batch.unit_scores, batch.hop_units = explain_spans(self.declaration, batch.request, options,
                                                                   batch.spans, batch.generated, batch.hops,
                                                                   batch.units)  # fmt: skip
        return [self.present(batch, result, row) for row in range(batch.size)], result.axis

    def _unit_components(self, batch: SpanBatch, options) -> tuple[list, list[str] | None]:
        """DecompX over the context units from the first block (``unit_components=True``): one component per unit
        instead of per token, the scores put back in the units' own order. The units go in the order of their first
        token: a causal stack counts component ``u`` as present from position ``u`` on (what a bias split other than
        ``"separate"`` shares over), which is then never before the unit's first token."""
        if self.spec.is_encoder_decoder or batch.hops:
            raise ValueError("unit_components=True decomposes a decoder-only model's text over its units from the "
                             "first block: not with an encoder–decoder's two stacks, nor with hops (which need "
                             "each token's row); leave it False.")  # fmt: skip
        members = batch.units
        keys = torch.arange(members.shape[-1], device=members.device)
        first = torch.where(members > 0, keys, members.shape[-1]).amin(-1)  # (B, U); empty units last
        order = first.argsort(-1)
        ordered = members.gather(1, order[..., None].expand_as(members))
        request = replace(batch.request, units=FrameUnits(ordered, "decoder"))
        result = self.declaration.run_spans(request, options, batch.spans)
        scores = keys_of(result)  # (B, [slots,] N, U) in the units' first-token order
        index = order.view(order.shape[0], *[1] * (scores.dim() - 2), order.shape[1]).expand_as(scores)
        batch.unit_scores = torch.empty_like(scores).scatter_(-1, index, scores)
        return [self.present(batch, result, row) for row in range(batch.size)], result.axis

    def present(self, batch: SpanBatch, result, row: int):
        """One input's sequence: units as ``source``, spans as ``target`` (the batch's scores over the units, and each
        hop's part where there were hops)."""
        item = batch.items[row]
        return span_sequence(result, batch.unit_scores, batch.hop_units, row, [_label(t) for t in item.unit_texts],
                             [_label(t) for t in item.span_texts], batch.request.foil_ids is not None)  # fmt: skip


def explain_spans(declaration, request: Request, options, spans: SpanRows, generated: torch.Tensor, hops: int,
                  units: torch.Tensor) -> tuple:  # fmt: skip
    """A batch's spans explained over its units (every span front end's): the spans' scores over keys (one pass where
    the method has one, else the per-position rows reduced), ``hops`` hops through the ``generated`` keys, each
    unit's keys summed (``units`` ``(B, U, K)``).

    Returns:
        The method's span result, the scores over units ``(B, [slots,] N, U)``, and each hop's part over units
        ``(B, N, hops + 1, U)`` (None without hops).
    """
    if hops:
        result, parts = declaration.run_hops(request, options, spans, generated, hops)
        return result, unit_scores(parts.sum(-1), units), unit_scores(parts.transpose(-1, -2), units)
    result = declaration.run_spans(request, options, spans)
    return result, unit_scores(keys_of(result), units), None


def span_sequence(result, units: torch.Tensor, hop_units: torch.Tensor | None, row: int, unit_labels: list[str],
                  span_labels: list[str], contrastive: bool):  # fmt: skip
    """Row ``row`` of a batch's span result as an Inseq sequence: units as ``source``, spans as ``target``
    (``units``: the scores over units; ``hop_units``: each hop's part), a logit method's summed logit and terms per
    span in the step scores, a map method's per-span values (a sink's share) in them and its per-layer ones in the
    sequence scores, each hop's part as ``sequence_scores["hops"]``."""
    count, span_count = len(unit_labels), len(span_labels)
    signed = isinstance(result, LogitScores)
    if signed:
        steps = row_steps(logit_step_scores(result, contrastive), row, slice(span_count))
    else:  # a map's per-span values (a sink's share of the rows: where the rest went)
        per_span = {name: value for name, value in result.positions.items() if value.dim() == 2}
        steps = row_steps(per_span, row, slice(span_count))
    sequence_scores = {}
    if not signed:  # a map's per-span values per layer (the attention norm's context-mixing ratio) (spans, layers)
        for name, value in result.positions.items():
            if value.dim() == 3:
                sequence_scores[name] = upcast(value[row, :span_count].detach()).cpu()
    if hop_units is not None:  # (B, N, hops + 1, U) → (U, N, hops + 1)
        sequence_scores["hops"] = upcast(hop_units[row, :span_count, :, :count].permute(2, 0, 1).detach()).cpu()
    return sequence_output(
        token_list(unit_labels, [-1] * count),
        token_list(span_labels, [-1] * span_count),
        tokens_first(units[row][..., :span_count, :count]),
        signed=signed,
        step_scores=steps,
        sequence_scores=sequence_scores,
    )


def generated_continuations(inseq_model, prompts: list[str], generation_args: dict) -> list[str]:
    """The model's greedy generations: an encoder–decoder's targets; what follows each prompt for a decoder-only model,
    to be appended to the prompt as written (Inseq's generated text would normalise its blank lines away): the new
    tokens' text, after a space where neither it nor the prompt has one (a word-level tokenizer decodes without)."""
    generated = inseq_model.generate(prompts, skip_special_tokens=True, output_generated_only=True, **generation_args)
    if inseq_model.is_encoder_decoder:
        return list(generated)
    return [("" if not text or text[0].isspace() or prompt[-1:].isspace() else " ") + text
            for prompt, text in zip(prompts, generated, strict=True)]  # fmt: skip


def _run_settings(own: dict) -> tuple:
    """A dataset run's ``spans``, ``units``, ``hops`` and ``(separator, language)``, :meth:`SpanAttributionModel.
    attribute`'s defaults where not given."""
    settings = own.get("separator", "\n\n"), own.get("language", "en")
    return own.get("spans", "answer"), own.get("units", "tokens"), own.get("hops", 0), settings


def check_span_arguments(spans="answer", units="tokens", hops: int = 0, **_) -> None:
    """Refuse, before any work, a kind of span or unit that does not exist and hops that are not a count."""
    if isinstance(hops, bool) or not isinstance(hops, int) or hops < 0:
        raise ValueError(f"hops takes a whole number ≥ 0, not {hops!r}.")
    for name, value, kinds, what in (("spans", spans, SPAN_KINDS, "spans of the generated text"),
                                     ("units", units, UNIT_KINDS, "documents of the prompt")):  # fmt: skip
        if value not in kinds if isinstance(value, str) else not isinstance(value, list | tuple):
            raise ValueError(f"{name}={value!r}: use one of {list(kinds)}, or a list of {what}.")
        if isinstance(value, list | tuple) and (not value or any(isinstance(entry, list) and not entry
                                                                 for entry in value)):  # fmt: skip
            raise ValueError(
                f"{name}={value!r} gives nothing to {'explain' if name == 'spans' else 'explain over'}: "
                f"give at least one of the {what} (or one of {list(kinds)}) for every input."
            )


def _per_row(value, rows: int, name: str) -> list:
    """One argument for every input: a kind name or one list for all, or a list of lists (one per input)."""
    if isinstance(value, str) or value is None:
        return [value] * rows
    value = list(value)
    if value and all(isinstance(entry, list) for entry in value):
        if len(value) != rows:
            raise ValueError(f"{name} gives {len(value)} lists for {rows} input(s): give one list per input.")
        return value
    return [value] * rows


def _ranges(value, text: str, what: str) -> list[tuple[int, int]]:
    """Character ranges from ``(start, end)`` pairs or from strings found in ``text`` in order."""
    ranges, position = [], 0
    for entry in value:
        if isinstance(entry, str):
            found = text.find(entry, position)
            if found < 0:
                raise ValueError(f"{what} {entry[:60]!r} is not in the text (after position {position}).")
            ranges.append((found, found + len(entry)))
            position = found + len(entry)
        elif isinstance(entry, tuple | list) and len(entry) == 2 and all(isinstance(bound, int) for bound in entry):
            begin, end = entry
            if not 0 <= begin < end <= len(text):
                raise ValueError(f"{what} {tuple(entry)} is outside the text's characters 0..{len(text)}.")
            ranges.append((begin, end))
        else:
            raise ValueError(f"{what} {entry!r}: give a string found in the text or a (start, end) character pair.")
    return ranges


def _span_ranges(spans, answer: str, language: str) -> list[tuple[int, int]]:
    """Character ranges of the spans (a kind is known: :func:`check_span_arguments` ran)."""
    if spans == "answer":
        return [(0, len(answer))]
    if spans == "sentences":
        return sentence_ranges(answer, language)
    return _ranges(spans, answer, "the span")


def _unit_ranges(units, prompt: str, separator: str, language: str) -> list[tuple[int, int]]:
    """Character ranges of the prompt's units (not ``"tokens"``; a kind is known: :func:`check_span_arguments`
    ran)."""
    if units == "sentences":
        return sentence_ranges(prompt, language)
    if units == "passages":
        if not separator:
            raise ValueError("units='passages' cuts the prompt at separator=, which is empty.")
        ranges, position = [], 0
        for part in prompt.split(separator):
            if part.strip():
                ranges.append((position, position + len(part)))
            position += len(part) + len(separator)
        return ranges
    return _ranges(units, prompt, "the unit")


def sentence_ranges(text: str, language: str) -> list[tuple[int, int]]:
    """Character ranges of the sentences of ``text`` (``sentencex``), blank runs left out."""
    from sentencex import get_sentence_boundaries

    bounds = get_sentence_boundaries(language, text) if text.strip() else []
    return [(part["start_index"], part["end_index"]) for part in bounds
            if text[part["start_index"] : part["end_index"]].strip()]  # fmt: skip


def _label(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= LABEL_CHARACTERS else text[: LABEL_CHARACTERS - 1] + "…"
