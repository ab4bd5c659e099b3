"""The encoder-only front end: masked LMs, classifiers and bare encoders, with Inseq's output.

Inseq loads generation models only. :func:`inseq_mixing.load_model` (:mod:`.router`) sends encoder–decoders and
decoder-only models to ``inseq.load_model`` and gives encoder-only models an :class:`EncoderAttributionModel` with the
same surface:
``.attribute(...)`` returns ``inseq.FeatureAttributionOutput``, so ``show()``, ``aggregate()``, ``save()`` /
``FeatureAttributionOutput.load()`` and ``weight_attributions()`` work as for generation models.

What is explained (one explained entry per row of the output's ``target``):

- masked LM: each mask token of the input; its target is the model's top prediction there, or ``targets=`` (a word
  per mask: a word of several subwords is explained by its first subword, the ALTI-logit paper's convention);
  ``foils=`` makes logit methods explain ``logit(target) − logit(foil)``;
- sequence classification: the predicted label, or ``targets=`` (index or label name), with ``foils=`` another label
  (the classifier reads the first token, whose row is explained);
- token classification: the tokens of ``positions=`` (default: every token), each for its predicted label or the label
  in ``targets=``;
- bare encoder: map methods only, the rows of ``positions=`` (default: the first token, [CLS] / ``<s>``).

Layout: ``source`` = the input tokens, ``target`` = the explained entries, ``source_attributions`` ``(tokens,
explained[, layers])``; map methods also put the token-to-token maps in ``sequence_scores["encoder_self_scores"]``
``(tokens, tokens[, layers])``; logit methods put the logit (``contrast_logits_diff`` with a foil) and every
``unattributed_*`` term in the step scores, so that token scores plus those terms equal the model's own logit.

No math here: the methods are the declarations' ``compute`` (:mod:`inseq_mixing.declarations`); the gradient
baselines are Captum's, on the input embeddings.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn

from ..declarations import DECLARATIONS, InputSize, Request
from ..methods.blocks import upcast
from ..methods.results import LogitScores
from ..specs import get_spec
from ..specs.encoder_heads import model_task
from ..trace import trace_model
from .common import FrontEndModel, plain, saved_model
from .layout import logit_step_scores, row_steps, sequence_output, token_list, tokens_first
from .words import token_words

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

#: What ``info["explained"]`` says per task, for logit methods (and the gradient baselines).
EXPLAINED = {
    "masked_lm": "each mask token's logit for its target word (a word of several subwords: its first subword, the "
    "ALTI-logit paper's convention)",
    "sequence_classification": "the classifier's logit for the label, read at the first token",
    "token_classification": "each explained token's logit for its label",
    None: "the rows of the explained positions in the token-to-token maps (bare encoder: no logit)",
}
#: What ``info["explained"]`` says per task, for map methods (which explain no logit).
EXPLAINED_BY_MAPS = {
    "masked_lm": "the row of each mask token in the token-to-token maps (a text without a mask: the rows of "
    "positions=, default the first token; nothing is predicted there); no logit",
    "sequence_classification": "the row of the first token (which the classifier reads) in the token-to-token maps; "
    "no logit",
    "token_classification": "the rows of the explained tokens in the token-to-token maps; no logit",
    None: EXPLAINED[None],
}


@dataclass
class _Text:
    """One text to explain, as :meth:`EncoderAttributionModel.attribute` was given it, and how errors name it."""

    text: str
    target: object
    foil: object
    positions: list[int] | None
    name: str


@dataclass
class EncoderBatch:
    """One batch of texts, tokenized, with what is explained in each and the method's request (None for the
    gradient baselines). The vision front end fills it with images: ``texts`` their names, ``inputs`` the token
    indices and mask of the patch sequence."""

    texts: list[str]
    inputs: dict
    positions: torch.Tensor  # (B, T) booleans
    explained: list[list[int]]  # per text, the explained positions in order
    target_ids: torch.Tensor  # (B, T) output index explained at each position
    foil_ids: torch.Tensor | None
    logits: torch.Tensor | None = None  # (B, T, outputs): the head's at every position, None for a bare encoder
    request: Request | None = None

    @property
    def size(self) -> int:
        return len(self.texts)


class EncoderAttributionModel(FrontEndModel):
    """An encoder-only model with one attribution method (see the module docstring).

    Args:
        model: An encoder-only Hugging Face model of a supported family.
        tokenizer: Its tokenizer (with a mask token for masked LMs).
        method: The method's name.
    """

    item_name = "text"

    def __init__(self, model: nn.Module, tokenizer, method: str):
        self.model, self.tokenizer, self.method = model, tokenizer, method
        self.spec = get_spec(model)
        if not self.spec.is_encoder_only:
            raise ValueError(f"{type(model).__name__} is not an encoder-only model: use inseq.load_model for it.")
        self.task = self.model_task()
        if method not in DECLARATIONS and method not in GRADIENT_METHODS:
            names = [*DECLARATIONS, *GRADIENT_METHODS]
            raise ValueError(f"Unknown method {method!r} for encoder-only models: use one of {names}.")
        self.declaration = DECLARATIONS.get(method)
        explains_logit = self.declaration is None or self.declaration.explains_logit
        if explains_logit and self.task is None:
            raise ValueError(
                f"{method} explains a logit, and {type(model).__name__} is a bare encoder: load the model with a head "
                "(...ForMaskedLM, ...ForSequenceClassification or ...ForTokenClassification), or use a map method "
                "(alti, value_zeroing, attention_rollout, attention_norm, globenc)."
            )
        if self.task == "masked_lm" and tokenizer.mask_token_id is None:
            raise ValueError("This tokenizer has no mask token: a masked LM explains its mask tokens.")

    def for_method(self, method: str) -> EncoderAttributionModel:
        """The same model and tokenizer with another method."""
        return type(self)(self.model, self.tokenizer, method)

    def model_task(self) -> str | None:
        """The head's task (:func:`~inseq_mixing.specs.encoder_heads.model_task`), None for a bare encoder."""
        return model_task(self.model)

    def check_options(self, options: dict) -> None:
        """Refuse unknown option names and wrong values before any work."""
        if self.declaration is not None:
            self.declaration.check_options(options)
            return
        known = GRADIENT_OPTIONS[self.method]
        if set(options) - set(known):
            raise ValueError(
                f"Unknown option(s) {sorted(set(options) - set(known))} for {self.method}: it takes {list(known)} "
                "(Captum's own names)."
            )

    def make_options(self, options: dict) -> dict:
        """The declared method's options with their defaults; a gradient baseline's as given."""
        return self.declaration.make_options(options) if self.declaration is not None else dict(options)

    def check_rows(self, sources: list, targets: list, words: list, own: dict, names: list[str]) -> None:
        """A dataset run's rows checked before any work (:meth:`validate`), errors naming the row."""
        self.validate(sources, self.row_targets(targets, names), names=names)

    def attribute_rows(self, sources: list, targets: list, words: list, own: dict, options: dict,
                       names: list[str] | None = None, progress=None) -> list:  # fmt: skip
        """One batch of a dataset run (the target column: a mask's word, one per mask, or a label, per token), with
        each row's target text: the given one, or the predicted entries' tokens."""
        sequences = self.attribute(
            sources, self.row_targets(targets), show_progress=False, batch_size=len(sources), **options
        ).sequence_attributions
        return [
            (sequence, target or " ".join(token.token for token in sequence.target))
            for sequence, target in zip(sequences, targets, strict=True)
        ]

    def split_target(self, text: str):
        """A dataset's target text as ``attribute``'s target: a masked LM's words (one per mask) and a token
        classifier's labels (one per explained token) are separated by spaces; a sequence classifier's is one label."""
        return text if self.task == "sequence_classification" else text.split()

    def attribute(
        self,
        texts: str | list[str],
        targets=None,
        foils=None,
        *,
        positions: list[int] | list[list[int]] | None = None,
        batch_size: int = 8,
        show_progress: bool = True,
        **method_options,
    ):
        """Explain ``texts`` (see the module docstring for ``targets``, ``foils`` and ``positions`` per task).

        Args:
            texts: One text or a list.
            targets: Per text: masked LM: a word, or a list of words (one per mask); classifiers: a label index or
                name (token classification: one per explained position); default: the model's predictions.
            foils: Like ``targets``: the contrast of logit methods (``logit(target) − logit(foil)``).
            positions: Token indices to explain (token classification, bare encoders), per text or one list for all.
            batch_size: Texts per forward pass (ModernBERT in float64: one text at a time, since transformers'
                float64 masking of a padded batch gives NaN that reaches the real tokens).
            show_progress: Show a progress bar over batches.
            method_options: The method's options (``inseq-mixing methods --options``; gradient methods: Captum's
                ``n_steps`` for integrated gradients); and Inseq's names: ``generated_texts`` (the targets),
                ``contrast_targets`` (the foils), ``attributed_fn`` (``"logit"``, ``"contrast_logits_diff"`` with
                foils: what is explained) and ``step_scores`` (``"probability"``, ``"entropy"``, ``"logit"`` of
                each explained entry).

        Returns:
            ``inseq.FeatureAttributionOutput``, one sequence per text.
        """
        texts = [texts] if isinstance(texts, str) else list(texts)
        return self.attribute_inputs(texts, targets, foils, batch_size=batch_size, show_progress=show_progress,
                                     method_options=method_options, call={"positions": positions})  # fmt: skip

    def batch_size_for(self, batch_size: int) -> int:
        """One text at a time where transformers' float64 masking of padded rows would put NaN into real tokens
        (ModernBERT), else ``batch_size``."""
        if self.spec.float64_padding_nan and next(self.model.parameters()).dtype == torch.float64:
            return 1
        return batch_size

    def items(self, texts: list[str], targets, foils, positions=None) -> list[_Text]:
        """One item per text, with its target, foil and positions."""
        targets, foils = per_text(plain(targets), len(texts), "targets"), per_text(foils, len(texts), "foils")
        positions = per_text_positions(plain(positions), len(texts))
        return [_Text(text, target, foil, chosen, f"Text {index}")
                for index, (text, target, foil, chosen) in enumerate(zip(texts, targets, foils, positions,
                                                                         strict=True))]  # fmt: skip

    def info_entries(self, items: list[_Text], settings=None) -> dict:
        """The front end's entries of the output's ``info``."""
        return {
            "tokenizer_name": getattr(self.tokenizer, "name_or_path", ""),
            "tokenizer_class": type(self.tokenizer).__name__,
            "input_texts": [item.text for item in items],
            "task": self.task or "encoder",
            "explained": (
                EXPLAINED if self.declaration is None or self.declaration.explains_logit else EXPLAINED_BY_MAPS
            )[self.task],  # fmt: skip
            "attributed_fn": self.explained_quantity([item.foil for item in items]),
        }

    NO_FOILS = None

    def call_foils(self, foils, options: dict):
        """The foils, from ``foils=`` or Inseq's name for them, ``contrast_targets=`` (taken out of ``options``);
        refused for map methods, which have no contrastive form."""
        contrast = options.pop("contrast_targets", None)
        if options.pop("contrast_targets_alignments", None) is not None:
            raise ValueError(
                "contrast_targets_alignments aligns a generated text with its foil text; an encoder explains its mask "
                "tokens or labels: give one foil per explained entry with foils= (or contrast_targets=)."
            )
        if contrast is not None:
            if foils is not None:
                raise ValueError("Give the foils once: foils= or contrast_targets= (Inseq's name for them), not both.")
            foils = contrast
        explains_logit = self.declaration is None or self.declaration.explains_logit
        if foils is not None and not explains_logit:
            raise ValueError(
                f"{self.method} gives context-mixing maps, which have no contrastive form: foils= (contrast_targets=) "
                "applies to the logit methods (alti_logit, decompx, attn_lrp) and the gradient baselines."
            )
        return foils

    def explained_quantity(self, foils) -> str:
        if self.declaration is not None and not self.declaration.explains_logit:
            return f"{self.method} map: context mixing into each explained position"
        return "contrast_logits_diff" if any(foil is not None for foil in foils) else "logit"

    # ----- inputs -----

    def validate(self, texts: str | list[str], targets=None, foils=None, positions=None, names=None) -> None:
        """Raise the error :meth:`attribute` would raise for these inputs (no mask token, a word mapped to the
        unknown token, an unknown label, a count that does not match), without running the model.

        Args:
            texts, targets, foils, positions: As for :meth:`attribute`.
            names: How the errors name each text (default ``"Text 0"``, ``"Text 1"``, ...; a dataset run names its
                rows and ids).
        """
        texts = [texts] if isinstance(texts, str) else list(texts)
        targets = per_text(plain(targets), len(texts), "targets")
        foils = per_text(plain(foils), len(texts), "foils")
        names = names or [f"Text {index}" for index in range(len(texts))]
        inputs = self._encode(texts)
        explained = self.explained_cells(inputs, per_text_positions(plain(positions), len(texts)), names)
        self.output_ids(inputs["input_ids"], explained, targets, foils, torch.zeros_like(inputs["input_ids"]), names)

    def input_sizes(self, items: list[_Text], settings=None) -> list[InputSize]:
        """Each text's tokens (its one stack's positions)."""
        encoded = self.tokenizer([item.text for item in items])["input_ids"]
        return [InputSize(len(ids)) for ids in encoded]

    def _encode(self, texts: list[str]) -> dict:
        """The tokenized texts (right padding), with the inputs the model's forward takes."""
        encoded = self.tokenizer(texts, return_tensors="pt", padding=True)
        accepted = inspect.signature(self.model.forward).parameters
        return {name: value.to(self.device) for name, value in encoded.items() if name in accepted}

    def explained_cells(self, inputs: dict, positions: list, names: list[str]) -> list[list[int]]:
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        return [self.explained_positions(ids[row], mask[row], positions[row], names[row]) for row in range(len(ids))]

    def output_ids(self, ids, explained, targets, foils, predictions, names: list[str]):
        """The explained output at every position ``(B, T)`` (``predictions`` where no target is given) and the
        foils', or None without foils."""
        target_ids = predictions.clone()
        foil_ids = None if all(foil is None for foil in foils) else torch.zeros_like(ids)
        for row, cells in enumerate(explained):
            unmasked = self.task == "masked_lm" and not bool((ids[row, cells] == self.tokenizer.mask_token_id).all())
            if unmasked and (targets[row] is not None or foils[row] is not None):
                raise ValueError(
                    f"{names[row]} has no mask token, so there is no word to give a target or foil for: put "
                    f"{self.tokenizer.mask_token} where the word is, or give no target."
                )
            self._fill(target_ids, row, cells, targets[row], "targets", names[row])
            if foil_ids is not None:
                if foils[row] is None:
                    raise ValueError(f"{names[row]} has no foil: give one foil per text, or none at all.")
                self._fill(foil_ids, row, cells, foils[row], "foils", names[row])
        return target_ids, foil_ids

    def prepare(self, items: list[_Text], settings=None) -> EncoderBatch:
        """A batch of texts tokenized and traced, the explained positions and outputs found (a text without a mask
        or a bad target fails before the model runs), and the declared method's request."""
        texts, names = [item.text for item in items], [item.name for item in items]
        targets, foils = [item.target for item in items], [item.foil for item in items]
        inputs = self._encode(texts)
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        explained = self.explained_cells(inputs, [item.positions for item in items], names)
        self.output_ids(ids, explained, targets, foils, torch.zeros_like(ids), names)
        extra = {name: value for name, value in inputs.items() if name not in ("input_ids", "attention_mask")}
        trace = trace_model(self.model, ids, mask, spec=self.spec, extra=extra)
        where = torch.zeros_like(mask, dtype=torch.bool)
        for row, cells in enumerate(explained):
            where[row, cells] = True
        predictions = torch.zeros_like(ids) if trace.logits is None else trace.logits.argmax(-1)
        target_ids, foil_ids = self.output_ids(ids, explained, targets, foils, predictions, names)
        batch = EncoderBatch(texts, inputs, where, explained, target_ids, foil_ids, trace.logits)
        if self.declaration is not None:
            batch.request = Request(spec=self.spec, model=self.model, attention_mask=mask,
                                    target_ids=None, target_mask=None, predicted_ids=target_ids, foil_ids=foil_ids,
                                    positions=where, tracer=lambda: trace)  # fmt: skip
        return batch

    def explain(self, batch: EncoderBatch, options: dict) -> tuple[list, list[str] | None]:
        """The declared method (:meth:`FrontEndModel.explain`), or a gradient baseline through Captum."""
        if self.declaration is None:
            return self._gradient_sequences(batch, **options), None
        return super().explain(batch, options)

    def explained_positions(self, ids, mask, chosen, name: str) -> list[int]:
        length = int(mask.sum())
        limit = self.spec.max_positions
        if limit is not None and length > limit:
            raise ValueError(
                f"{name} has {length} tokens, but this {self.spec.family} model reads {limit} at most (its table of "
                "position embeddings): shorten or split the text."
            )
        if self.task == "masked_lm":
            cells = (ids[:length] == self.tokenizer.mask_token_id).nonzero().flatten().tolist()
            if cells:
                return cells
            if self.declaration is None or self.declaration.explains_logit:
                raise ValueError(
                    f"{name} has no mask token: put {self.tokenizer.mask_token} where the word to explain is ("
                    f"{self.method} explains a mask's logit; the map methods also take a text without a mask)."
                )
            # a map method on a text without a mask: its maps, rows of positions= as for a bare encoder
        if self.task == "sequence_classification":
            return [0]
        if chosen is None:
            return list(range(length)) if self.task == "token_classification" else [0]
        cells = [int(cell) for cell in chosen]
        bad = [cell for cell in cells if not 0 <= cell < length]
        if bad:
            raise ValueError(f"{name} has {length} tokens: positions {bad} are outside it.")
        return cells

    def _fill(self, ids: torch.Tensor, row: int, cells: list[int], given, what: str, name: str) -> None:
        """Write the given targets (or foils) of one text into ``ids`` at its explained cells."""
        if given is None:
            return
        given = [given] if isinstance(given, str | int | float) else list(given)
        if self.task == "sequence_classification" and len(given) != 1:
            raise ValueError(f"{name}: a classifier explains one label, but {what} gives {len(given)}.")
        if len(given) != len(cells):
            raise ValueError(f"{name} explains {len(cells)} position(s), but {what} gives {len(given)} value(s).")
        for cell, value in zip(cells, given, strict=True):
            try:
                ids[row, cell] = self.output_index(value)
            except ValueError as error:
                raise ValueError(f"{name}: {error}") from None

    def output_index(self, value) -> int:
        """The output row of a target or foil: a word's first subword (masked LM), or a label's index."""
        if self.task == "masked_lm":
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"A masked LM's target or foil is a word, not {value!r}.")
            ids = self.tokenizer(" " + value.strip(), add_special_tokens=False).input_ids
            marker = ids and self.tokenizer.convert_ids_to_tokens(ids[0]) in ("Ġ", "▁")
            ids = ids[1:] if marker and len(ids) > 1 else ids
            if not ids or ids[0] == self.tokenizer.unk_token_id:
                raise ValueError(
                    f"The word {value!r} is not in the tokenizer's vocabulary (it maps to the unknown token)."
                )
            return ids[0]
        labels = getattr(self.model.config, "label2id", None) or {}
        if isinstance(value, str) and value not in labels:  # a label index read as text ("2", or "2.0" from a table)
            value = _number(value.strip()) if _number(value.strip()) is not None else value
        if isinstance(value, str):
            if value not in labels:
                raise ValueError(f"Unknown label {value!r}: the model's labels are {list(labels)}.")
            return int(labels[value])
        if isinstance(value, float) and value.is_integer():  # a column with a missing value reads as floats
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"A label is a name or a whole index, not {value!r}: the model's labels are "
                             f"{list(labels)}.")  # fmt: skip
        count = self.spec.head.out_proj.weight.shape[0]  # a linear read-out's rows (DeiT's averaged two heads too)
        if not 0 <= value < count:
            raise ValueError(f"Label index {value} is outside the model's {count} labels.")
        return value

    # ----- outputs -----

    def present(self, batch: EncoderBatch, result, row: int):
        """One text's sequence from the method's ``(B, [slots,] T, T)`` scores, whose rows are positions: its explained
        rows over its tokens; a logit method's logit and terms as step scores, a map method's whole map as
        ``encoder_self_scores``."""
        cells = batch.explained[row]
        length = int(batch.inputs["attention_mask"][row].sum())
        signed = isinstance(result, LogitScores)
        steps = logit_step_scores(result, batch.foil_ids is not None) if signed else {}
        sequence_scores = {}
        if not signed:
            sequence_scores["encoder_self_scores"] = tokens_first(result.target[row][..., :length, :length])
        return sequence_output(
            self.row_tokens(batch, row, slice(length)),
            self.explained_tokens(batch, row, cells),
            tokens_first(result.target[row][..., cells, :length]),
            signed=signed,
            step_scores=row_steps(steps, row, cells),
            sequence_scores=sequence_scores,
        )

    def output_logits(self, batch: EncoderBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's logits at every position (a classifier's: the first token's are its own) and the targets."""
        return batch.logits, batch.target_ids

    def source_words(self, sequence, text: str) -> list[int]:
        """Each source token's word of ``text`` (the tokenizer's offsets: :func:`.words.token_words`)."""
        return token_words(self.tokenizer, text, [token.id for token in sequence.source])

    def row_tokens(self, batch: EncoderBatch, row: int, cells) -> list:
        """The tokens of one row's ``cells`` (a slice or indices)."""
        return self._tokens(batch.inputs["input_ids"][row, cells])

    def _tokens(self, ids: torch.Tensor) -> list:
        ids = ids.tolist()
        return token_list(self.tokenizer.convert_ids_to_tokens(ids), ids)

    def explained_tokens(self, batch: EncoderBatch, row: int, cells: list[int]) -> list:
        """One entry per explained position: the target token (masked LM), the label's name (classifiers), or the
        position's own token (bare encoders)."""
        own = batch.inputs["input_ids"][row, cells]
        if self.task is None or (self.task == "masked_lm" and bool((own != self.tokenizer.mask_token_id).any())):
            return self._tokens(own)  # a bare encoder's rows, or a map method's rows of a text without a mask
        ids = batch.target_ids[row, cells].tolist()
        if self.task == "masked_lm":
            names = self.tokenizer.convert_ids_to_tokens(ids)
        else:
            labels = getattr(self.model.config, "id2label", None) or {}
            names = [str(labels.get(idx, idx)) for idx in ids]
        if self.task == "token_classification":
            words = self.tokenizer.convert_ids_to_tokens(batch.inputs["input_ids"][row, cells].tolist())
            names = [f"{word}→{name}" for word, name in zip(words, names, strict=True)]
        return token_list(names, ids)

    # ----- gradient baselines -----

    def _gradient_sequences(self, batch: EncoderBatch, baselines=None, return_convergence_delta: bool = False,
                            abs: bool = True, **captum_options) -> list:  # noqa: A002  (Captum's name)  # fmt: skip
        """Captum's method on the input embeddings, per explained position (summed over the embedding), with
        Captum's options (:data:`GRADIENT_OPTIONS`; integrated gradients: 50 steps unless ``n_steps`` says)."""
        import captum.attr

        classes = {"integrated_gradients": captum.attr.IntegratedGradients, "deeplift": captum.attr.DeepLift,
                   "saliency": captum.attr.Saliency, "input_x_gradient": captum.attr.InputXGradient}  # fmt: skip
        inputs = batch.inputs
        embeds = self.input_embeddings(batch)
        baseline = self.baseline(baselines, embeds)
        if self.method == "integrated_gradients":
            captum_options.setdefault("n_steps", 50)
        sequences = []
        for row, cells in enumerate(batch.explained):
            length = int(inputs["attention_mask"][row].sum())
            columns, logits, deltas = [], [], []
            for cell in cells:
                target = int(batch.target_ids[row, cell])
                foil = None if batch.foil_ids is None else int(batch.foil_ids[row, cell])
                model = self.explained_logit(batch, row, cell, target, foil)
                method = classes[self.method](model if self.method == "deeplift" else model.forward)
                kwargs = dict(captum_options)
                if baseline is not None:
                    kwargs["baselines"] = baseline if baseline.dim() == 0 else baseline[row : row + 1]
                if return_convergence_delta:
                    kwargs["return_convergence_delta"] = True
                with torch.enable_grad():
                    scores = method.attribute(embeds[row : row + 1].requires_grad_(True), **kwargs)
                if return_convergence_delta:
                    scores, delta = scores
                    deltas.append(float(delta.reshape(-1)[0]))
                if self.method == "saliency" and abs:
                    scores = scores.abs()
                columns.append(upcast(scores[0, :length].sum(-1).detach()).cpu())
                with torch.no_grad():
                    logits.append(float(model.forward(embeds[row : row + 1])))
            name = "contrast_logits_diff" if batch.foil_ids is not None else "logit"
            steps = {name: torch.tensor(logits)}
            if return_convergence_delta:
                steps["convergence_delta"] = torch.tensor(deltas)
            sequences.append(
                sequence_output(
                    self.row_tokens(batch, row, slice(length)),
                    self.explained_tokens(batch, row, cells),
                    torch.stack(columns, dim=1),
                    signed=True,
                    step_scores=steps,
                )
            )
        return sequences

    def input_embeddings(self, batch: EncoderBatch) -> torch.Tensor:
        """What the gradient baselines attribute: the input embeddings ``(B, T, D)`` (detached)."""
        return self.model.get_input_embeddings()(batch.inputs["input_ids"]).detach()

    def explained_logit(self, batch: EncoderBatch, row: int, cell: int, target: int, foil: int | None) -> nn.Module:
        """The explained logit of one row's position ``cell`` (minus the foil's) as a module of the input embeddings
        of that row (Captum's forward function)."""
        others = {name: value[row : row + 1] for name, value in batch.inputs.items() if name != "input_ids"}
        return _ExplainedLogit(self.model, self.task, others, cell, target, foil)

    def baseline(self, baselines, embeds: torch.Tensor) -> torch.Tensor | None:
        """Captum's ``baselines`` on the input embeddings ``(B, T, D)``: None (zeros), a number, a token (its
        embedding at every position), or a tensor broadcastable to ``(T, D)``."""
        if baselines is None:
            return None
        if isinstance(baselines, str):
            idx = self.tokenizer.convert_tokens_to_ids(baselines)
            if idx is None or (idx == self.tokenizer.unk_token_id and baselines != self.tokenizer.unk_token):
                raise ValueError(
                    f"baselines={baselines!r} is not a token of this tokenizer (e.g. its mask or pad token)."
                )
            token = torch.tensor([idx], device=embeds.device)
            return self.model.get_input_embeddings()(token).detach().expand_as(embeds)
        if isinstance(baselines, int | float):
            return torch.tensor(float(baselines), dtype=embeds.dtype, device=embeds.device)
        baselines = torch.as_tensor(baselines, dtype=embeds.dtype, device=embeds.device)
        try:
            return baselines.expand_as(embeds)
        except RuntimeError:
            raise ValueError(
                f"baselines of shape {tuple(baselines.shape)} does not broadcast to the embeddings (tokens, "
                f"{embeds.shape[-1]}): give a number, a token, or a tensor of shape ({embeds.shape[-1]},)."
            ) from None


class _ExplainedLogit(nn.Module):
    """The explained logit (minus the foil's) as a function of the input embeddings: what Captum attributes."""

    def __init__(self, model, task, others: dict, cell: int, target: int, foil: int | None):
        super().__init__()
        self.model, self.task, self.others = model, task, others
        self.cell, self.target, self.foil = cell, target, foil

    def forward(self, embeds: torch.Tensor) -> torch.Tensor:
        others = {name: value.expand(embeds.shape[0], *value.shape[1:]) for name, value in self.others.items()}
        logits = self.model(inputs_embeds=embeds, **others).logits
        if logits.dim() == 3:
            logits = logits[:, self.cell]
        return logits[:, self.target] - (0 if self.foil is None else logits[:, self.foil])


def load_saved(name: str, config, tokenizer, processor):
    """An encoder-only model saved under ``name``, as the class it was saved as when that is one of its heads (else the
    bare encoder), with its tokenizer when not given (the encoder kind's loader)."""
    import transformers

    from ..specs.encoder_heads import TASK_ALIASES, TASK_SUFFIXES

    tokenizer = tokenizer or transformers.AutoTokenizer.from_pretrained(name)
    return saved_model(name, config, (*TASK_SUFFIXES.values(), *TASK_ALIASES)), tokenizer, processor


def _number(text: str) -> int | float | None:
    """A text that writes a number (``"2"``, ``"2.0"``) as that number (an integral one as an ``int``), else None."""
    try:
        number = float(text)
    except ValueError:
        return None
    return int(number) if number.is_integer() else number


def per_text(values, count: int, what: str) -> list:
    """``targets`` / ``foils`` as one entry per text. With one text the value may be given unwrapped: ``"cat"``, or
    ``["cat", "dog"]`` for two masks (``[["cat", "dog"]]`` is the wrapped form)."""
    if values is None:
        return [None] * count
    if count == 1:
        wrapped = isinstance(values, list | tuple) and len(values) == 1 and isinstance(values[0], list | tuple | None)
        return [values[0]] if wrapped else [values]
    if isinstance(values, str | int | float) or len(values) != count:
        raise ValueError(f"{what} must have one entry per text ({count}), not {values!r}.")
    return list(values)


def per_text_positions(positions, count: int) -> list:
    if positions is None:
        return [None] * count
    if positions and all(isinstance(value, int) for value in positions):
        return [list(positions)] * count
    positions = list(positions)
    if len(positions) != count:
        raise ValueError(f"positions has {len(positions)} lists for {count} texts: give one list per text.")
    return positions
