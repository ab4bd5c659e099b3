"""Thin Inseq glue: one ``FeatureAttribution`` subclass per method, turning score tensors into Inseq outputs."""

from .alti import AltiAttribution, AltiLogitAttribution
from .base import ContextMixingAttribution, MixingSequenceOutput, MixingStepOutput, SignedMixingSequenceOutput
from .decompx import DecompXAttribution
from .norm_based import AttentionNormAttribution, AttentionRolloutAttribution, GlobEncAttribution
from .value_zeroing import ValueZeroingAttribution

__all__ = [
    "AltiAttribution",
    "AltiLogitAttribution",
    "AttentionNormAttribution",
    "AttentionRolloutAttribution",
    "GlobEncAttribution",
    "ContextMixingAttribution",
    "DecompXAttribution",
    "MixingSequenceOutput",
    "MixingStepOutput",
    "SignedMixingSequenceOutput",
    "ValueZeroingAttribution",
]
