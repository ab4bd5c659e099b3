"""Word scores from token scores: the protocols work on words, a word's score is the sum of its tokens' scores.

Which token belongs to which word is the front end's to say (:func:`~inseq_mixing.frontends.words.token_words`, and
each front end's ``source_words``); it is re-exported here.
"""

import torch

from ..frontends.words import WordMappingError, token_words, word_spans

__all__ = ["WordMappingError", "token_words", "word_columns", "word_scores", "word_spans"]


def word_scores(scores: torch.Tensor, words: list[int], num_words: int) -> torch.Tensor:
    """Sum token scores ``(tokens, ...)`` into word scores ``(num_words, ...)``; tokens of word -1 are dropped."""
    index = torch.tensor(words, dtype=torch.long)
    keep = (index >= 0) & (index < num_words)
    out = scores.new_zeros(num_words, *scores.shape[1:])
    return out.index_add_(0, index[keep], scores[keep].nan_to_num())


def word_columns(words: list[int], word: int) -> list[int]:
    """Token positions of ``word``."""
    return [position for position, owner in enumerate(words) if owner == word]
