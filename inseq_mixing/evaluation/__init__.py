"""Evaluating attribution methods on annotated data with the papers' protocols: evidence MRR (ALTI-logit), cue
contribution per layer (Value Zeroing), alignment error rate (ALTI+), and AOPC faithfulness, over whole datasets,
with bootstrap intervals and paired tests."""

from .evaluate import METRICS, Evaluation, MethodResult, evaluate
from .items import DEFAULT_COLUMNS, PROTOCOLS, EvaluationInputError, Item, read_items

__all__ = [
    "DEFAULT_COLUMNS",
    "METRICS",
    "PROTOCOLS",
    "Evaluation",
    "EvaluationInputError",
    "Item",
    "MethodResult",
    "evaluate",
    "read_items",
]
