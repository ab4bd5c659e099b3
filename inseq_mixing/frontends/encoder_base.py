"""What every encoder-only front end shares, whatever its input: one forward pass over a sequence of units, rows of the
token-to-token maps, and a read-out (a classifier's logits, a masked LM's, an image–text similarity) whose entries are
explained.

:class:`EncoderFrontEnd` knows no tokenizer and no processor. A modality is a subclass that fills the hooks below
through their public names (:class:`~.encoders.EncoderAttributionModel` for text, :class:`~.vision.
VisionAttributionModel` for images):

- its items and how each is checked (:meth:`items`, :meth:`validate`, :meth:`input_sizes`, :meth:`info_entries`);
- :meth:`prepare`: the inputs encoded and traced, ending in :meth:`finish_batch`;
- what is explained in one input (:meth:`explained_positions`) and what an entry is called (:meth:`row_tokens`,
  :meth:`explained_tokens`, :meth:`output_index` for a target given by name);
- the gradient baselines' inputs (:meth:`input_embeddings`, :meth:`explained_logit`, :meth:`baseline`).

The rest is here, once: foils, options, which entries are explained and the outputs there, the layout of one row's
scores, Captum's gradient baselines, a dataset run's hooks. No math: the methods are the declarations' ``compute``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..declarations import DECLARATIONS, Request
from ..methods.blocks import upcast
from ..methods.results import LogitScores
from ..specs import get_spec
from .common import GRADIENT_METHODS, FrontEndModel, captum_method
from .layout import logit_step_scores, row_steps, sequence_output, token_list, tokens_first


@dataclass
class EncoderBatch:
    """One batch of inputs encoded, with what is explained in each and the method's request (None for the gradient
    baselines). ``texts`` name the inputs (a text front end: the texts themselves); ``inputs`` hold the ``(B, T)``
    ``input_ids`` (token indices; an image's: its positions) and ``attention_mask``, and what the model reads."""

    texts: list[str]
    inputs: dict
    positions: torch.Tensor  # (B, T) booleans
    explained: list[list[int]]  # per input, the explained positions in order
    target_ids: torch.Tensor  # (B, T) output index explained at each position
    foil_ids: torch.Tensor | None
    logits: torch.Tensor | None = None  # (B, T, outputs): the head's at every position, None for a bare encoder
    request: Request | None = None

    @property
    def size(self) -> int:
        return len(self.texts)


class EncoderFrontEnd(FrontEndModel):
    """An encoder-only model of any input modality, with one attribution method (see the module docstring).

    Args:
        model: An encoder-only Hugging Face model of a supported family.
        method: The method's name (a declared method or one of :data:`GRADIENT_METHODS`).
    """

    #: What to do when a logit method meets a model without a read-out (a bare encoder).
    NO_HEAD = "load the model with a head"
    #: Why a foil is refused for a map method.
    NO_FOILS = None

    def __init__(self, model: nn.Module, method: str):
        self.model, self.method = model, method
        self.spec = get_spec(model)
        if not self.spec.is_encoder_only:
            raise ValueError(f"{type(model).__name__} is not an encoder-only model: use inseq.load_model for it.")
        self.task = self.model_task()
        if method not in DECLARATIONS and method not in GRADIENT_METHODS:
            names = [*DECLARATIONS, *GRADIENT_METHODS]
            raise ValueError(f"Unknown method {method!r} for encoder-only models: use one of {names}.")
        self.declaration = DECLARATIONS.get(method)
        if self.explains_logit and self.task is None:
            raise ValueError(
                f"{method} explains a logit, and {type(model).__name__} is a bare encoder: {self.NO_HEAD}, or use a "
                "map method (alti, value_zeroing, attention_rollout, attention_norm, globenc)."
            )

    @property
    def explains_logit(self) -> bool:
        """Whether the method explains a logit (a gradient baseline does), rather than giving maps."""
        return self.declaration is None or self.declaration.explains_logit

    # ----- what a modality fills -----

    def for_method(self, method: str) -> EncoderFrontEnd:
        """The same model and companion (tokenizer, processor) with another method."""
        raise NotImplementedError

    def model_task(self) -> str | None:
        """The read-out's task (``masked_lm``, ``sequence_classification``, ``token_classification``), None for a
        bare encoder."""
        raise NotImplementedError

    def validate(self, inputs, targets=None, foils=None, positions=None, names=None) -> None:
        """Raise the error ``attribute`` would raise for these inputs, without running the model."""
        raise NotImplementedError

    def explained_positions(self, ids, mask, chosen, name: str) -> list[int]:
        """One input's explained positions (its ``ids`` and ``mask`` ``(T,)``, ``positions=`` as given)."""
        raise NotImplementedError

    def row_tokens(self, batch: EncoderBatch, row: int, cells) -> list:
        """The units of one row's ``cells`` (a slice or indices), as Inseq tokens."""
        raise NotImplementedError

    def input_embeddings(self, batch: EncoderBatch) -> torch.Tensor:
        """What the gradient baselines attribute: the embeddings the first block reads ``(B, T, D)`` (detached)."""
        raise NotImplementedError

    def explained_logit(self, batch: EncoderBatch, row: int, cell: int, target: int, foil: int | None) -> nn.Module:
        """The explained logit of one row's position ``cell`` (minus the foil's) as a module of that row's
        embeddings (Captum's forward function)."""
        raise NotImplementedError

    def check_explained(self, ids, row: int, cells: list[int], target, foil, name: str) -> None:
        """Refuse a target or foil the row's explained positions cannot take (nothing here)."""

    # ----- options, foils, a dataset run -----

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

    def batch_size_for(self, batch_size: int) -> int:
        """One input at a time where transformers' float64 masking of padded rows would put NaN into real positions
        (ModernBERT), else ``batch_size``."""
        if self.spec.float64_padding_nan and next(self.model.parameters()).dtype == torch.float64:
            return 1
        return batch_size

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
        if foils is not None and not self.explains_logit:
            raise ValueError(
                f"{self.method} gives context-mixing maps, which have no contrastive form: foils= (contrast_targets=) "
                "applies to the logit methods (alti_logit, decompx, attn_lrp) and the gradient baselines."
            )
        return foils

    def info_entries(self, items: list, settings=None) -> dict:
        """The output's ``info`` entries every modality shares (a modality's own come before): what is explained
        (each item's ``foil`` read)."""
        return {"attributed_fn": self.explained_quantity([item.foil for item in items])}

    def explained_quantity(self, foils) -> str:
        """What is explained (``info["attributed_fn"]``)."""
        if not self.explains_logit:
            return f"{self.method} map: context mixing into each explained position"
        return "contrast_logits_diff" if any(foil is not None for foil in foils) else "logit"

    # ----- what is explained -----

    def explained_cells(self, inputs: dict, positions: list, names: list[str]) -> list[list[int]]:
        """Per input, its explained positions (:meth:`explained_positions`)."""
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        return [self.explained_positions(ids[row], mask[row], positions[row], names[row]) for row in range(len(ids))]

    @staticmethod
    def chosen_positions(chosen, length: int, name: str, what: str = "tokens") -> list[int]:
        """``positions=`` of one input of ``length`` units as indices, each checked to lie inside it."""
        cells = [int(cell) for cell in chosen]
        bad = [cell for cell in cells if not 0 <= cell < length]
        if bad:
            raise ValueError(f"{name} has {length} {what}: positions {bad} are outside it.")
        return cells

    def output_ids(self, ids, explained, targets, foils, predictions, names: list[str]):
        """The explained output at every position ``(B, T)`` (``predictions`` where no target is given) and the
        foils', or None without foils."""
        target_ids = predictions.clone()
        foil_ids = None if all(foil is None for foil in foils) else torch.zeros_like(ids)
        for row, cells in enumerate(explained):
            self.check_explained(ids, row, cells, targets[row], foils[row], names[row])
            self._fill(target_ids, row, cells, targets[row], "targets", names[row])
            if foil_ids is not None:
                if foils[row] is None:
                    raise ValueError(f"{names[row]} has no foil: give one foil per {self.item_name}, or none at all.")
                self._fill(foil_ids, row, cells, foils[row], "foils", names[row])
        return target_ids, foil_ids

    def _fill(self, ids: torch.Tensor, row: int, cells: list[int], given, what: str, name: str) -> None:
        """Write the given targets (or foils) of one input into ``ids`` at its explained cells."""
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
        """The output row of a target or foil: a label's index (given as its name, or as a whole number)."""
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

    def finish_batch(self, names: list[str], inputs: dict, explained: list[list[int]], targets: list, foils: list,
                     trace, caller=None) -> EncoderBatch:  # fmt: skip
        """The end of every :meth:`prepare`: the explained outputs found from the traced logits (the predictions
        where no target is given), and the declared method's request over the trace (``caller``: how the method
        re-runs the model, where it is not called on ``input_ids``)."""
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        where = torch.zeros_like(mask, dtype=torch.bool)
        for row, cells in enumerate(explained):
            where[row, cells] = True
        no_rows = trace.logits is None or trace.logits.shape[-1] == 0  # a bare encoder; CLIP's maps, with no text
        predictions = torch.zeros_like(ids) if no_rows else trace.logits.argmax(-1)
        target_ids, foil_ids = self.output_ids(ids, explained, targets, foils, predictions, names)
        batch = EncoderBatch(names, inputs, where, explained, target_ids, foil_ids, trace.logits)
        if self.declaration is not None:
            batch.request = Request(spec=self.spec, model=self.model, attention_mask=mask,
                                    target_ids=None, target_mask=None, predicted_ids=target_ids, foil_ids=foil_ids,
                                    positions=where, tracer=lambda: trace, caller=caller)  # fmt: skip
        return batch

    # ----- outputs -----

    def explain(self, batch: EncoderBatch, options: dict) -> tuple[list, list[str] | None]:
        """The declared method (:meth:`FrontEndModel.explain`), or a gradient baseline through Captum."""
        if self.declaration is None:
            return self._gradient_sequences(batch, **options), None
        return super().explain(batch, options)

    def present(self, batch: EncoderBatch, result, row: int):
        """One input's sequence from the method's ``(B, [slots,] T, T)`` scores, whose rows are positions: its
        explained rows over its units; a logit method's logit and terms as step scores, a map method's whole map as
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

    def explained_tokens(self, batch: EncoderBatch, row: int, cells: list[int]) -> list:
        """One entry per explained position: the label's name (or index, for a model without names)."""
        ids = batch.target_ids[row, cells].tolist()
        labels = getattr(self.model.config, "id2label", None) or {}
        return token_list([str(labels.get(idx, idx)) for idx in ids], ids)

    # ----- gradient baselines -----

    def _gradient_sequences(self, batch: EncoderBatch, baselines=None, return_convergence_delta: bool = False,
                            abs: bool = True, **captum_options) -> list:  # noqa: A002  (Captum's name)  # fmt: skip
        """Captum's method on the input embeddings, per explained position (summed over the embedding), with
        Captum's options (:data:`GRADIENT_OPTIONS`; integrated gradients: 50 steps unless ``n_steps`` says)."""
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
                method = captum_method(self.method, model)
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

    def baseline(self, baselines, embeds: torch.Tensor) -> torch.Tensor | None:
        """Captum's ``baselines`` on the input embeddings ``(B, T, D)``: None (zeros), a number, or a tensor
        broadcastable to ``(T, D)``."""
        if baselines is None:
            return None
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


def _number(text: str) -> int | float | None:
    """A text that writes a number (``"2"``, ``"2.0"``) as that number (an integral one as an ``int``), else None."""
    try:
        number = float(text)
    except ValueError:
        return None
    return int(number) if number.is_integer() else number


def per_text(values, count: int, what: str) -> list:
    """``targets`` / ``foils`` as one entry per input. With one input the value may be given unwrapped: ``"cat"``, or
    ``["cat", "dog"]`` for two masks (``[["cat", "dog"]]`` is the wrapped form)."""
    if values is None:
        return [None] * count
    if count == 1:
        wrapped = isinstance(values, list | tuple) and len(values) == 1 and isinstance(values[0], list | tuple | None)
        return [values[0]] if wrapped else [values]
    if isinstance(values, str | int | float) or len(values) != count:
        raise ValueError(f"{what} must have one entry per input ({count}), not {values!r}.")
    return list(values)


def per_text_positions(positions, count: int) -> list:
    """``positions=`` as one list per input (one list of indices applies to every input)."""
    if positions is None:
        return [None] * count
    if positions and all(isinstance(value, int) for value in positions):
        return [list(positions)] * count
    positions = list(positions)
    if len(positions) != count:
        raise ValueError(f"positions has {len(positions)} lists for {count} inputs: give one list per input.")
    return positions
