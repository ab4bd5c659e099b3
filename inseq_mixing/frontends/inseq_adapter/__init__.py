"""Thin Inseq glue: one ``FeatureAttribution`` subclass per method, generated from its declaration by
:mod:`.adapter`, turning the declared method's results into Inseq outputs."""

from .adapter import ATTRIBUTION_CLASSES
from .base import ContextMixingAttribution, MixingSequenceOutput, MixingStepOutput, SignedMixingSequenceOutput

AltiAttribution = ATTRIBUTION_CLASSES["alti"]
AltiLogitAttribution = ATTRIBUTION_CLASSES["alti_logit"]
AttnLrpAttribution = ATTRIBUTION_CLASSES["attn_lrp"]
AttentionNormAttribution = ATTRIBUTION_CLASSES["attention_norm"]
AttentionRolloutAttribution = ATTRIBUTION_CLASSES["attention_rollout"]
DecompXAttribution = ATTRIBUTION_CLASSES["decompx"]
GlobEncAttribution = ATTRIBUTION_CLASSES["globenc"]
ValueZeroingAttribution = ATTRIBUTION_CLASSES["value_zeroing"]

__all__ = [
    "ATTRIBUTION_CLASSES",
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
