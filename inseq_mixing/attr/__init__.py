"""Thin Inseq glue: one ``FeatureAttribution`` subclass per method, turning score tensors into Inseq outputs."""

from .base import ContextMixingAttribution, MixingSequenceOutput, MixingStepOutput
from .value_zeroing import ValueZeroingAttribution

__all__ = ["ContextMixingAttribution", "MixingSequenceOutput", "MixingStepOutput", "ValueZeroingAttribution"]
