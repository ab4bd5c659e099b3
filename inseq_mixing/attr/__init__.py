"""Thin Inseq glue: one ``FeatureAttribution`` subclass per method, turning score tensors into Inseq outputs."""

from .alti import AltiAttribution, AltiLogitAttribution
from .attn_lrp import AttnLrpAttribution
from .base import ContextMixingAttribution, MixingSequenceOutput, MixingStepOutput, SignedMixingSequenceOutput
from .decompx import DecompXAttribution
from .norm_based import AttentionNormAttribution, AttentionRolloutAttribution, GlobEncAttribution
from .value_zeroing import ValueZeroingAttribution

__all__ = [
    "AltiAttribution",
    "AltiLogitAttribution",
    "AttnLrpAttribution",
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
