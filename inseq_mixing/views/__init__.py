"""Views: comparing methods, faithfulness metrics (this layer may use Inseq)."""

from .compare import Comparison, compare
from .faithfulness import faithfulness, rank_correlation

__all__ = ["Comparison", "compare", "faithfulness", "rank_correlation"]
