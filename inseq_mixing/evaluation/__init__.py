"""Evaluating attribution methods: comparing methods on a few sentences (faithfulness by AOPC, agreement between
methods), and the papers' protocols on annotated data: evidence MRR (ALTI-logit), cue contribution per layer (Value
Zeroing), alignment error rate (ALTI+), and AOPC faithfulness, over whole datasets, with bootstrap intervals and paired
tests. The reports that show them are in :mod:`inseq_mixing.views`."""

from .compare import compare
from .comparison import Comparison
from .evaluate import evaluate
from .faithfulness import faithfulness, rank_correlation
from .items import DEFAULT_COLUMNS, PROTOCOLS, EvaluationInputError, Item, read_items
from .scores import METRICS, Evaluation, MethodResult
from .stored import evaluate_run

__all__ = [
    "DEFAULT_COLUMNS",
    "METRICS",
    "PROTOCOLS",
    "Comparison",
    "Evaluation",
    "EvaluationInputError",
    "Item",
    "MethodResult",
    "compare",
    "evaluate",
    "evaluate_run",
    "faithfulness",
    "rank_correlation",
    "read_items",
]
