"""The vision–language front end: which image tokens and which words each generated word (or the whole answer) used.

Inseq takes no images. :func:`inseq_mixing.load_model` gives the vision–language decoders this package reads (LLaVA,
LLaVA-NeXT, LLaVA-OneVision, Qwen2-VL, Qwen2.5-VL, Idefics3, SmolVLM, InternVL: the spec files naming the
``"vision-language"`` kind) a :class:`VisionLanguageAttributionModel` whose
``.attribute(images, prompts, generated=None, *, spans="tokens", units="tokens", hops=0, ...)`` returns
``inseq.FeatureAttributionOutput``:

- **Inputs**: per prompt, its images (one image or a list: a path, a PIL image, an array or a tensor, read as the
  vision front end reads them) and its text, holding the processor's image placeholder once per image where the
  image goes (LLaVA's ``<image>``, Qwen2-VL's ``<|vision_start|><|image_pad|><|vision_end|>``, or what the
  processor's chat template writes). The processor expands each placeholder into the image's tokens.
- **What is explained** (``spans``): ``"tokens"`` (default): each generated token's logit (map methods: its row);
  ``"answer"``: the generated answer as one quantity, its summed logit (map methods: its mean row), the long-context
  front end's spans (:mod:`inseq_mixing.methods.spans`). ``generated=`` the answer per prompt (default: the model's
  greedy answer, ``max_new_tokens`` at most, ended before the end-of-sequence token); ``contrast_targets=`` a
  contrast answer per prompt, as long in tokens: the logit of the answer's token minus the contrast's.
- **Sources** (``units``): ``"tokens"`` (default): every token of the text, each image token labelled with its image,
  its tile (a run of image tokens among the image's, where the processor cuts it into several) and its place on the
  tile's grid (``img1 r0c2``: Qwen2-VL's merged-patch grid from ``image_grid_thw``, a square grid where a tile's tokens
  make one, else the token's number ``img1 #5``); ``"images"``: each image's tokens one unit (``image 1``), every other
  token its own; ``"tiles"``: each tile's tokens one unit (:meth:`VisionLanguageAttributionModel.tile_units`);
  ``"sentences"``: each image one unit, the text's sentences (:meth:`VisionLanguageAttributionModel.sentence_units`);
  or a list of boxes (:meth:`VisionLanguageAttributionModel.box_units`): each box's image tokens one unit. The
  generated tokens are units too (a token after the explained one scores 0). Units partition the
  tokens; a unit's score is the sum over its tokens (exact for every method: :mod:`inseq_mixing.methods.spans`).
- ``hops``: a span's score on generated tokens passed back through their own explanations (the long-context front
  end's hops, unchanged).

The output is Inseq's (``show()``, ``save()``, ``aggregate()``): one sequence per prompt, ``source`` the units,
``target`` the spans, ``source_attributions`` ``(units, spans[, slots])``; a logit method's ``logit`` and terms per
span in the step scores (the units' scores plus the terms equal the model's own logit); with hops,
``sequence_scores["hops"]``. ``info`` names each prompt's units' positions (``unit_keys``, indices into its text
after the processor expanded the images, the generated tokens after it), each span's (``span_tokens``), each image's
positions and grids (``image_tokens``, ``image_grids``) and the part of the image its grid covers (``image_boxes``,
``(left, top, right, bottom)`` in its pixels: :func:`inseq_mixing.views.images.answer_heatmap` draws on it).

The decoder is explained: the image tokens' embeddings (the projector's output) are the first block's input, as a
word's embedding is; ``tower=True`` continues the image-token scores of every family but Qwen3-VL through the
projector and the vision tower (:mod:`inseq_mixing.methods.tower`, our extension).

The gradient baselines (``integrated_gradients``, ``deeplift``, ``saliency``, ``input_x_gradient``, Captum's) explain
each span's summed logit (minus the contrast's) on the same units: Captum's attribution of the first decoder block's
input, the image tokens' embeddings and the words', summed over the embedding per token (the default baseline: zero
embeddings). What the decoder adds between its blocks (Qwen3-VL's DeepStack features) is held at its value: it is
not attributed. No math here.
"""

from __future__ import annotations

import itertools
import math
import re
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from ..declarations import DECLARATIONS, InputSize, Request
from ..declarations.graphs import GRAPH_KEYWORD
from ..methods.attn_lrp import no_graph_before_blocks
from ..methods.blocks import upcast
from ..methods.results import LogitScores
from ..methods.spans import SpanRows, unit_scores
from ..methods.tower import check_reproduced, merge_shares, through_tower, tower_rollout
from ..specs import get_spec
from ..trace import ModelCall, forward_arguments, trace_call
from .common import (
    GRADIENT_METHODS,
    GRADIENT_OPTIONS,
    FrontEndModel,
    captum_method,
    first_block_input,
    first_block_input_replaced,
    plain,
    saved_model,
)
from .spans import explain_spans, sentence_ranges, span_sequence
from .vision import checked_box, read_image
from .words import markup_ids

SPAN_KINDS = ("tokens", "answer")
#: An image token's place on its image's one grid (:func:`_image_labels`).
GRID_CELL = re.compile(r"^img(?P<image>\d+) r(?P<row>\d+)c(?P<column>\d+)$")
UNIT_KINDS = ("tokens", "images", "tiles", "sentences")
#: What the processor gives besides the images that is laid out like the ids (Qwen2-VL's ``mm_token_type_ids``):
#: 2-D integer tensors of the ids' shape, laid out again with the answer (0 on padding; on generated tokens, 0 or the
#: spec's value, :attr:`~inseq_mixing.specs.base.ModelSpec.answer_inputs`).
POSITIONAL = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)
#: What a processor returns that the model's forward pass does not take (PaliGemma's ``labels``: a training target).
NOT_MODEL_INPUTS = ("input_ids", "attention_mask", "labels")


@dataclass
class VLMItem:
    """One prompt made ready: its images, text, the ids the processor gives it alone, each image's token count and
    tile grids, and its answer's ids when given (None: generated at its batch)."""

    name: str
    images: list
    prompt: str
    prompt_ids: list[int]
    image_counts: list[int]
    image_grids: list[tuple[int, int] | None]
    answer_ids: list[int] | None
    foil_ids: list[int] | None = None
    foil_text: str | None = None


@dataclass
class CallSettings:
    """The per-call arguments every batch shares."""

    spans: str
    units: str
    hops: int
    max_new_tokens: int
    tower: bool = False
    boxes: list | None = None
    language: str = "en"


@dataclass
class VLMBatch:
    """One batch of prompts, traced lazily, with its spans' rows and units' members."""

    items: list[VLMItem]
    request: Request
    spans: SpanRows
    units: torch.Tensor  # (B, U, T)
    generated: torch.Tensor  # (B, T) booleans
    hops: int
    unit_labels: list[list[str]]
    unit_keys: list[list[list[int]]]
    span_labels: list[list[str]]
    span_tokens: list[list[list[int]]]
    image_tokens: list[list[list[int]]]
    answers: list[list[int]]
    explained: list[list[int]]  # per row: the batch positions whose predictions are explained (spans="tokens")
    unit_scores: torch.Tensor | None = None
    hop_units: torch.Tensor | None = None
    tower: bool = False
    tower_scores: list[dict[str, torch.Tensor]] | None = None  # per row: each image's scores over the tower's tokens

    @property
    def size(self) -> int:
        return len(self.items)


class VisionLanguageAttributionModel(FrontEndModel):
    """A vision–language decoder with one attribution method (see the module docstring).

    Args:
        model: A vision–language model this package reads (``LlavaForConditionalGeneration``,
            ``Qwen2VLForConditionalGeneration``, ...).
        processor: Its processor (image processor and tokenizer).
        method: One of this package's methods.
    """

    item_name = "prompt"
    task = "generation"
    NO_FOILS = None
    #: Arguments of :meth:`attribute` a dataset run passes on besides the method's options.
    RUN_ARGUMENTS = ("spans", "units", "hops", "language")
    GENERATES = True  # the greedy answers

    #: Captum's options of the gradient baselines here (no convergence gap: a span's is not one Captum call's).
    GRADIENT_OPTIONS = {name: tuple(option for option in options if option != "return_convergence_delta")
                        for name, options in GRADIENT_OPTIONS.items()}  # fmt: skip

    def __init__(self, model: nn.Module, processor, method: str):
        if method not in DECLARATIONS and method not in GRADIENT_METHODS:
            raise ValueError(f"Unknown method {method!r} for vision-language models: use one of "
                             f"{[*DECLARATIONS, *GRADIENT_METHODS]}.")  # fmt: skip
        self.model, self.method, self.declaration = model, method, DECLARATIONS.get(method)
        self.spec = get_spec(model)
        tokenizer = getattr(processor, "tokenizer", None)
        if tokenizer is None or not callable(processor) or getattr(processor, "image_processor", None) is None:
            raise ValueError(
                "Pass the model's processor (its image processor and tokenizer, as AutoProcessor loads it): "
                "processor=..."
            )
        self.processor, self.tokenizer = processor, tokenizer
        image_token = getattr(processor, "image_token", None)
        self.image_token = image_token or tokenizer.convert_ids_to_tokens(self.spec.image_token_id)

    def for_method(self, method: str) -> VisionLanguageAttributionModel:
        """The same model and processor with another method."""
        return VisionLanguageAttributionModel(self.model, self.processor, method)

    def attribute(
        self,
        images,
        prompts,
        generated=None,
        *,
        spans: str = "tokens",
        units: str = "tokens",
        hops: int = 0,
        tower: bool = False,
        max_new_tokens: int = 20,
        language: str = "en",
        batch_size: int = 1,
        show_progress: bool = True,
        **method_options,
    ):
        """Explain the answers to one prompt or several (see the module docstring).

        Args:
            images: One prompt's image (or list of images), or, with a list of prompts, one entry per prompt.
            prompts: A text holding one image placeholder per image, or a list of them.
            generated: The answer to explain per prompt (default: the model's greedy answer).
            spans: ``"tokens"`` or ``"answer"``.
            units: ``"tokens"``, ``"images"``, ``"tiles"`` (each tile's tokens, an untiled image whole),
                ``"sentences"`` (each image whole, the prompt's and the answer's sentences), or a list of boxes:
                ``[x0, y0, x1, y1]`` in the first image's pixels,
                or ``(image_number, [x0, y0, x1, y1])`` (from 1); each box's image tokens (those with at least half
                their cell inside, a token in the first box that takes it) are one unit, ``box 1``, ...; the rest of
                a boxed image is ``image 1 (rest)``, other images whole, every other token its own.
            hops: Hops through the generated tokens (0: none).
            tower: Also continue each image's token scores through the projector and the vision tower onto the
                tower's input patches (every family but Qwen3-VL; our extension: :mod:`inseq_mixing.methods.tower`),
                as ``sequence_scores["tower_image1"]``, ... ``(tower tokens, spans)`` (InternVL, LLaVA-NeXT,
                OneVision: each tile's tower tokens in turn; LLaVA-NeXT's newline tokens keep their scores), one
                tile's labelled in ``info["tower_tokens"]`` (the Qwens', whose images differ in size: per prompt,
                each image's labels).
            max_new_tokens: The longest greedy answer.
            language: The language code ``sentencex`` cuts sentences by (``units="sentences"``).
            batch_size: Prompts per forward pass.
            show_progress: Show a progress bar.
            method_options: The method's options (``inseq-mixing methods --options``); and Inseq's names:
                ``generated_texts`` (the answers), ``contrast_targets`` (contrast answers, as long in tokens),
                ``attributed_fn`` and, with ``spans="tokens"``, ``step_scores``.

        Returns:
            ``inseq.FeatureAttributionOutput``, one sequence per prompt.
        """
        single = isinstance(prompts, str)
        call = _call_arguments(spans=spans, units=units, hops=hops, max_new_tokens=max_new_tokens, tower=tower,
                               language=language)  # fmt: skip
        if method_options.get(GRAPH_KEYWORD):
            raise ValueError("contribution_graphs=True is not offered on vision-language models yet.")
        if spans == "answer" and method_options.get("step_scores"):
            raise ValueError("step_scores are per generated token: use spans='tokens' for them.")
        prompts = [prompts] if single else plain(prompts)
        images = [images] if single else images
        if not isinstance(images, list | tuple) or len(images) != len(prompts):
            raise ValueError(f"Give one entry of images per prompt ({len(prompts)}), as a list.")
        inputs = list(zip(images, prompts, strict=True))
        return self.attribute_inputs(inputs, generated, batch_size=batch_size, show_progress=show_progress,
                                     method_options=method_options, call={**call, "single": single})  # fmt: skip

    # ----- inputs -----

    def call_foils(self, foils, options: dict):
        """Contrast answers, from ``contrast_targets=`` (or ``foils=``), one per prompt."""
        if options.pop("contrast_targets_alignments", None) is not None:
            raise ValueError("contrast_targets_alignments: a contrast answer is aligned one to one with the answer; "
                             "give contrast_targets only.")  # fmt: skip
        contrast = options.pop("contrast_targets", None)
        if contrast is not None and foils is not None:
            raise ValueError("Give the contrast answers once: foils= or contrast_targets= (Inseq's name), not both.")
        foils = plain(contrast if contrast is not None else foils)
        if foils is not None and self.declaration is not None and not self.declaration.explains_logit:
            raise ValueError(f"contrast_targets: {self.method} explains no logit, so no logit difference.")
        return foils

    def items(self, inputs: list, targets, foils, *, single: bool = False, hops: int = 0, names=None, boxes=None,
              **_call) -> list[VLMItem]:  # fmt: skip
        """Each prompt's images read, its text checked against them, encoded alone (each image's tokens counted),
        its answer and contrast tokenised: a bad input named before any work (``names``: how errors name each
        prompt; default ``"Prompt 0"``, ...)."""
        targets = _per_prompt(plain(targets), len(inputs), "generated", single)
        foils = _per_prompt(foils, len(inputs), "contrast_targets", single)
        if hops and foils[0] is not None:
            raise ValueError("hops pass a span's score through each generated token's own explanation, which is not "
                             "contrastive: use contrast_targets without hops.")  # fmt: skip
        names = names or [f"Prompt {index}" for index in range(len(inputs))]
        rows = zip(names, inputs, targets, foils, strict=True)
        items = [self.prompt_item(name, images, prompt, answer, foil) for name, (images, prompt), answer, foil in rows]
        for item in items if boxes is not None else ():
            self.box_units(item, boxes)  # each box placed on each prompt's image before any work
        return items

    # ----- a dataset run's hooks -----

    def check_rows(self, sources: list, targets: list, words: list, own: dict, names: list[str]) -> None:
        """A dataset run's rows (prompts, answers or None, image paths) checked before any work, with the run's
        ``spans``, ``units`` and ``hops`` (as :meth:`attribute` checks them): every image read, every prompt encoded
        with its images, every box placed, errors naming the row."""
        boxes = _call_arguments(**own)["boxes"]
        for name, prompt, answer, images in zip(names, sources, targets, words, strict=True):
            item = self.prompt_item(name, list(images), prompt, answer, None)
            if boxes is not None:
                self.box_units(item, boxes)

    def attribute_rows(self, sources: list, targets: list, words: list, own: dict, options: dict,
                       names: list[str] | None = None, progress=None) -> list:  # fmt: skip
        """One batch of rows in one call (left-padded, each equal to the prompt alone), with each row's answer: the
        given one, or the greedy one explained."""
        if progress is not None:
            progress.doing("answering and attributing")
        out = self.attribute_inputs([(list(images), prompt) for images, prompt in zip(words, sources, strict=True)],
                                    list(targets), batch_size=len(sources), show_progress=False,
                                    method_options=dict(options),
                                    call={**_call_arguments(**own), "names": names})  # fmt: skip
        answers = out.info["generated_texts"]
        return [
            (sequence, target if target is not None else answer)
            for sequence, target, answer in zip(out.sequence_attributions, targets, answers, strict=True)
        ]

    def prompt_item(self, name: str, images, prompt, answer, foil) -> VLMItem:
        """One prompt read and checked (its images read, its placeholders counted, encoded alone, its answer and
        contrast tokenised), or the ``ValueError`` :meth:`attribute` would raise for it, naming it ``name``."""
        if not isinstance(prompt, str):
            raise ValueError(f"{name} is a {type(prompt).__name__}: give the prompt as a text.")
        listed = list(images) if isinstance(images, list | tuple) else [images]
        if not listed:
            raise ValueError(f"{name} has no image: give at least one (text alone is the generation front end's).")
        read = [read_image(image, f"{name}, image {number}") for number, image in enumerate(listed)]
        placed = prompt.count(self.image_token)
        if placed != len(read):
            raise ValueError(
                f"{name} has {len(read)} image(s) and its text {placed} image placeholder(s) {self.image_token!r}: "
                "put the placeholder once where each image goes (or write the prompt with the processor's chat "
                "template)."
            )
        prompt_ids = self._encode(name, read, prompt)["input_ids"][0].tolist()
        counts, grids = zip(*(self._image_tokens(name, image) for image in read), strict=True)
        found = sum(token == self.spec.image_token_id for token in prompt_ids)
        runs = _runs(prompt_ids, self.spec.image_token_id)
        if found != sum(counts) and len(runs) == len(read):  # tokens an image makes beside others (OneVision's)
            counts = tuple(runs)
        if found != sum(counts):
            raise ValueError(
                f"{name}: its text holds {found} image tokens once encoded, and its images make {sum(counts)}: write "
                "one placeholder per image, no image token of your own."
            )
        answer_ids = None
        if answer is not None:
            answer_ids = self._answer_ids(name, answer, "generated")
        item = VLMItem(name, read, prompt, prompt_ids, list(counts), list(grids), answer_ids)
        if foil is not None:
            item.foil_ids, item.foil_text = self._answer_ids(name, foil, "contrast_targets"), foil
            self._check_foil(item, answer_ids)
        return item

    def _answer_ids(self, name: str, text, what: str) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"{name}: {what} is a {type(text).__name__}; give the answer as a text.")
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"{name}: the {what} text {text!r} has no token: give the answer to explain.")
        if self.spec.image_token_id in ids:
            raise ValueError(f"{name}: the {what} text holds an image token; an answer is text.")
        return list(ids)

    @staticmethod
    def _check_foil(item: VLMItem, answer_ids: list[int] | None) -> None:
        if answer_ids is not None and len(item.foil_ids) != len(answer_ids):
            raise ValueError(f"{item.name}: the contrast answer has {len(item.foil_ids)} tokens and the answer "
                             f"{len(answer_ids)}: a contrast is aligned one to one; give one as long.")  # fmt: skip

    def _encode(self, name: str, images: list, prompt: str) -> dict:
        """The processor's inputs for one prompt, an error naming it when the processor refuses it."""
        try:
            return self.processor(images=[images], text=[prompt], return_tensors="pt")
        except (ValueError, TypeError, KeyError, IndexError) as error:
            raise ValueError(f"{name}: the processor refused it ({error}).") from None

    def _image_tokens(self, name: str, image) -> tuple[int, tuple[int, int] | None]:
        """How many image tokens one image makes (the processor run on it alone), and its merged-patch grid where the
        processor gives one (Qwen2-VL's ``image_grid_thw`` over its merge size)."""
        encoded = self._encode(name, [image], self.image_token)
        count = int((encoded["input_ids"] == self.spec.image_token_id).sum())
        grid = None
        merge = getattr(self.processor.image_processor, "merge_size", None)
        if "image_grid_thw" in encoded and merge:
            frames, height, width = (int(value) for value in encoded["image_grid_thw"][0])
            grid = (frames * height // merge, width // merge)
        return count, grid

    def call_settings(self, options: dict, *, spans: str = "tokens", units: str = "tokens", hops: int = 0,
                      max_new_tokens: int = 20, tower: bool = False, boxes=None, language: str = "en",
                      **_call) -> CallSettings:  # fmt: skip
        """The call's settings; ``tower=True`` checked before any work (a tower the scores can continue through,
        one score per image token: units of tokens, no per-layer or per-head axis)."""
        if hops and self.declaration is None:
            raise ValueError(f"hops pass a span's score through each generated token's own row of a method's scores; "
                             f"{self.method} gives none: use hops=0.")  # fmt: skip
        if tower:
            if self.spec.tower is None:
                raise ValueError(
                    "tower=True continues the image tokens' scores through a projector that mixes no tokens (LLaVA's, "
                    "one layer's features) or folds patches by a linear map or an MLP (Idefics3's, SmolVLM's and "
                    "InternVL's pixel shuffle, Gemma 3's pooling, the mergers of Qwen2-VL, Qwen2.5-VL and Qwen3.5, "
                    "LLaVA-NeXT's tiles); "
                    f"this {self.spec.family}'s image tokens read the tower otherwise (Qwen3-VL's DeepStack adds "
                    "earlier blocks' states to the decoder's), which is not decomposed yet: leave tower=False."
                )
            if units != "tokens" or options.get("per_layer") or options.get("per_head"):
                raise ValueError("tower=True spreads each image token's one score through the tower: use "
                                 "units='tokens', without per_layer or per_head.")  # fmt: skip
        return CallSettings(spans, units, hops, max_new_tokens, tower, boxes, language)

    def input_sizes(self, items: list[VLMItem], settings: CallSettings | None = None) -> list[InputSize]:
        """Each prompt's tokens with its images expanded, and its answer (at most ``max_new_tokens`` where greedy)."""
        new = settings.max_new_tokens if settings is not None else 20
        return [InputSize(len(item.prompt_ids) + (new if item.answer_ids is None else len(item.answer_ids)))
                for item in items]  # fmt: skip

    def info_entries(self, items: list[VLMItem], settings: CallSettings | None = None) -> dict:
        spans = settings.spans if settings is not None else "tokens"
        what = "each generated token's logit" if spans == "tokens" else "the answer's summed logit"
        boxes = [[_grid_box(self.processor.image_processor, image.width, image.height) for image in item.images]
                 for item in items]  # fmt: skip
        maps = self.declaration is not None and not self.declaration.explains_logit
        contrastive = any(item.foil_ids is not None for item in items)
        return {
            "task": "vision-language generation",
            "attributed_fn": f"{self.method} map: context mixing into each explained position"
            if maps
            else "contrast_logits_diff"
            if contrastive
            else "logit",
            "image_boxes": boxes,
            "explained": f"{what} (map methods: its row, or the answer's mean row), over image and text units",
            "prompts": [item.prompt for item in items],
            "image_counts": [item.image_counts for item in items],
            "image_grids": [[list(grid) if grid else None for grid in item.image_grids] for item in items],
            "spans_kind": spans,
            "units_kind": settings.units if settings is not None else "tokens",
            "hops": settings.hops if settings is not None else 0,
        }

    # ----- batches -----

    def prepare(self, items: list[VLMItem], settings: CallSettings) -> VLMBatch:
        """A batch of prompts: the images encoded together, the greedy answers generated where none was given, the
        prompts and answers left-padded, the request, the spans' rows and the units' members."""
        device = self.device
        encoded = self.processor(images=[item.images for item in items], text=[item.prompt for item in items],
                                 padding=True, return_tensors="pt")  # fmt: skip
        prompt_mask = encoded["attention_mask"].bool()
        for row, item in enumerate(items):
            if encoded["input_ids"][row][prompt_mask[row]].tolist() != item.prompt_ids:
                raise ValueError(f"{item.name}: the processor encodes it differently in a batch than alone; run "
                                 "batch_size=1.")  # fmt: skip
        images = {name: value for name, value in encoded.items() if name not in NOT_MODEL_INPUTS}
        positional = {name for name, value in images.items() if _positional(value, encoded["input_ids"])}
        images = {name: value.to(device, self.model.dtype) if value.is_floating_point() else value.to(device)
                  for name, value in images.items() if isinstance(value, torch.Tensor)}  # fmt: skip
        counts = tuple(len(item.images) for item in items)
        call = ModelCall(self.model, {"input_ids": encoded["input_ids"].to(device),
                                      "attention_mask": encoded["attention_mask"].to(device), **images},
                         image_rows=counts)  # fmt: skip
        answers = []
        for row, item in enumerate(items):
            ids = item.answer_ids if item.answer_ids is not None else self._greedy(call, row, item, settings)
            if item.foil_ids is not None:
                self._check_foil(item, ids)
            answers.append(ids)
        texts = [item.prompt_ids + answer for item, answer in zip(items, answers, strict=True)]
        length = max(len(text) for text in texts)
        offsets = [length - len(text) for text in texts]
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(items), length), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        foils = ids.clone() if items[0].foil_ids is not None else None
        for row, text in enumerate(texts):
            ids[row, offsets[row] :] = torch.tensor(text)
            mask[row, offsets[row] :] = 1
            if foils is not None:
                foils[row, offsets[row] :] = torch.tensor(items[row].prompt_ids + items[row].foil_ids)
        answer_values = dict(self.spec.answer_inputs)
        for name in positional:  # laid out again: the prompt's values where its tokens went, the answer's after
            laid = torch.zeros(ids.shape, dtype=images[name].dtype)
            for row, item in enumerate(items):
                start = offsets[row]
                laid[row, start : start + len(item.prompt_ids)] = images[name][row][prompt_mask[row]].cpu()
                laid[row, start + len(item.prompt_ids) :] = answer_values.get(name, 0)  # 0 unless the spec says
            images[name] = laid.to(device)
        shift = torch.full_like(ids[:, :1], pad)
        predicted = torch.cat([ids[:, 1:], shift], 1)
        foils = None if foils is None else torch.cat([foils[:, 1:], shift], 1).to(device)
        ids, mask, predicted = ids.to(device), mask.to(device), predicted.to(device)
        return self._batch(items, settings, ids, mask, predicted, foils, images, offsets, answers, counts)

    def _batch(self, items, settings, ids, mask, predicted, foils, images, offsets, answers, counts) -> VLMBatch:
        """The batch's request, spans' rows and units' members (``counts``: each row's images)."""
        model, spec = self.model, self.spec
        length = ids.shape[1]
        packed = [None] * len(items)
        if settings.units == "tiles" and spec.image_tiles is not None:  # the model's own packing places the tiles
            placed = iter(spec.image_tiles(images))
            packed = [[next(placed).tolist() for _ in range(count)] for count in counts]
        rows = [self._row_layout(item, settings, offsets[row], answers[row], ids[row].tolist(), packed[row])
                for row, item in enumerate(items)]  # fmt: skip
        span_count = max(len(row["span_tokens"]) for row in rows)
        unit_count = max(len(row["unit_keys"]) for row in rows)
        members = torch.zeros(len(items), span_count, length)
        units = torch.zeros(len(items), unit_count, length)
        generated = torch.zeros(len(items), length, dtype=torch.bool)
        explained = []
        for row, layout in enumerate(rows):
            start = offsets[row]
            for span, tokens in enumerate(layout["span_tokens"]):
                members[row, span, [start + token - 1 for token in tokens]] = 1  # predicted one position earlier
            for unit, keys in enumerate(layout["unit_keys"]):
                units[row, unit, [start + key for key in keys]] = 1
            first = start + len(items[row].prompt_ids)
            generated[row, first:] = True
            explained.append(list(range(first - 1, length - 1)))
        members, units, generated = members.to(ids.device), units.to(ids.device), generated.to(ids.device)
        spans = SpanRows(members)
        positions = spans.positions
        if settings.hops:
            positions = positions | (generated.roll(-1, 1) & mask.bool())  # the rows predicting generated tokens
        kwargs = forward_arguments(model, spec, ids, mask, extra=images)
        records = self.declaration.trace_records if self.declaration is not None else (lambda: "all")
        request = Request(
            spec=spec,
            model=model,
            attention_mask=mask,
            target_ids=None,
            target_mask=None,
            predicted_ids=predicted,
            foil_ids=foils,
            positions=positions,
            tracer=lambda: trace_call(
                spec, ModelCall(model, kwargs, image_rows=counts), full_logits=False, records=records()
            ),
            caller=lambda: ModelCall(model, kwargs, image_rows=counts),
        )
        return VLMBatch(
            items, request, spans, units, generated, settings.hops,
            unit_labels=[row["unit_labels"] for row in rows], unit_keys=[row["unit_keys"] for row in rows],
            span_labels=[row["span_labels"] for row in rows], span_tokens=[row["span_tokens"] for row in rows],
            image_tokens=[row["image_tokens"] for row in rows], answers=answers, explained=explained,
            tower=settings.tower,
        )  # fmt: skip

    def _row_layout(self, item: VLMItem, settings: CallSettings, offset: int, answer: list[int],
                    ids: list[int], packed: list[list[int]] | None = None) -> dict:  # fmt: skip
        """One prompt's units, spans and image tokens, as positions in its own text (prompt, then answer);
        ``packed``: each image token's tile, from the model's packing (:attr:`ModelSpec.image_tiles`)."""
        text = ids[offset:]
        count = len(item.prompt_ids)
        tokens = self.tokenizer.convert_ids_to_tokens(text)
        image_tokens, labels = self.image_positions(item)
        groups = None
        if settings.units == "images":
            groups = [(f"image {number + 1}", positions) for number, positions in enumerate(image_tokens)]
        elif settings.units == "tiles":
            groups = self.tile_units(item, packed)
        elif settings.units == "sentences":
            groups = self.sentence_units(item, answer, settings.language)
        elif settings.units == "boxes":
            groups = self.box_units(item, settings.boxes)
        if groups is not None:  # each group one unit, at its first token; every other token its own
            owner = {position: number for number, (_, positions) in enumerate(groups) for position in positions}
            unit_keys, unit_labels, seen = [], [], set()
            for index in range(len(text)):
                if index in owner:
                    if owner[index] not in seen:
                        seen.add(owner[index])
                        unit_keys.append(groups[owner[index]][1])
                        unit_labels.append(groups[owner[index]][0])
                    continue
                unit_keys.append([index])
                unit_labels.append(tokens[index])
        else:
            unit_keys = [[index] for index in range(len(text))]
            unit_labels = [labels.get(index, tokens[index]) for index in range(len(text))]
        generated = list(range(count, len(text)))
        if settings.spans == "tokens":
            span_tokens = [[index] for index in generated]
            span_labels = [tokens[index] for index in generated]
        else:
            span_tokens = [generated]
            span_labels = [_short(self.tokenizer.decode(answer))]
        return {"unit_keys": unit_keys, "unit_labels": unit_labels, "span_tokens": span_tokens,
                "span_labels": span_labels, "image_tokens": image_tokens}  # fmt: skip

    def image_positions(self, item: VLMItem) -> tuple[list[list[int]], dict[int, str]]:
        """Each image's token positions in its prompt, and each image token's label (:func:`_image_labels`)."""
        found = [index for index, token in enumerate(item.prompt_ids) if token == self.spec.image_token_id]
        image_tokens, labels, start = [], {}, 0
        for number, (size, grid) in enumerate(zip(item.image_counts, item.image_grids, strict=True)):
            positions = found[start : start + size]
            start += size
            image_tokens.append(positions)
            labels.update(_image_labels(number, self.tiles_of(positions), grid))
        return image_tokens, labels

    def tiles_of(self, positions: list[int]) -> list[list[int]]:
        """An image's tiles as its tokens show them: each run of its tokens (Idefics3's and SmolVLM's tiles, between
        their text markers), a run of several tiles' tokens cut into tiles (InternVL's, the processor's
        ``image_seq_length`` tokens each); one tile where the model packs its tiles on the image's grid (LLaVA-NeXT's:
        :meth:`tile_units` reads them from the model)."""
        runs = [[position for _, position in run]
                for _, run in itertools.groupby(enumerate(positions), lambda pair: pair[1] - pair[0])]  # fmt: skip
        size = getattr(self.processor, "image_seq_length", None)
        if self.spec.image_tiles is not None or not isinstance(size, int) or size < 1:
            return runs
        tiles = []
        for run in runs:  # a run of whole tiles cut into them, any other run one tile
            step = size if len(run) % size == 0 else len(run)
            tiles += [run[start : start + step] for start in range(0, len(run), step)]
        return tiles

    def tile_units(self, item: VLMItem, packed: list[list[int]] | None = None) -> list[tuple[str, list[int]]]:
        """The units ``units="tiles"`` make of one prompt's image tokens, as ``(label, positions)``: each tile's
        tokens (``img1 t2``, in the processor's order of tiles) and the image's newlines (``img1 newlines``) where
        an image has several tiles; an image of one tile is one unit (``image 1``, its newline in it). ``packed``:
        each image token's tile from the model's packing (:attr:`ModelSpec.image_tiles`), else :meth:`tiles_of`.

        Raises:
            ValueError: The model's packing does not place the image's tokens (naming the prompt).
        """
        image_tokens, _ = self.image_positions(item)
        groups = []
        for number, positions in enumerate(image_tokens, start=1):
            newlines = []
            if packed is None:
                tiles = self.tiles_of(positions)
            else:
                owner = packed[number - 1]
                if len(owner) != len(positions):
                    raise ValueError(f"{item.name}: the model packs {len(owner)} tokens for image {number}, which "
                                     f"has {len(positions)}: use units='images' for this tiling.")  # fmt: skip
                tiles = [[position for position, tile in zip(positions, owner, strict=True) if tile == chosen]
                         for chosen in sorted({tile for tile in owner if tile >= 0})]  # fmt: skip
                newlines = [position for position, tile in zip(positions, owner, strict=True) if tile < 0]
            if len(tiles) <= 1:
                groups.append((f"image {number}", positions))
                continue
            groups += [(f"img{number} t{tile}", members) for tile, members in enumerate(tiles, start=1)]
            if newlines:
                groups.append((f"img{number} newlines", newlines))
        return groups

    def sentence_units(self, item: VLMItem, answer: list[int], language: str = "en") -> list[tuple[str, list[int]]]:
        """The units ``units="sentences"`` make of one prompt and its answer, as ``(label, positions)``: each image's
        tokens (``image 1``), the sentences of each stretch of the prompt's text between images and markup tokens,
        and the answer's (``(generated) ...``), cut by ``sentencex``'s rules for ``language``; markup tokens (chat
        markers) stay their own units."""
        image_tokens, _ = self.image_positions(item)
        groups = [(f"image {number}", positions) for number, positions in enumerate(image_tokens, start=1)]
        apart = markup_ids(self.tokenizer) | {self.spec.image_token_id}
        text, count = item.prompt_ids + list(answer), len(item.prompt_ids)
        for (generated, markup), run in itertools.groupby(
            range(len(text)), lambda index: (index >= count, text[index] in apart)
        ):
            if markup:
                continue
            positions = list(run)
            for label, members in _sentence_groups(self.tokenizer, [text[index] for index in positions], language):
                groups.append((("(generated) " if generated else "") + label, [positions[m] for m in members]))
        return groups

    def box_units(self, item: VLMItem, boxes: list) -> list[tuple[str, list[int]]]:
        """The units ``units=[box, ...]`` make of one prompt's image tokens: each box's tokens (at least half their
        cell inside, a token in the first box that takes it), the rest of each boxed image, the other images whole;
        as ``(label, positions)``.

        Raises:
            ValueError: A box on an image the prompt does not have, outside its image, on an image whose tokens are
                not one grid, or covering no token's half cell (naming the prompt).
        """
        image_tokens, labels = self.image_positions(item)
        taken, groups = set(), []
        for index, (number, box) in enumerate(boxes):
            if number > len(item.images):
                raise ValueError(f"{item.name} has {len(item.images)} image(s): box {index + 1} is on image {number}.")
            image, positions = item.images[number - 1], image_tokens[number - 1]
            x0, y0, x1, y1 = checked_box(box, image, f"{item.name}: box {index + 1}", f"image {number}")
            cells = [GRID_CELL.match(labels[position]) for position in positions]
            if not all(cells):
                raise ValueError(f"{item.name}: image {number}'s tokens are not one grid (tiles, or tokens ended by a "
                                 "newline): a box cannot be placed on them.")  # fmt: skip
            grid = _grid_box(self.processor.image_processor, image.width, image.height)
            inside = cells_in_box([(int(cell["row"]), int(cell["column"])) for cell in cells], grid, box)
            members = [position for position, flag in zip(positions, inside, strict=True) if flag and
                       position not in taken]  # fmt: skip
            if not members:
                raise ValueError(f"{item.name}: box {index + 1} {list(box)} covers no image token of image {number} "
                                 "(at least half a token's cell, not already in an earlier box).")  # fmt: skip
            taken.update(members)
            groups.append((f"box {index + 1}", members))
        boxed = {number for number, _ in boxes}
        for number, positions in enumerate(image_tokens, start=1):
            rest = [position for position in positions if position not in taken]
            if rest:
                groups.append((f"image {number} (rest)" if number in boxed else f"image {number}", rest))
        return groups

    @torch.no_grad()
    def _greedy(self, call: ModelCall, row: int, item: VLMItem, settings: CallSettings) -> list[int]:
        """The model's greedy answer to one prompt (its own images), ended before the end-of-sequence token."""
        kwargs = call.rows(torch.tensor([row], device=self.device))
        ids, real = kwargs["input_ids"], kwargs["attention_mask"][0].bool()
        kwargs.update({name: value[:, real] for name, value in kwargs.items() if _positional(value, ids)})
        stop = self.model.generation_config.eos_token_id
        stop = self.tokenizer.eos_token_id if stop is None else stop
        stops = set(stop) if isinstance(stop, list | tuple) else {stop}
        out = self.model.generate(**kwargs, max_new_tokens=settings.max_new_tokens, do_sample=False,
                                  pad_token_id=self.tokenizer.pad_token_id)  # fmt: skip
        answer = out[0, kwargs["input_ids"].shape[1] :].tolist()
        cut = next((index for index, token in enumerate(answer) if token in stops), len(answer))
        if not answer[:cut]:
            raise ValueError(
                f"{item.name}: the greedy answer ends at once: pass generated= with the answer to explain."
            )
        return answer[:cut]

    # ----- outputs -----

    def explain(self, batch: VLMBatch, options) -> tuple[list, list[str] | None]:
        """The spans' scores over tokens (one pass where the method has one; a gradient baseline: Captum's, span by
        span), hops through the generated tokens, units summed; one sequence per prompt."""
        tower, kwargs = self.spec.tower, batch.request.model_call().kwargs if batch.tower else None
        recorded = batch.tower and tower.recorder is not None  # the tower read from the model's own forward pass
        runs = tower.tower_runs(kwargs) if batch.tower and not recorded else None  # refusals first
        with tower.recorder() if recorded else nullcontext() as seen:
            if self.declaration is None:
                result = self._gradient_spans(batch, **options)
                batch.unit_scores, batch.hop_units = unit_scores(result.target, batch.units), None
            else:
                result, batch.unit_scores, batch.hop_units = explain_spans(self.declaration, batch.request, options,
                                                                           batch.spans, batch.generated, batch.hops,
                                                                           batch.units)  # fmt: skip
        if batch.tower:
            runs = runs if runs is not None else tower.tower_runs(kwargs, seen)
            batch.tower_scores = self._tower_scores(batch, runs)
        self._laid_out += [{"answer": batch.answers[row], "unit_keys": batch.unit_keys[row],
                            "span_tokens": batch.span_tokens[row], "image_tokens": batch.image_tokens[row]}
                           for row in range(batch.size)]  # fmt: skip
        return [self.present(batch, result, row) for row in range(batch.size)], result.axis

    def present(self, batch: VLMBatch, result, row: int):
        """One prompt's sequence: units as ``source``, spans as ``target``; with ``tower=True``, each image's scores
        over the tower's input tokens in the sequence scores."""
        sequence = span_sequence(result, batch.unit_scores, batch.hop_units, row, batch.unit_labels[row],
                                 batch.span_labels[row], batch.request.foil_ids is not None)  # fmt: skip
        if batch.tower_scores is not None:
            sequence.sequence_scores.update(batch.tower_scores[row])
        return sequence

    def _gradient_spans(self, batch: VLMBatch, baselines=None, abs: bool = True,  # noqa: A002  (Captum's name)
                        **captum_options) -> LogitScores:  # fmt: skip
        """Captum's method on the first block's input, each span's summed logit (minus the contrast's) its output:
        scores ``(B, N, T)`` (summed over the embedding), the spans' logits ``(B, N)`` (see the module docstring)."""
        call, request = batch.request.caller(), batch.request
        members = batch.spans.members
        embeds = first_block_input(self.model, self.spec.decoder.layers[0].module, call.kwargs)
        if baselines is not None:
            if not isinstance(baselines, int | float):
                raise ValueError(f"baselines={baselines!r}: give a number (every embedding coordinate), or nothing "
                                 "(zeros).")  # fmt: skip
            captum_options["baselines"] = float(baselines)
        if self.method == "integrated_gradients":
            captum_options.setdefault("n_steps", 50)
        scores = torch.zeros(members.shape, dtype=torch.float32)
        logits = torch.zeros(members.shape[:2], dtype=torch.float32)
        for row in range(batch.size):
            for span in range(members.shape[1]):
                rows = members[row, span].nonzero().flatten()
                if not len(rows):
                    continue
                foils = None if request.foil_ids is None else request.foil_ids[row, rows]
                objective = _SpanLogit(self.model, self.spec, call, row, rows, request.predicted_ids[row, rows], foils)
                with torch.enable_grad():
                    found = captum_method(self.method, objective).attribute(
                        embeds[row : row + 1].clone().requires_grad_(True), **captum_options
                    )
                if self.method == "saliency" and abs:
                    found = found.abs()
                scores[row, span] = upcast(found[0].sum(-1).detach()).cpu()
                with torch.no_grad():
                    logits[row, span] = float(objective(embeds[row : row + 1]).detach())
        device = members.device
        return LogitScores(target=scores.to(device), source=None, logit=logits.to(device), complete=False)

    def _tower_scores(self, batch: VLMBatch, runs: list) -> list[dict[str, torch.Tensor]]:
        """Each row's image-token scores continued through the vision tower (the tower traced over the batch's
        images, in one run or one per image, its ALTI rollout: :mod:`inseq_mixing.methods.tower`), per image
        ``(tower tokens, spans)``."""
        tower = self.spec.tower
        merge = tower.merge
        read, labels = [], []  # per tower image: its rollout, its merge shares and groups (or None); its labels
        for run in runs:
            trace = trace_call(tower.spec, ModelCall(tower.module, run.inputs, frame_masks={"decoder": run.mask}))
            if run.expected is not None:
                check_reproduced(trace.final_hidden, run.read_out, run.expected)
            rollout = tower_rollout(trace, tower.layers)
            states = trace.final_hidden[:, tower.first_feature :]  # the states the projector read ([CLS] dropped)
            shares = None if merge is None else merge_shares(states, merge)
            groups = None if merge is None else merge.groups_of(states.shape[1])
            read += [(rollout[image], None if merge is None else (shares[image], groups))
                     for image in range(len(rollout))]  # fmt: skip
            labels += [run.labels] * len(rollout)
        layout = [placed for run in runs for placed in (run.layout or [])] if runs[0].layout is not None else None
        tiles = _tower_tiles(batch.image_tokens, read, tower.first_feature, layout)
        found = []
        for row in range(batch.size):
            scores = batch.unit_scores[row, : len(batch.span_tokens[row])]  # (spans, units): a unit per token
            spreads = []
            for own in tiles[row]:
                spread = []
                for image, positions, features in own:
                    rollout, folded = read[image]
                    on_tokens = scores.new_zeros(scores.shape[0], _read_tokens(read[image], tower.first_feature))
                    on_tokens[:, features] = scores[:, positions]
                    spread.append(through_tower(on_tokens, rollout, tower.first_feature, folded))
                spreads.append(spread)
            found.append({f"tower_image{number + 1}": upcast(torch.cat(spread, -1).T.detach()).cpu()
                          for number, spread in enumerate(spreads)})  # fmt: skip
            if not tower.tokens:  # images of their own sizes: their labels
                self._laid_out_towers.append([labels[own[0][0]] for own in tiles[row]])
        return found

    def before_work(self, items: list[VLMItem]) -> None:
        self._laid_out = []  # each prompt's answer, units and spans, added to ``info`` once the call is done
        self._laid_out_towers = []  # with tower=True and images of their own sizes, each prompt's images' labels

    def attribute_items(self, items: list, *, settings: CallSettings | None = None, **kwargs):
        """The base loop, then each prompt's answer, units' and spans' positions and image tokens in ``info`` (and,
        with ``tower=True``, the tower's input tokens)."""
        out = super().attribute_items(items, settings=settings, **kwargs)
        laid_out = self._laid_out
        out.info["generated_texts"] = [self.tokenizer.decode(row["answer"]) for row in laid_out]
        for name in ("unit_keys", "span_tokens", "image_tokens"):
            out.info[name] = [row[name] for row in laid_out]
        if settings is not None and settings.tower:
            tower = self.spec.tower
            out.info["tower_tokens"] = _tower_labels(tower.tokens) if tower.tokens else self._laid_out_towers
        return out

    def output_logits(self, batch: VLMBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's logits at every position (its head on the traced final states) and the explained tokens."""
        trace = batch.request.trace
        logits = trace.logits if trace.logits is not None else self.spec.lm_head(trace.final_hidden)
        return logits, batch.request.predicted_ids


class _SpanLogit(nn.Module):
    """One span's summed logit (minus the contrast's) as a function of one row's first-block input (Captum's forward
    function): the model runs on the row's ids and images, each copy of the input replacing that block's input."""

    def __init__(self, model: nn.Module, spec, call: ModelCall, row: int, rows: torch.Tensor, ids: torch.Tensor,
                 foils: torch.Tensor | None):  # fmt: skip
        super().__init__()
        self.model, self.spec, self.call, self.row = model, spec, call, row
        self.rows, self.ids, self.foils = rows, ids, foils

    def forward(self, embeds: torch.Tensor) -> torch.Tensor:
        copies = torch.full((embeds.shape[0],), self.row, dtype=torch.long, device=self.rows.device)
        kwargs = self.call.rows(copies)
        no_graph = no_graph_before_blocks(self.model, self.spec) if torch.is_grad_enabled() else nullcontext()
        with first_block_input_replaced(self.spec.decoder.layers[0].module, embeds), no_graph:
            logits = self.model(**kwargs).logits[:, self.rows]  # the tower and projector run without a graph
        chosen = logits.gather(-1, self.ids.expand(len(logits), -1)[..., None])[..., 0]
        if self.foils is not None:
            chosen = chosen - logits.gather(-1, self.foils.expand(len(logits), -1)[..., None])[..., 0]
        return chosen.sum(-1)


def _positional(value, ids: torch.Tensor) -> bool:
    """Whether a model input is laid out like the ids (the ids, their mask, Qwen2-VL's ``mm_token_type_ids``): a 2-D
    integer tensor of their shape."""
    return isinstance(value, torch.Tensor) and value.shape == ids.shape and value.dtype in POSITIONAL


def _image_labels(number: int, tiles: list[list[int]], grid: tuple[int, int] | None) -> dict[int, str]:
    """Each image token's label: its image, its tile (where it has several: ``tiles``, each tile's positions) and its
    place on the tile's grid (``grid``, or a square one where the tile makes one), else its number in the tile."""
    labels = {}
    for tile, run in enumerate(tiles):
        prefix = f"img{number + 1}" + (f" t{tile + 1}" if len(tiles) > 1 else "")
        side = math.isqrt(len(run))
        rows, columns = grid if grid is not None and grid[0] * grid[1] == len(run) else (side, side)
        for index, position in enumerate(run):
            labels[position] = f"{prefix} r{index // columns}c{index % columns}" if rows * columns == len(run) \
                else f"{prefix} #{index}"  # fmt: skip
    return labels


def _sentence_groups(tokenizer, ids: list[int], language: str = "en") -> list[tuple[str, list[int]]]:
    """A stretch of text tokens cut into its sentences (``sentencex`` on its decoded text), as ``(label, token
    indices)``: a sentence's tokens end where the decoded text reaches its end (found by bisection over prefixes, a
    handful of decodes a sentence); spaces between sentences go with the next, every token in one."""
    decode = lambda part: tokenizer.decode(part, clean_up_tokenization_spaces=False)  # noqa: E731
    text = decode(ids)
    ranges = sentence_ranges(text, language)
    if not ranges:  # blank (a chat template's line breaks): each token its own
        return [(token, [index]) for index, token in enumerate(tokenizer.convert_ids_to_tokens(ids))]
    cuts = [0]
    for begin, end in ranges[:-1]:
        end = begin + len(text[begin:end].rstrip())  # its last character, the spaces after it left to the next
        low, high = cuts[-1], len(ids)  # the fewest tokens whose text reaches the sentence's end
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if len(decode(ids[:middle])) >= end else (middle + 1, high)
        cuts.append(low)
    cuts.append(len(ids))
    bounds = zip(ranges, cuts[:-1], cuts[1:], strict=True)
    return [(_short(text[begin:end]), list(range(low, last))) for (begin, end), low, last in bounds if last > low]


def _grid_box(image_processor, width: int, height: int) -> list[float]:
    """The part of an image ``(left, top, right, bottom)``, in its pixels, that its token grid covers: the centred
    square a processor that resizes the shorter side and crops the centre keeps (CLIP's, LLaVA's); the square the image
    is padded to where the processor pads it square first; else the whole image (Qwen2-VL resizes it whole)."""
    crop = getattr(image_processor, "crop_size", None)
    size = getattr(image_processor, "size", None)
    if getattr(image_processor, "do_pad", False) and getattr(image_processor, "do_center_crop", False) is not True:
        side = max(width, height)
        return [(width - side) / 2, (height - side) / 2, (width + side) / 2, (height + side) / 2]
    shortest = getattr(size, "shortest_edge", None) if size is not None else None
    if getattr(image_processor, "do_center_crop", False) and crop is not None and shortest:
        scale = shortest / min(width, height)
        crop_width, crop_height = getattr(crop, "width", None), getattr(crop, "height", None)
        if crop_width and crop_height:
            box_width, box_height = min(width, crop_width / scale), min(height, crop_height / scale)
            left, top = (width - box_width) / 2, (height - box_height) / 2
            return [left, top, left + box_width, top + box_height]
    return [0.0, 0.0, float(width), float(height)]


def _runs(ids: list[int], token: int) -> list[int]:
    """The lengths of the runs of ``token`` in ``ids``, in order."""
    return [len(list(run)) for value, run in itertools.groupby(ids) if value == token]


def _read_tokens(read: tuple, first_feature: int) -> int:
    """How many tokens of one tower image the projector turns into image tokens: its merged tokens, or its tokens
    after ``first_feature``."""
    rollout, folded = read
    return len(folded[1]) if folded is not None else len(rollout) - first_feature


def _tower_tiles(image_tokens: list, read: list, first_feature: int, layout: list | None) -> list:
    """Per row, per image: the tower images its tokens came from, each as ``(tower image, the image tokens' positions,
    the tokens read in that tower image)``: each tower image's tokens in turn (``layout`` None), or as ``layout``
    places them (per image of the batch ``(tokens, 2)``, ``-1`` for a token no tower token gave).

    Raises:
        ValueError: The images' tokens do not make the tower images read.
    """
    images = [positions for row in image_tokens for positions in row]
    fits = layout is None or len(layout) == len(images)
    found, image = [], 0
    for number, positions in enumerate(images if fits else []):
        own = []
        if layout is None:
            start = 0
            while start < len(positions) and image < len(read):
                count = _read_tokens(read[image], first_feature)
                own.append((image, positions[start : start + count], torch.arange(count)))
                start, image = start + count, image + 1
            fits = fits and start == len(positions)
        else:
            placed = layout[number]
            fits = fits and len(placed) == len(positions)
            for tower_image in placed[:, 0].unique().tolist() if fits else []:
                chosen = placed[:, 0] == tower_image
                if tower_image >= 0:
                    own.append((tower_image, torch.as_tensor(positions)[chosen], placed[chosen, 1]))
            image = max(image, *(entry[0] + 1 for entry in own)) if own else image
        found.append(own)
    if not fits or image != len(read) or not all(found):
        raise ValueError(f"The images' tokens do not make the {len(read)} images the tower read: leave tower=False "
                         "for this processor's tiling.")  # fmt: skip
    tiles, number = [], 0
    for row in image_tokens:
        tiles.append(found[number : number + len(row)])
        number += len(row)
    return tiles


def _tower_labels(tokens: int) -> list[str]:
    """The tower's input tokens: a class token where the patches make a square grid with one token left, then the
    patches ``r{row}c{column}``."""
    side = math.isqrt(tokens)
    leading = [] if side * side == tokens else ["[CLS]"]
    side = math.isqrt(tokens - len(leading))
    return leading + [f"r{index // side}c{index % side}" for index in range(tokens - len(leading))]


def cells_in_box(cells: list[tuple[int, int]], grid_box, box) -> list[bool]:
    """Whether each token cell ``(row, column)`` of an image's grid has at least half its area inside ``box``
    (``[x0, y0, x1, y1]``), the grid stretched over ``grid_box`` (``(left, top, right, bottom)``, the part of the
    image it covers: ``info["image_boxes"]``)."""
    rows, columns = (1 + max(cell[axis] for cell in cells) for axis in (0, 1))
    left, top, right, bottom = grid_box
    width, height = (right - left) / columns, (bottom - top) / rows
    x0, y0, x1, y1 = box
    inside = []
    for row, column in cells:
        cell_left, cell_top = left + column * width, top + row * height
        wide = max(0.0, min(x1, cell_left + width) - max(x0, cell_left))
        high = max(0.0, min(y1, cell_top + height) - max(y0, cell_top))
        inside.append(wide * high >= 0.5 * width * height)
    return inside


def _call_arguments(spans: str = "tokens", units="tokens", hops: int = 0, max_new_tokens: int = 20,
                    tower: bool = False, language: str = "en") -> dict:  # fmt: skip
    """The front end's own arguments of one call (:meth:`VisionLanguageAttributionModel.attribute`'s, a dataset run's)
    checked, ``units`` given as boxes read into ``boxes`` (``units="boxes"``).

    Raises:
        ValueError: An unknown span or unit kind, malformed boxes, a negative or non-integer ``hops``, a
            ``max_new_tokens`` below 1, a ``language`` that is not a language code.
    """
    if spans not in SPAN_KINDS:
        raise ValueError(f"spans={spans!r}: give one of {SPAN_KINDS}.")
    boxes = None
    if not isinstance(units, str):
        boxes, units = _boxes(units), "boxes"
    elif units not in UNIT_KINDS:
        raise ValueError(f"units={units!r}: give one of {UNIT_KINDS}, or a list of boxes.")
    if isinstance(hops, bool) or not isinstance(hops, int) or hops < 0:
        raise ValueError(f"hops must be a non-negative integer, not {hops!r}.")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, not {max_new_tokens!r}.")
    if not isinstance(language, str) or not re.fullmatch(r"[a-z]{2,3}", language):
        raise ValueError(f"language={language!r}: give a language code ('en', 'fr', ...).")
    return {"spans": spans, "units": units, "hops": hops, "max_new_tokens": max_new_tokens, "tower": tower,
            "boxes": boxes, "language": language}  # fmt: skip


def _boxes(units) -> list[tuple[int, list[float]]]:
    """``units=`` given as boxes: each ``[x0, y0, x1, y1]`` (the first image) or ``(image_number, [...])``."""
    found = []
    for index, entry in enumerate(plain(list(units)) if isinstance(units, list | tuple) else [None]):
        number, box = (1, entry) if isinstance(entry, list | tuple) and len(entry) == 4 else \
            (entry[0], entry[1]) if isinstance(entry, list | tuple) and len(entry) == 2 else (None, None)  # fmt: skip
        numbers = isinstance(box, list | tuple) and len(box) == 4 and all(isinstance(v, int | float) for v in box)
        valid = numbers and isinstance(number, int) and not isinstance(number, bool) and number >= 1
        if not valid:
            raise ValueError(f"units: box {index + 1} is {entry!r}; give [x0, y0, x1, y1] in the first image's "
                             "pixels, or (image_number, [x0, y0, x1, y1]) from image 1.")  # fmt: skip
        found.append((number, [float(value) for value in box]))
    if not found:
        raise ValueError(f"units: give at least one box, or one of {UNIT_KINDS}.")
    return found


def _short(text: str, limit: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _per_prompt(values, count: int, what: str, single: bool) -> list:
    """``generated`` / ``contrast_targets`` as one entry per prompt."""
    if values is None:
        return [None] * count
    if single and isinstance(values, str):
        return [values]
    if isinstance(values, str) or not isinstance(values, list | tuple) or len(values) != count:
        raise ValueError(f"{what} must have one text per prompt ({count}), not {values!r}.")
    return list(values)


def load_saved(name: str, config, tokenizer, processor):
    """A vision–language model saved under ``name``, as the class it was saved as, with its processor when not given
    (the kind's loader)."""
    if processor is None:
        import transformers

        try:
            processor = transformers.AutoProcessor.from_pretrained(name)
        except (OSError, ValueError, TypeError) as error:
            raise ValueError(
                f"{name} has no processor a vision-language model can read images with ({error}): save the model's "
                "processor into it (processor.save_pretrained(folder)), or give it apart (processor=...)."
            ) from None
    return saved_model(name, config), tokenizer, processor
