"""Thin Inseq glue: one ``FeatureAttribution`` subclass per method, generated from its declaration by
:mod:`.adapter`, turning the declared method's results into Inseq outputs. Each class is also a name of this module,
the declaration's :attr:`~inseq_mixing.declarations.Declaration.class_name` (``ValueZeroingAttribution``...)."""

from ..sequences import MixingSequenceOutput, MixingStepOutput, SignedMixingSequenceOutput
from .adapter import ATTRIBUTION_CLASSES
from .base import ContextMixingAttribution

globals().update({cls.__name__: cls for cls in ATTRIBUTION_CLASSES.values()})

__all__ = [  # noqa: PLE0604  (the generated class names come from the declarations)
    "ATTRIBUTION_CLASSES",
    "ContextMixingAttribution",
    "MixingSequenceOutput",
    "MixingStepOutput",
    "SignedMixingSequenceOutput",
    *(cls.__name__ for cls in ATTRIBUTION_CLASSES.values()),
]
