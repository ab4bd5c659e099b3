"""Words of a text (whitespace-separated) and which tokens of an attributed sequence belong to each.

A fast tokenizer's character offsets map every token of a text to the word it starts in; special tokens (``</s>``,
the decoder start token) belong to no word, but the unknown token belongs to the word it stands for, and a mask token
to its own word (the masked word of the encoder protocols). The front ends answer ``source_words`` with it; the
evaluation protocols read words through them.
"""

import re


class WordMappingError(ValueError):
    """The tokens of an attributed sequence cannot be matched with the words of its text."""


def markup_ids(tokenizer) -> set[int]:
    """The ids of the tokenizer's markup: its special tokens (BOS, EOS, padding, chat markers, ...) except the unknown
    token, which stands for a word of the text, and the mask token, which stands for a masked word."""
    kept = {tokenizer.unk_token_id, getattr(tokenizer, "mask_token_id", None)}
    return set(tokenizer.all_special_ids) - kept


def word_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the whitespace-separated words of ``text``."""
    return [match.span() for match in re.finditer(r"\S+", text)]


def token_words(tokenizer, text: str, token_ids: list[int], as_target: bool = False) -> list[int]:
    """For each of ``token_ids`` (an attributed sequence's tokens of ``text``), the index of its word in ``text``, or
    -1 for special and padding tokens.

    Args:
        tokenizer: A fast (offset-giving) Hugging Face tokenizer.
        text: The text the sequence was tokenized from.
        token_ids: The sequence's token ids, possibly with tokens before the text's own (a decoder start token).
        as_target: Tokenize ``text`` as a target (``text_target``), as Inseq does for encoder–decoder targets.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise WordMappingError(
            "Word-level evaluation needs a fast tokenizer (one with character offsets): load it with use_fast=True."
        )
    kwargs = {"text_target": text} if as_target else {"text": text}
    encoding = tokenizer(**kwargs, return_offsets_mapping=True)
    ids, offsets = list(encoding["input_ids"]), encoding["offset_mapping"]
    start = _find(token_ids, ids)
    if start is None:
        start = _find(token_ids, ids[: len(ids) - 1]) if ids else None  # a trailing special token not attributed
        ids, offsets = ids[: len(ids) - 1], offsets[: len(offsets) - 1]
    if start is None:
        raise WordMappingError(f"The attributed tokens do not match the tokenization of {text!r}.")
    spans = word_spans(text)
    words = [-1] * len(token_ids)
    special = markup_ids(tokenizer)  # unknown words keep their tokens' scores, a masked word its mask token's
    for offset, (token_id, (begin, end)) in enumerate(zip(ids, offsets, strict=True)):
        if token_id in special or end <= begin:
            continue
        words[start + offset] = _word_at(spans, begin, end)
    return words


def _find(haystack: list[int], needle: list[int]) -> int | None:
    """First index where ``needle`` occurs in ``haystack`` as a contiguous run; a negative id in ``haystack`` (Inseq's
    id of a contrastive token, shown as ``foil → target``) matches anything."""
    for start in range(len(haystack) - len(needle) + 1):
        window = haystack[start : start + len(needle)]
        if all(have == want or have < 0 for have, want in zip(window, needle, strict=True)):
            return start
    return None


def _word_at(spans: list[tuple[int, int]], begin: int, end: int) -> int:
    """The word the token span ``[begin, end)`` overlaps first; a token of whitespace only (SentencePiece's lone
    word-start marker) belongs to the word after it; -1 after the last word."""
    for index, (word_begin, word_end) in enumerate(spans):
        if word_begin < end and begin < word_end:
            return index
    return next((index for index, (word_begin, _) in enumerate(spans) if word_begin >= end), -1)
