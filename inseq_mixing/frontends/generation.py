"""The generation kind's front end (encoder–decoders and decoder-only models): Inseq's own ``AttributionModel``,
with what a dataset run and the evaluation protocols need around it.

:class:`GenerationFrontEnd` fills the dataset-run hooks of :class:`~.common.FrontEndModel` (:meth:`run_arguments`,
:meth:`check_rows`, :meth:`attribute_rows`) over an Inseq model, so that the runner has one path for every kind and
imports no Inseq. The functions below it are the Inseq glue it uses (and the evaluation protocols with it): the
arguments split into Inseq's and the method's, the generation's length, missing targets generated in batches as
``model.generate`` gives each alone, and a batch attributed in one step of the final-step method.
"""

from __future__ import annotations

import warnings

import torch

from .common import FrontEndModel
from .spans import SPAN_SETTINGS, SpanAttributionModel

#: Arguments of Inseq's ``model.attribute`` that a dataset run accepts besides the method's own options.
INSEQ_ARGUMENTS = ("attribute_target", "attributed_fn", "attr_pos_start", "attr_pos_end", "skip_special_tokens")
#: Arguments that explain spans of each generation over context units (:mod:`inseq_mixing.frontends.spans`), the
#: same for every row: kind names (``spans="sentences"``, ``units="passages"``) or one list for all rows.
SPAN_ARGUMENTS = SPAN_SETTINGS
#: Contrastive explanations need a foil text per example, which a dataset run does not take (yet).
PER_EXAMPLE_ARGUMENTS = ("contrast_targets", "contrast_targets_alignments")


def check_method(method: str) -> None:
    """Refuse a method that is neither the plugin's nor Inseq's, naming them."""
    from ..declarations import DECLARATIONS

    if method in DECLARATIONS:
        return
    import inseq

    if method not in inseq.list_feature_attribution_methods():
        raise ValueError(
            f"Unknown method {method!r} for a dataset run; choose one of the plugin's {list(DECLARATIONS)} or "
            f"Inseq's {sorted(set(inseq.list_feature_attribution_methods()) - set(DECLARATIONS))}."
        )


class GenerationFrontEnd(FrontEndModel):
    """A generation model's dataset-run front end: ``inseq_model`` (Inseq's ``AttributionModel`` with one of this
    package's methods or one of Inseq's own), whose ``attribute`` stays the user's entry point; this adds the hooks a
    dataset run calls.

    Rows are checked before any work (a decoder-only target starts with its prompt, a prompt gives tokens and its
    generation fits the model's positions, spans and units are found in the texts), missing targets generated in
    batches, and each batch attributed through one trace (this package's methods), the span front end (``spans=``,
    ``units=``), or Inseq's own loop one example at a time (Inseq's methods).
    """

    item_name = "text"

    def __init__(self, inseq_model):
        self.inseq_model = inseq_model
        self.model = inseq_model.model
        method = inseq_model.attribution_method
        self.method = getattr(method, "method_name", type(method).__name__)
        self.declaration = getattr(method, "declaration", None)

    @property
    def tokenizer(self):
        return self.inseq_model.tokenizer

    @property
    def is_encoder_decoder(self) -> bool:
        return self.inseq_model.is_encoder_decoder

    @property
    def model_name(self) -> str:
        return self.inseq_model.model_name

    def for_method(self, method: str) -> GenerationFrontEnd:
        """The same model and tokenizer with another method (Inseq loads it: this package's methods are registered
        once a generation model was loaded)."""
        import inseq

        return GenerationFrontEnd(inseq.load_model(self.model, method, tokenizer=self.tokenizer))

    def run_arguments(self, kwargs: dict, max_new_tokens: int | None = None) -> tuple[dict, dict]:
        """Inseq's arguments (or the span front end's) and the method's options (:func:`split_arguments`);
        ``max_new_tokens`` (checked) caps the generated targets and is kept among the run's own arguments."""
        own, options = split_arguments(self.inseq_model, dict(kwargs))
        if max_new_tokens is not None:
            generation_length(self.inseq_model, max_new_tokens)  # a bad value refused now
            own["max_new_tokens"] = max_new_tokens
        return own, options

    def check_rows(self, sources: list, targets: list, words: list, own: dict, names: list[str]) -> None:
        """Every row checked before any work, each error naming the row: decoder-only targets are the full text,
        each must start with its prompt (Inseq's convention), a prompt must give tokens, and one whose generation
        (capped as :func:`generation_length` says, with its warning once when some row has no target) would run past
        a table of absolute positions (GPT-2's ``n_positions``) is refused; spans and units are found in the texts."""
        model = self.inseq_model
        length = generation_length(model, own.get("max_new_tokens"), any(target is None for target in targets))
        if any(name in own for name in SPAN_ARGUMENTS):
            SpanAttributionModel(model).check_rows(sources, targets, words, own, names)
        if model.is_encoder_decoder:
            return
        for name, source, target in zip(names, sources, targets, strict=True):
            if target is not None and not target.startswith(source):
                raise ValueError(
                    f"{name}: the target of a decoder-only model is the full text and must start with the prompt "
                    f"{source!r}; it is {target!r}."
                )
            if source and not model.encode(source).input_ids.shape[1]:
                raise ValueError(
                    f"{name}: the prompt {source!r} gives no token with this tokenizer: give it text, or leave it "
                    "empty (an empty prompt starts from the BOS token)."
                )
        prompts = [(source, name) for name, source, target in zip(names, sources, targets, strict=True) if not target]
        check_prompts_fit(model, prompts, length)

    def attribute_rows(self, sources: list, targets: list, words: list, own: dict, options: dict,
                       names: list[str] | None = None, progress=None) -> list:  # fmt: skip
        """One batch: missing targets generated first (capped as in :meth:`check_rows`), then attributed; per row,
        its sequence and its target text. ``progress`` is told what is being done, and each example done where they
        are done one by one (Inseq's own methods)."""
        model = self.inseq_model
        inseq_args = {name: value for name, value in own.items() if name != "max_new_tokens"}
        targets = list(targets)
        missing = [index for index, target in enumerate(targets) if target is None]
        if missing:
            if progress is not None:
                progress.doing(f"generating {len(missing)} target(s)")
            length = generation_length(model, own.get("max_new_tokens"), generates=False)
            generated = generate_targets(model, [sources[index] for index in missing], length)
            for index, text in zip(missing, generated, strict=True):
                targets[index] = text
        if any(name in inseq_args for name in SPAN_ARGUMENTS):  # spans over units: the span front end, one call
            return SpanAttributionModel(model).attribute_rows(sources, targets, words, inseq_args, options, names,
                                                              progress, generated=missing)  # fmt: skip
        if is_declared(model):
            sequences = attribute_texts(model, sources, targets, inseq_args, options).sequence_attributions
        else:  # Inseq's own methods, through Inseq's loop: each example exactly as model.attribute gives it
            if progress is not None:
                progress.doing("attributing")
            sequences = []
            for source, target in zip(sources, targets, strict=True):
                out = model.attribute(source, target, show_progress=False, **inseq_args, **options)
                sequences.append(out.sequence_attributions[0])
                if progress is not None:
                    progress.one()
        return list(zip(sequences, targets, strict=True))


def is_declared(attribution_model) -> bool:
    """Whether the model's method is one of the plugin's (batched through one trace) rather than Inseq's own."""
    return getattr(attribution_model.attribution_method, "declaration", None) is not None


def split_arguments(attribution_model, kwargs: dict) -> tuple[dict, dict]:
    """Split ``kwargs`` into Inseq's attribute arguments (or the span front end's) and the method's options, rejecting
    unknown names."""
    method = attribution_model.attribution_method
    if not is_declared(attribution_model):
        return _split_inseq_arguments(attribution_model, kwargs)
    known = method.method.option_names()
    unknown = sorted(set(kwargs) - set(known) - set(INSEQ_ARGUMENTS) - set(SPAN_ARGUMENTS))
    if unknown:
        raise ValueError(
            f"Unknown option(s) {unknown} for {method.method_name}; its options are {known}, and a dataset run "
            f"also takes {list(INSEQ_ARGUMENTS)} (or, for spans of each generation, {list(SPAN_ARGUMENTS)})."
        )
    spans = {name: kwargs[name] for name in SPAN_ARGUMENTS if name in kwargs}
    if spans:
        mixed = sorted(set(kwargs) & set(INSEQ_ARGUMENTS))
        if mixed:
            raise ValueError(f"{mixed} are not taken with {sorted(spans)}: spans= says what is explained.")
        from ..frontends.spans import check_span_arguments

        check_span_arguments(**spans)
        options = {name: value for name, value in kwargs.items() if name in known}
        method.method.check_options(options)
        return spans, options
    per_example = sorted(set(kwargs) & set(PER_EXAMPLE_ARGUMENTS))
    if per_example:
        raise ValueError(f"{per_example} take one text per call: use model.attribute for contrastive explanations.")
    method.method.check_options({name: value for name, value in kwargs.items() if name in known})
    inseq_args = {name: kwargs[name] for name in INSEQ_ARGUMENTS if name in kwargs}
    inseq_args.setdefault("attribute_target", True)
    if not attribution_model.is_encoder_decoder:
        inseq_args["attribute_target"] = False  # decoder-only: the target side is the whole context
    return inseq_args, {name: value for name, value in kwargs.items() if name in known}


def _split_inseq_arguments(attribution_model, kwargs: dict) -> tuple[dict, dict]:
    """Inseq's own methods (gradient baselines, ...): their options are those their ``attribute`` takes (e.g.
    ``n_steps`` for Integrated Gradients); unknown names are refused instead of Inseq's "Unused arguments" warning."""
    method = attribution_model.attribution_method
    candidates = {name: value for name, value in kwargs.items() if name not in INSEQ_ARGUMENTS}
    per_example = sorted(set(candidates) & set(PER_EXAMPLE_ARGUMENTS))
    if per_example:
        raise ValueError(f"{per_example} take one text per call: use model.attribute for contrastive explanations.")
    options, unused = method.get_attribution_args(**candidates)
    if unused:
        raise ValueError(f"Unknown option(s) {sorted(unused)} for {method.method_name}; a dataset run also takes "
                         f"{list(INSEQ_ARGUMENTS)}.")  # fmt: skip
    inseq_args = {name: kwargs[name] for name in INSEQ_ARGUMENTS if name in kwargs}
    inseq_args.setdefault("attribute_target", attribution_model.is_encoder_decoder)
    return inseq_args, options


#: The new tokens transformers generates when neither the call nor the model's generation config sets a length.
TRANSFORMERS_DEFAULT_NEW_TOKENS = 20


def generation_length(attribution_model, max_new_tokens: int | None = None, generates: bool = True) -> dict:
    """The keyword arguments that cap each generated target: ``max_new_tokens`` when given, the model's own
    generation config when it sets a length (``{}``), else transformers' default made explicit, with a warning (once,
    when ``generates``: some row has no target) that says which length is used and how to set it.

    Raises:
        ValueError: ``max_new_tokens`` is not a positive integer.
    """
    if max_new_tokens is not None:
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, not {max_new_tokens!r}.")
        return {"max_new_tokens": max_new_tokens}
    config = attribution_model.model.generation_config
    if config.max_new_tokens is not None or config.max_length is not None:
        return {}
    if generates:
        warnings.warn(
            f"The model's generation config sets no length: each generated target has at most "
            f"{TRANSFORMERS_DEFAULT_NEW_TOKENS} new tokens (transformers' default). Set max_new_tokens= "
            "(--max-new-tokens) to change it.",
            GenerationLengthWarning,
            stacklevel=3,
        )
    return {"max_new_tokens": TRANSFORMERS_DEFAULT_NEW_TOKENS}


class GenerationLengthWarning(UserWarning):
    """Targets are generated at a length the user did not choose (the model's config sets none)."""


def check_prompts_fit(attribution_model, prompts: list[tuple[str, str]], length: dict | None = None) -> None:
    """Refuse a decoder-only prompt to generate from whose generation could run past the model's table of absolute
    positions (the model would fail inside ``generate`` with an ``IndexError``).

    Args:
        attribution_model: The Inseq model.
        prompts: ``(prompt, where)`` pairs; ``where`` names the prompt in the error (e.g. its row).
        length: The generation's cap (:func:`generation_length`; default: the model's generation config).

    Raises:
        ValueError: Naming the first prompt that does not fit, the lengths, and what to do.
    """
    from ..specs import get_spec

    if attribution_model.is_encoder_decoder or not prompts:
        return
    limit = get_spec(attribution_model.model).max_positions
    if limit is None:
        return
    config = attribution_model.model.generation_config
    new_tokens = (length or {}).get("max_new_tokens") or config.max_new_tokens
    for prompt, where in prompts:
        tokens = attribution_model.encode(decoder_only_prompt(attribution_model, prompt)[0]).input_ids.shape[1]
        longest = tokens + new_tokens if new_tokens else max(config.max_length or 0, tokens + 20)
        if longest > limit:
            raise ValueError(
                f"{where}: the prompt has {tokens} tokens, and its generation may reach {longest} positions, but this "
                f"model has position embeddings for {limit}. Give its target (the full text), or shorten the prompt."
            )


def generate_targets(attribution_model, sources: list[str], cap: dict | None = None) -> list[str]:
    """What ``attribution_model.generate(source)`` gives each source alone (the target ``model.attribute(source)``
    attributes), computed in batches, each generation capped by ``cap`` (:func:`generation_length`).

    Encoder–decoders: one ``generate`` call on the right-padded sources with their attention mask (the decoder starts
    alike for all). Decoder-only models: one call per prompt length, so no prompt is padded and every ``max_length``
    or ``min_length`` counts as it does alone. Texts are decoded as Inseq decodes one generation: special tokens kept
    for decoder-only models, dropped for encoder–decoders.
    """
    prompts = [decoder_only_prompt(attribution_model, source)[0] for source in sources]
    tokenizer = attribution_model.tokenizer
    lengths: list[int] = []
    if attribution_model.is_encoder_decoder:
        groups = [list(range(len(prompts)))]
    else:
        lengths = [attribution_model.encode(prompt).input_ids.shape[1] for prompt in prompts]
        by_length: dict[int, list[int]] = {}
        for idx, length in enumerate(lengths):
            by_length.setdefault(length, []).append(idx)
        groups = list(by_length.values())
    texts: list[str] = [""] * len(prompts)
    for group in groups:
        padding_side, tokenizer.padding_side = tokenizer.padding_side, "right"
        try:
            inputs = attribution_model.encode([prompts[idx] for idx in group])
        finally:
            tokenizer.padding_side = padding_side
        with torch.no_grad():
            sequences = attribution_model.model.generate(
                input_ids=inputs.input_ids,
                attention_mask=inputs.attention_mask,
                return_dict_in_generate=True,
                **(cap or {}),
            ).sequences
        for row, idx in enumerate(group):
            ids = sequences[row]
            if not attribution_model.is_encoder_decoder:
                ids = _until_end_of_sequence(ids, lengths[idx], attribution_model.model.generation_config)
            text = attribution_model.decode(ids[None], skip_special_tokens=attribution_model.is_encoder_decoder)
            texts[idx] = text[0] if isinstance(text, list) else text
    return texts


def _until_end_of_sequence(ids: torch.Tensor, prompt_length: int, config) -> torch.Tensor:
    """A batched decoder-only generation cut where it would have stopped alone: after its first end-of-sequence token
    (the batch pads finished rows until the longest ends)."""
    ends = config.eos_token_id
    ends = [] if ends is None else [ends] if isinstance(ends, int) else list(ends)
    generated = ids[prompt_length:]
    hits = torch.isin(generated, torch.tensor(ends, device=ids.device)).nonzero()
    return ids if not len(hits) else ids[: prompt_length + int(hits[0, 0]) + 1]


def decoder_only_prompt(attribution_model, source: str, target: str | None = None) -> tuple[str, str | None]:
    """Inseq's convention for an empty decoder-only prompt: it becomes the BOS token, and the target starts with it.

    Raises:
        ValueError: An empty prompt for a tokenizer without a BOS token.
    """
    if attribution_model.is_encoder_decoder or source:
        return source, target
    bos = attribution_model.bos_token
    if not bos:
        raise ValueError(
            "An empty prompt is attributed from the BOS token, and this tokenizer has none: give every row a prompt."
        )
    if target is not None and not target.startswith(bos):
        target = f"{bos} {target}"
    return bos, target


def attribute_texts(attribution_model, sources: list[str], targets: list[str], inseq_args: dict, options: dict):
    """Inseq's attribution of a whole batch of (source, target) pairs in one step of the final-step method.

    Inseq gives a whole batch one first attributed position, which does not fit prompts of different lengths in a
    left-padded decoder-only batch: such a batch is right-padded (causal attention makes the padding invisible to real
    tokens), attributed from position 1, and each sequence then keeps the columns after its own prompt, as
    ``model.attribute`` gives them for the sequence alone. An empty decoder-only prompt becomes the BOS token, as in
    ``model.attribute`` (:func:`decoder_only_prompt`).
    """
    from inseq.attr.feat import extract_args
    from inseq.data.attribution import merge_attributions

    if not attribution_model.is_encoder_decoder:
        pairs = [decoder_only_prompt(attribution_model, s, t) for s, t in zip(sources, targets, strict=True)]
        sources, targets = [source for source, _ in pairs], [target for _, target in pairs]
    method = attribution_model.attribution_method
    args = dict(inseq_args)
    attributed_fn = attribution_model.get_attributed_fn(args.pop("attributed_fn", None))
    attribution_args, attributed_fn_args, step_scores_args = extract_args(
        method,
        attributed_fn,
        [],
        default_args=attribution_model.formatter.get_step_function_reserved_args(),
        **options,
    )
    common = {
        "show_progress": False,
        "attributed_fn": attributed_fn,
        "attribution_args": attribution_args,
        "attributed_fn_args": attributed_fn_args,
        "step_scores_args": step_scores_args,
        "attribute_target": args.pop("attribute_target"),
        "skip_special_tokens": args.pop("skip_special_tokens", False),
    }
    if attribution_model.is_encoder_decoder:
        outputs = method.prepare_and_attribute(sources, targets, batch_size=len(sources), **common, **args)
        return merge_attributions(outputs)
    tokenizer = attribution_model.tokenizer
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "right"
    try:
        batch = attribution_model.formatter.prepare_inputs_for_attribution(
            attribution_model, targets, False, common["skip_special_tokens"]
        )
    finally:
        tokenizer.padding_side = padding_side
    special = not common["skip_special_tokens"]
    starts = [
        max(attribution_model.encode(source, add_special_tokens=special).input_ids.shape[1],
            args.get("attr_pos_start") or 0)
        for source in sources
    ]  # fmt: skip
    with method.explaining_from(starts):  # the methods skip the prompt rows that keep_generated drops
        output = method.attribute(batch, attr_pos_start=1, attr_pos_end=None, **common)
    for sequence, start in zip(output.sequence_attributions, starts, strict=True):
        end = min(len(sequence.target), args.get("attr_pos_end") or len(sequence.target))
        keep_generated(sequence, start, end)
    return output


def keep_generated(sequence, start: int, end: int) -> None:
    """Restrict a decoder-only sequence output to the generated positions ``start:end`` (the prompt is its source)."""
    first, last = start - sequence.attr_pos_start, end - sequence.attr_pos_start
    sequence.target_attributions = sequence.target_attributions[:, first:last]
    sequence.step_scores = {name: score[first:last] for name, score in (sequence.step_scores or {}).items()}
    sequence.source = sequence.target[:start]
    sequence.attr_pos_start, sequence.attr_pos_end = start, end
