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

from ..declarations import InputSize
from ..specs.encoder_heads import model_task
from ..trace import trace_model
from .common import plain, saved_model
from .encoder_base import EncoderBatch, EncoderFrontEnd, per_text, per_text_positions
from .layout import token_list
from .words import token_words

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


class EncoderAttributionModel(EncoderFrontEnd):
    """An encoder-only text model with one attribution method (see the module docstring): the text modality of
    :class:`~.encoder_base.EncoderFrontEnd`.

    Args:
        model: An encoder-only Hugging Face model of a supported family.
        tokenizer: Its tokenizer (with a mask token for masked LMs).
        method: The method's name.
    """

    item_name = "text"
    NO_HEAD = "load the model with a head (...ForMaskedLM, ...ForSequenceClassification or ...ForTokenClassification)"

    def __init__(self, model: nn.Module, tokenizer, method: str):
        self.tokenizer = tokenizer
        super().__init__(model, method)
        if self.task == "masked_lm" and tokenizer.mask_token_id is None:
            raise ValueError("This tokenizer has no mask token: a masked LM explains its mask tokens.")

    def for_method(self, method: str) -> EncoderAttributionModel:
        """The same model and tokenizer with another method."""
        return type(self)(self.model, self.tokenizer, method)

    def model_task(self) -> str | None:
        """The head's task (:func:`~inseq_mixing.specs.encoder_heads.model_task`), None for a bare encoder."""
        return model_task(self.model)

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
            "explained": (EXPLAINED if self.explains_logit else EXPLAINED_BY_MAPS)[self.task],
            **super().info_entries(items, settings),
        }

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

    def check_explained(self, ids, row: int, cells: list[int], target, foil, name: str) -> None:
        """A masked LM's text without a mask token has no word to give a target or foil for."""
        unmasked = self.task == "masked_lm" and not bool((ids[row, cells] == self.tokenizer.mask_token_id).all())
        if unmasked and (target is not None or foil is not None):
            raise ValueError(
                f"{name} has no mask token, so there is no word to give a target or foil for: put "
                f"{self.tokenizer.mask_token} where the word is, or give no target."
            )

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
        return self.finish_batch(texts, inputs, explained, targets, foils, trace)

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
            if self.explains_logit:
                raise ValueError(
                    f"{name} has no mask token: put {self.tokenizer.mask_token} where the word to explain is ("
                    f"{self.method} explains a mask's logit; the map methods also take a text without a mask)."
                )
            # a map method on a text without a mask: its maps, rows of positions= as for a bare encoder
        if self.task == "sequence_classification":
            return [0]
        if chosen is None:
            return list(range(length)) if self.task == "token_classification" else [0]
        return self.chosen_positions(chosen, length, name)

    def output_index(self, value) -> int:
        """The output row of a target or foil: a word's first subword (masked LM), or a label's index."""
        if self.task != "masked_lm":
            return super().output_index(value)
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

    # ----- outputs -----

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
        """One entry per explained position: the target token (masked LM), the label's name (classifiers; a token
        classifier's prefixed with its token), or the position's own token (bare encoders)."""
        own = batch.inputs["input_ids"][row, cells]
        if self.task is None or (self.task == "masked_lm" and bool((own != self.tokenizer.mask_token_id).any())):
            return self._tokens(own)  # a bare encoder's rows, or a map method's rows of a text without a mask
        if self.task == "masked_lm":
            ids = batch.target_ids[row, cells].tolist()
            return token_list(self.tokenizer.convert_ids_to_tokens(ids), ids)
        labels = super().explained_tokens(batch, row, cells)
        if self.task == "token_classification":
            words = self.tokenizer.convert_ids_to_tokens(own.tolist())
            names = [f"{word}→{label.token}" for word, label in zip(words, labels, strict=True)]
            return token_list(names, [label.id for label in labels])
        return labels

    # ----- gradient baselines -----

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
        if not isinstance(baselines, str):
            return super().baseline(baselines, embeds)
        idx = self.tokenizer.convert_tokens_to_ids(baselines)
        if idx is None or (idx == self.tokenizer.unk_token_id and baselines != self.tokenizer.unk_token):
            raise ValueError(f"baselines={baselines!r} is not a token of this tokenizer (e.g. its mask or pad token).")
        token = torch.tensor([idx], device=embeds.device)
        return self.model.get_input_embeddings()(token).detach().expand_as(embeds)


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
