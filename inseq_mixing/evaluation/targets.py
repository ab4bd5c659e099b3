"""Which token(s) of a target word are explained, and the rows that cannot be explained.

The ALTI-logit paper's convention (its released code): a target or foil of several tokens (``grocery store``, a rare
word split into subwords) is explained by the first token of ``" " + word``; the explained logit is that token's at the
position after the prefix, and an item whose target and foil share that token is skipped (and counted). This is
``target_tokens="first"``, the default: the forced target side is the prefix followed by that one token, so the
contrast with a foil is one logit difference at one position.

``target_tokens="whole"`` explains every token of the target word(s), each at its own position (teacher-forced on
the earlier ones), and sums their scores. For logit methods this explains ``Σ_k logit(w_k | prefix, w_<k)``, a sum of
logits of different predictions, which is not the logit (nor the log-probability) of the word; with a foil, the foil
must have as many tokens and each position contrasts one target token with one foil token. For map methods it sums
the explained rows.

Rows skipped here, with their reason: the target has no token, maps to the unknown token (its logit is not the
word's), starts with a lone word-start marker, or is tokenized differently after the prefix than alone; target and
foil coincide on the explained token(s); ``whole`` with a foil of another length. Context words mapped (in part) to the
unknown token keep their scores and are recorded in :attr:`.items.Item.unknown`.
"""

from .items import Item, Skipped
from .words import WordMappingError, token_words

TARGET_TOKENS = ("first", "whole")


def prepare_targets(
    tokenizer, items: list[Item], encoder_decoder: bool, target_tokens: str = "first"
) -> tuple[list[Item], list[Skipped]]:
    """Rewrite each item's ``target`` (and ``foil``) as the text of the token(s) it explains, per the convention of
    the module docstring, and record its unknown context words.

    Args:
        tokenizer: The model's (fast) tokenizer.
        items: Items of the ``evidence`` or ``cue`` protocol.
        encoder_decoder: Whether targets are tokenized as an encoder–decoder's targets.
        target_tokens: ``"first"`` or ``"whole"``.

    Returns:
        The items that can be explained (the same objects, rewritten) and the skipped rows.
    """
    if target_tokens not in TARGET_TOKENS:
        raise ValueError(f"target_tokens must be one of {TARGET_TOKENS}, not {target_tokens!r}.")
    kept, skipped = [], []
    for item in items:
        try:
            _prepare(tokenizer, item, encoder_decoder, target_tokens)
        except _Skip as skip:
            skipped.append(Skipped(item.row, f"Row {item.row}: {skip.reason}", skip.kind))
            continue
        kept.append(item)
    return kept, skipped


class _Skip(Exception):
    def __init__(self, reason: str, kind: str = "not explainable"):
        super().__init__(reason)
        self.reason, self.kind = reason, kind


def _ids(tokenizer, text: str, encoder_decoder: bool, special: bool) -> list[int]:
    kwargs = {"text_target": text} if encoder_decoder else {"text": text}
    return list(tokenizer(**kwargs, add_special_tokens=special)["input_ids"])


def _piece(tokenizer, token_ids: list[int]) -> str:
    return tokenizer.decode(token_ids).strip()


def _prepare(tokenizer, item: Item, encoder_decoder: bool, target_tokens: str) -> None:
    target_ids = _ids(tokenizer, " " + item.word, encoder_decoder, special=False)
    if not target_ids:
        raise _Skip(f"the target {item.word!r} has no token")
    if tokenizer.unk_token_id is not None and target_ids[0] == tokenizer.unk_token_id:
        raise _Skip(f"the target {item.word!r} maps to the unknown token, whose logit is not the word's", "unknown")
    explained = target_ids[:1] if target_tokens == "first" else target_ids
    if target_tokens == "first" and not _piece(tokenizer, explained):
        raise _Skip(
            f"the first token of ' {item.word}' is a lone word-start marker "
            f"{tokenizer.convert_ids_to_tokens(explained)}, not a piece of the word (use target_tokens='whole' to "
            "explain every token)"
        )
    foil_ids = None
    if item.foil_word is not None:
        foil_ids = _ids(tokenizer, " " + item.foil_word, encoder_decoder, special=False)
        foil_ids = foil_ids[:1] if target_tokens == "first" else foil_ids
        if foil_ids == explained:
            which = "first token" if target_tokens == "first" else "tokens"
            raise _Skip(
                f"the target {item.word!r} and the foil {item.foil_word!r} share their {which} "
                f"{tokenizer.convert_ids_to_tokens(explained)}: there is no contrast to explain",
                "target equals foil",
            )
        if len(foil_ids) != len(explained):
            raise _Skip(
                f"target_tokens='whole' contrasts token by token, and the target {item.word!r} has "
                f"{len(explained)} tokens where the foil {item.foil_word!r} has {len(foil_ids)}"
            )
    item.target = _piece(tokenizer, explained) if target_tokens == "first" else item.word
    item.foil = None if foil_ids is None else (_piece(tokenizer, foil_ids) if target_tokens == "first" else item.foil)
    _check_in_context(tokenizer, item, item.generated_text, explained, encoder_decoder, "target")
    if item.foil is not None:
        _check_in_context(tokenizer, item, item.contrast_text, foil_ids, encoder_decoder, "foil")
    item.unknown = unknown_words(tokenizer, item, encoder_decoder)


def _check_in_context(tokenizer, item: Item, text: str, expected: list[int], encoder_decoder: bool, role: str):
    """The explained token(s), tokenized after the prefix as the model will see them, are those of the word alone."""
    ids = _ids(tokenizer, text, encoder_decoder, special=True)
    try:
        words = token_words(tokenizer, text, ids, as_target=encoder_decoder)
    except WordMappingError as error:
        raise _Skip(str(error)) from error
    first_word = len(item.prefix.split())
    found = [token for token, word in zip(ids, words, strict=True) if word >= first_word]
    if found != expected:
        word = item.word if role == "target" else item.foil_word
        in_context, alone = tokenizer.convert_ids_to_tokens(found), tokenizer.convert_ids_to_tokens(expected)
        raise _Skip(
            f"the {role} {word!r} is tokenized {in_context} after the prefix but {alone} alone (the paper's "
            "convention explains the token of the word alone)"
        )


def unknown_words(tokenizer, item: Item, encoder_decoder: bool) -> list[int]:
    """Context word indices (source words, then prefix words) with a token mapped to the unknown token."""
    unk = tokenizer.unk_token_id
    if unk is None:
        return []
    found = []
    offset = 0
    for text, as_target in ((item.source, False), (item.prefix, encoder_decoder)):
        if not text:
            continue
        ids = _ids(tokenizer, text, as_target, special=True)
        words = token_words(tokenizer, text, ids, as_target=as_target)
        found.extend(sorted({offset + word for token, word in zip(ids, words, strict=True) if token == unk}))
        offset += len(text.split())
    return found
