"""Shared Inseq glue for the plugin's final-step methods: read Inseq's step arguments, trace, wrap outputs."""

from dataclasses import dataclass
from typing import Any

import torch
from inseq.attr.feat.feature_attribution import FeatureAttribution
from inseq.data import MultiDimensionalFeatureAttributionStepOutput
from inseq.data.attribution import MultiDimensionalFeatureAttributionSequenceOutput
from inseq.utils import Registry

from ..specs import get_spec
from ..trace import ModelTrace, trace_model


@dataclass(eq=False, repr=False)
class MixingSequenceOutput(MultiDimensionalFeatureAttributionSequenceOutput):
    """Sequence output that recovers its number of extra dimensions after ``FeatureAttributionOutput.load``.

    Inseq does not save private fields, so a loaded multi-dimensional output would lose its aggregator and render as
    a tree instead of a heatmap. The count is the number of axes beyond (attributed tokens, generated tokens).
    """

    def _recover_from_safetensors(self):
        super()._recover_from_safetensors()
        scores = self.source_attributions if self.source_attributions is not None else self.target_attributions
        if not self._num_dimensions and scores is not None:
            self._num_dimensions = scores.ndim - 2
            self._aggregator = ["mean"] * self._num_dimensions
        return self


@dataclass(eq=False, repr=False)
class MixingStepOutput(MultiDimensionalFeatureAttributionStepOutput):
    """Step output producing :class:`MixingSequenceOutput` sequences."""

    _sequence_cls: type = MixingSequenceOutput

    def get_sequence_cls(self, **kwargs):
        return MixingSequenceOutput(_num_dimensions=self._num_dimensions, **kwargs)


@dataclass
class StepInputs:
    """The token ids of one Inseq final step.

    Attributes:
        input_ids: Source ids (encoder–decoders) or the whole sequence (decoder-only), ``(B, S)``.
        attention_mask: Mask of ``input_ids``.
        target_ids: Decoder input prefix of encoder–decoders ``(B, T)``, or None.
        target_mask: Mask of ``target_ids``.
        next_ids: The token predicted at the last position ``(B,)``.
        attribute_target: Whether Inseq asked for target-side attributions.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    target_ids: torch.Tensor | None
    target_mask: torch.Tensor | None
    next_ids: torch.Tensor
    attribute_target: bool


def read_step_inputs(inputs: tuple, additional_forward_args: tuple, is_encoder_decoder: bool) -> StepInputs:
    """Unpack Inseq's ``(inputs, additional_forward_args)`` layout (see Inseq's ``format_attribution_args``)."""
    if is_encoder_decoder:
        attribute_target = len(inputs) > 1
        args = additional_forward_args[0 if attribute_target else 1 :]
        source_ids, target_ids, next_ids, _, source_mask, target_mask = args[:6]
        return StepInputs(source_ids, source_mask, target_ids, target_mask, next_ids.reshape(-1), attribute_target)
    input_ids, next_ids, _, mask = additional_forward_args[:4]
    return StepInputs(input_ids, mask, None, None, next_ids.reshape(-1), True)


class ContextMixingAttribution(FeatureAttribution, Registry):
    """Base of the plugin's methods: final-step methods that trace the model once on the full target.

    Subclasses set ``method_name`` and ``self.method`` (an object whose ``attribute`` signature declares the
    user-facing keyword arguments, which is how Inseq routes ``model.attribute(..., kw=...)``).
    """

    def __init__(self, attribution_model, **kwargs):
        super().__init__(attribution_model, hook_to_model=False)
        self.spec = get_spec(attribution_model.model)
        self.use_predicted_target = False
        self.is_final_step_method = True
        self.hook(**kwargs)

    def trace(self, steps: StepInputs) -> ModelTrace:
        """One forward pass of the wrapped model on the step's ids."""
        return trace_model(
            self.attribution_model.model,
            steps.input_ids,
            steps.attention_mask,
            steps.target_ids,
            steps.target_mask,
            spec=self.spec,
        )

    def attribute_step(
        self, attribute_fn_main_args: dict[str, Any], attribution_args: dict[str, Any] | None = None
    ) -> MixingStepOutput:
        return self.method.attribute(**attribute_fn_main_args, **(attribution_args or {}))


def inseq_layout(scores: torch.Tensor, causal: bool) -> torch.Tensor:
    """``(B, [L,] positions i, tokens j)`` → Inseq's ``(B, tokens j, positions i[, L])``.

    Causal maps get NaN where ``j > i``, Inseq's mark of causally impossible cells.
    """
    if scores.ndim == 4:
        scores = scores.permute(0, 3, 2, 1)
    else:
        scores = scores.transpose(1, 2)
    scores = scores.detach().float().cpu().clone()
    if causal:
        future = torch.ones(scores.shape[1:3], dtype=torch.bool).tril(-1)  # rows j > columns i
        scores[:, future] = float("nan")
    return scores
