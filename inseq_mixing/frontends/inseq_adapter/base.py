"""Shared Inseq glue for the plugin's final-step methods: read Inseq's step arguments, trace, wrap outputs."""

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
from inseq.attr.feat.attribution_utils import check_attribute_positions
from inseq.attr.feat.feature_attribution import FeatureAttribution
from inseq.attr.step_functions import (
    STEP_SCORES_MAP,
    StepFunctionDecoderOnlyArgs,
)
from inseq.data import DecoderOnlyBatch, get_batch_from_inputs
from inseq.utils import Registry
from inseq.utils.alignment_utils import get_aligned_idx
from transformers.utils import ModelOutput

from ...declarations import InputSize
from ...memory import available_bytes
from ...methods.blocks import upcast
from ...specs import get_spec
from ...trace import ModelCall, ModelTrace, eval_mode, forward_arguments, trace_model
from ..layout import inseq_layout, logit_step_scores
from ..patches import answer_step_scores, explain_spans, record_requested_fn, tokens_from_host_ids
from ..sequences import MixingSequenceOutput, MixingStepOutput, SignedMixingSequenceOutput

# The output classes stay names of this module too: outputs Inseq saved with an earlier version name them here.

#: The ``attributed_fn`` values a logit-explaining method accepts.
LOGIT_TARGETS = ("logit", "contrast_logits_diff")
#: Keyword arguments Inseq's ``model.attribute`` adds on its own (not method options).
INSEQ_FORWARDED_ARGUMENTS = ("skip_special_tokens",)


@dataclass
class StepInputs:
    """The token ids of one Inseq final step.

    Attributes:
        input_ids: Source ids (encoder–decoders) or the whole sequence (decoder-only), ``(B, S)``.
        attention_mask: Mask of ``input_ids``.
        target_ids: Decoder input prefix of encoder–decoders ``(B, T)``, or None.
        target_mask: Mask of ``target_ids``.
        next_ids: The token predicted at the last position ``(B,)``.
        attribute_target: Whether Inseq asked for target-side attributions.
        attributed_fn_args: Keyword arguments of Inseq's attributed function (e.g. ``contrast_targets``).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    target_ids: torch.Tensor | None
    target_mask: torch.Tensor | None
    next_ids: torch.Tensor
    attribute_target: bool
    attributed_fn_args: dict[str, Any]

    @property
    def decoder_mask(self) -> torch.Tensor:
        """Mask of the decoder positions ``(B, T)``: ``target_mask`` of encoder–decoders, else ``attention_mask``."""
        return self.attention_mask if self.target_ids is None else self.target_mask

    @property
    def predicted_ids(self) -> torch.Tensor:
        """The token predicted at every decoder position ``(B, T)``: the next prefix token, then ``next_ids``."""
        prefix = self.input_ids if self.target_ids is None else self.target_ids
        return torch.cat([prefix[:, 1:], self.next_ids[:, None].to(prefix.device)], dim=1)


@dataclass
class SignedScores:
    """Signed target ``(B, T, T)`` and source ``(B, T, S)`` (or None) token scores, for ``maps_step_output``."""

    target: torch.Tensor
    source: torch.Tensor | None = None


def read_step_inputs(inputs: tuple, additional_forward_args: tuple, is_encoder_decoder: bool) -> StepInputs:
    """Unpack Inseq's ``(inputs, additional_forward_args)`` layout (see Inseq's ``format_attribution_args``)."""
    if is_encoder_decoder:
        attribute_target = len(inputs) > 1
        args = additional_forward_args[0 if attribute_target else 1 :]
        source_ids, target_ids, next_ids, _, source_mask, target_mask, _, names = args[:8]
        fn_args = dict(zip(names, args[8:], strict=False))
        return StepInputs(
            source_ids, source_mask, target_ids, target_mask, next_ids.reshape(-1), attribute_target, fn_args
        )
    input_ids, next_ids, _, mask, _, names = additional_forward_args[:6]
    fn_args = dict(zip(names, additional_forward_args[6:], strict=False))
    return StepInputs(input_ids, mask, None, None, next_ids.reshape(-1), True, fn_args)


class MethodCall:
    """Holder of a method's ``attribute``, whose signature lists the options users pass to ``model.attribute`` (Inseq
    routes keyword arguments by it). The adapter (:mod:`.adapter`) generates one subclass per declaration, with the
    signature and documentation of the declaration's options."""

    def __init__(self, owner: "ContextMixingAttribution"):
        self.owner = owner

    def option_names(self) -> list[str]:
        """The options ``model.attribute`` routes to this method."""
        return self.owner.declaration.option_names()

    def check_options(self, options: dict[str, Any]) -> None:
        """Refuse unknown option names and wrongly typed values, naming what is accepted."""
        self.owner.declaration.check_options(options)

    @staticmethod
    def has_convergence_delta() -> bool:
        return False


@dataclass
class CallState:
    """What one call of a method's ``attribute`` carries between Inseq's steps and its output, in one place (the
    method object is Inseq's, shared by every call on the model).

    Attributes:
        step_scores: ``(scores, mask)`` of every traced decoder position, attached to each sequence's ``step_scores``
            (Inseq drops a final-step method's own).
        sequence_scores: The same for ``sequence_scores``.
        axis: The labels of the scores' extra last axis (layers, heads), for ``info["score_axis"]``.
        explained: What the scores explain, for ``info["attributed_fn"]``.
        first_attributed_position: The first generated token Inseq attributes (unpadded index).
        own_pass_step_scores: Step scores answered from the method's own forward pass (set around one call by
            :func:`~..patches.answer_step_scores`).
        kept_from: Per sentence, the first token whose attribution is kept (within :meth:`explaining_from`).
    """

    step_scores: tuple | None = None
    sequence_scores: tuple | None = None
    axis: list[str] | None = None
    explained: str | None = None
    first_attributed_position: int = 1
    own_pass_step_scores: list[str] = field(default_factory=list)
    kept_from: list[int] | None = None

    def clear_pending(self) -> None:
        """Forget what the last call left for its output."""
        self.step_scores = self.sequence_scores = self.axis = None


class ContextMixingAttribution(FeatureAttribution, Registry):
    """Base of the plugin's methods: final-step methods that trace the model once on the full target.

    Subclasses are generated from the method declarations by :mod:`.adapter`: ``method_name``, ``declaration``,
    ``method_call`` (a :class:`MethodCall` whose ``attribute`` signature declares the user-facing keyword arguments,
    which is how Inseq routes ``model.attribute(..., kw=...)``) and ``explains_logit`` (Inseq's contrastive functions
    then apply). The first line of a subclass's docstring is its one-line summary (``inseq-mixing methods``).
    """

    #: What :mod:`..patches` recognises this package's method objects by (it does not import them).
    mixes_context = True

    method_call: type[MethodCall]
    declaration = None
    explains_logit: bool = False

    def __init__(self, attribution_model, **kwargs):
        super().__init__(attribution_model, hook_to_model=False)
        self.spec = get_spec(attribution_model.model)
        refuse_mismatched_tokenizer(attribution_model.tokenizer, attribution_model.model)
        self.use_predicted_target = self.explains_logit
        self.method = self.method_call(self)
        self.is_final_step_method = True
        self.call = CallState()  # what one call carries between Inseq's steps and its output
        record_requested_fn(attribution_model)
        answer_step_scores(attribution_model)
        explain_spans(attribution_model)
        tokens_from_host_ids(attribution_model)
        self.hook(**kwargs)

    def attribute(self, batch, *args, **kwargs):
        """Inseq's attribution, then the per-token scores a final-step method cannot return itself.

        Inseq drops the step scores of final-step methods, so a method that has per-generated-token scores (e.g. the
        logit terms not attributed to tokens) leaves them with :meth:`keep_step_scores` and they are attached to each
        sequence's ``step_scores`` here.
        """
        self.call.clear_pending()
        self.refuse_other_targets()
        self.call.first_attributed_position, _ = check_attribute_positions(
            batch.max_generation_length, kwargs.get("attr_pos_start"), kwargs.get("attr_pos_end")
        )
        try:
            with eval_mode(self.attribution_model.model):
                out = super().attribute(batch, *args, **kwargs)
            if self.spec.is_encoder_decoder:
                fix_attributed_positions(out.sequence_attributions, self.call.first_attributed_position)
            if self.call.step_scores is not None:
                attach_step_scores(out.sequence_attributions, *self.call.step_scores)
            if self.call.sequence_scores is not None:
                attach_sequence_scores(out.sequence_attributions, *self.call.sequence_scores)
            if self.call.axis is not None:
                out.info["score_axis"] = list(self.call.axis)
            out.info["attributed_fn"] = self.call.explained = self.explained_quantity()
        finally:
            self.call.clear_pending()
        return out

    def prepare_and_attribute(self, *args, **kwargs):
        """Inseq's preparation and attribution; then ``info["attributed_fn"]`` says what was explained (Inseq writes
        the name of the function it resolved, its probability by default, which these methods do not explain)."""
        self.call.explained = None
        self.check_sizes(*args, **kwargs)
        out = super().prepare_and_attribute(*args, **kwargs)
        if self.call.explained is not None:
            for output in out if isinstance(out, list) else [out]:  # encoder–decoders: one output per batch
                output.info["attributed_fn"] = self.call.explained
        return out

    def check_sizes(self, sources, targets, *_, attribution_args: dict | None = None, batch_size: int | None = None,
                    include_eos_baseline: bool = False, skip_special_tokens: bool = False, **__) -> None:  # fmt: skip
        """Every text of the call checked by the method before any batch runs
        (:meth:`~inseq_mixing.declarations.Declaration.check_sizes`, naming the text), its sizes read from Inseq's
        own encoding of the texts: the traced decoder positions (the target without its last token, which is only
        predicted) and an encoder–decoder's source tokens."""
        declaration = self.declaration
        texts = [targets] if isinstance(targets, str) else targets
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            return
        inputs = texts if not self.spec.is_encoder_decoder else ([sources] if isinstance(sources, str) else sources,
                                                                 texts)  # fmt: skip
        batch = self.attribution_model.formatter.prepare_inputs_for_attribution(
            self.attribution_model, inputs, include_eos_baseline, skip_special_tokens
        )
        positions = (batch.target_mask.sum(-1) - 1).tolist()
        sources_count = batch.source_mask.sum(-1).tolist() if self.spec.is_encoder_decoder else [0] * len(texts)
        options = declaration.make_options({name: value for name, value in (attribution_args or {}).items()
                                            if name in declaration.option_names()})  # fmt: skip
        sizes = [InputSize(int(count), int(source)) for count, source in zip(positions, sources_count, strict=True)]
        names = [f"Input {index}" for index in range(len(texts))]
        model = self.attribution_model.model
        memory = (next(model.parameters()).element_size(), available_bytes(next(model.parameters()).device))
        declaration.check_sizes(sizes, names, self.spec, options, memory, batch_size or len(texts))

    def refuse_other_targets(self) -> None:
        """Methods that explain logits (``use_predicted_target``) refuse any other ``attributed_fn`` the user named."""
        requested = getattr(self.attribution_model, "requested_attributed_fn", None)
        if not self.use_predicted_target or requested is None or requested in LOGIT_TARGETS:
            return
        if requested in [STEP_SCORES_MAP[name] for name in LOGIT_TARGETS]:
            return
        name = requested if isinstance(requested, str) else getattr(requested, "__name__", repr(requested))
        raise ValueError(
            f"{self.method_name} explains the logit of each generated token (or, with contrast_targets, a logit "
            f"difference), not attributed_fn={name!r}: leave attributed_fn unset, or use 'logit' or "
            "'contrast_logits_diff'."
        )

    def get_attribution_args(self, **kwargs) -> tuple[dict[str, Any], dict[str, Any]]:
        """The method's options among ``model.attribute``'s keyword arguments, checked before any work: an unknown
        name or a wrong value raises instead of Inseq's "Unused arguments" warning and a run with defaults."""
        options = {name: value for name, value in kwargs.items() if name not in INSEQ_FORWARDED_ARGUMENTS}
        self.method.check_options(options)
        foils = options.get("contrast_targets")
        if isinstance(foils, list | tuple) and len(foils) != 1:
            raise ValueError(
                f"contrast_targets got {len(foils)} texts, but a contrastive explanation takes one foil for one "
                "input: call model.attribute once per (input, target, foil)."
            )
        return options, {name: value for name, value in kwargs.items() if name not in options}

    def filtered_attribute_step(self, batch, target_ids, attributed_fn, target_attention_mask=None, **kwargs):
        """Inseq's step on the whole padded batch: a final-step method must not drop the sentences that end before the
        longest one (Inseq filters them out at its last step), since its scores cover every position at once."""
        return super().filtered_attribute_step(batch, target_ids, attributed_fn, None, **kwargs)

    def keep_sequence_scores(self, scores: dict[str, torch.Tensor], mask: torch.Tensor) -> None:
        """Keep ``(B, T, ...)`` scores of every traced decoder position for :meth:`attribute`, which puts each
        sequence's real positions into its ``sequence_scores`` (Inseq would slice them as attributions)."""
        self.call.sequence_scores = ({name: upcast(score.detach()).cpu() for name, score in scores.items()}, mask)

    def explained_quantity(self) -> str:
        """What the scores explain, for the output's ``info["attributed_fn"]`` (Inseq would name its default
        probability function, which these methods never explain): ``logit`` or ``contrast_logits_diff`` for logit
        methods, else the row of the method's map at the position that predicts each generated token."""
        if self.explains_logit:
            steps = self.call.step_scores[0] if self.call.step_scores is not None else {}
            return "contrast_logits_diff" if "contrast_logits_diff" in steps else "logit"
        return f"{self.method_name} map: context mixing into the position that predicts each generated token"

    def keep_axis(self, labels: list[str] | None) -> None:
        """Keep the labels of the scores' extra last axis (layers, or (layer, head) slots) for the output's
        ``info["score_axis"]``."""
        self.call.axis = labels

    def keep_step_scores(self, scores: dict[str, torch.Tensor], mask: torch.Tensor) -> None:
        """Keep ``(B, T)`` scores over the traced decoder positions (with their mask) for :meth:`attribute`."""
        self.call.step_scores = ({name: upcast(score.detach()).cpu() for name, score in scores.items()}, mask)

    def trace(self, steps: StepInputs) -> ModelTrace:
        """One forward pass of the wrapped model on the step's ids; the LM head's full-vocabulary logits only where
        step scores read them (the methods gather the explained tokens' logits from the final hidden state); only the
        records the method reads (:meth:`~inseq_mixing.declarations.base.Declaration.trace_records`)."""
        return trace_model(
            self.attribution_model.model,
            steps.input_ids,
            steps.attention_mask,
            steps.target_ids,
            steps.target_mask,
            spec=self.spec,
            full_logits=bool(self.call.own_pass_step_scores),
            records=self.declaration.trace_records(),
        )

    def model_call(self, steps: StepInputs) -> ModelCall:
        """The call :meth:`trace` would run, checked (lengths, vocabulary) but not run."""
        model = self.attribution_model.model
        arguments = forward_arguments(model, self.spec, steps.input_ids, steps.attention_mask, steps.target_ids,
                                      steps.target_mask)  # fmt: skip
        return ModelCall(model, arguments)

    def attribute_step(
        self, attribute_fn_main_args: dict[str, Any], attribution_args: dict[str, Any] | None = None
    ) -> MixingStepOutput:
        return self.method.attribute(**attribute_fn_main_args, **(attribution_args or {}))

    def contrast_ids(
        self, steps: StepInputs, contrast_targets: str | list[str] | None, alignments: list | None
    ) -> torch.Tensor | None:
        """The foil token at every attributed decoder position ``(1, T)`` from a contrastive target text, or None.

        Positions before the first attributed token keep the target itself (their difference is 0; Inseq does not
        show them).
        """
        contrast_targets = contrast_targets or steps.attributed_fn_args.get("contrast_targets")
        if contrast_targets is None:
            return None
        if alignments is None:  # 1:1; Inseq's own guess is wrong for encoder–decoders with attr_pos_end
            alignments = []
        else:
            alignments = steps.attributed_fn_args.get("contrast_targets_alignments") or alignments
        if alignments and isinstance(alignments[0], list):
            alignments = alignments[0]
        if steps.input_ids.shape[0] != 1:
            raise ValueError("Contrastive explanations take one sentence at a time: attribute a single input.")
        is_enc_dec = self.spec.is_encoder_decoder
        batch = get_batch_from_inputs(self.attribution_model, inputs=contrast_targets, as_targets=is_enc_dec)
        contrast = DecoderOnlyBatch.from_batch(batch).target_ids.to(steps.next_ids.device)
        predicted = steps.predicted_ids
        foils = predicted.clone()  # positions before the attributed ones are not shown: no contrast there
        missing = []
        for position in range(self.call.first_attributed_position - 1, predicted.shape[1]):
            aligned = get_aligned_idx(position + 1, alignments)
            if 0 <= aligned < contrast.shape[1]:
                foils[:, position] = contrast[:, aligned]
            else:
                missing.append(position + 1)
        if missing:
            raise ValueError(
                f"The contrast target has {contrast.shape[1]} tokens and no token aligned with target position(s) "
                f"{missing}: give a contrast target as long as the target, or contrast_targets_alignments."
            )
        return foils

    def explained_positions(self, steps: StepInputs) -> torch.Tensor:
        """``(B, T)`` booleans: the real decoder positions that predict a token Inseq attributes (the first attributed
        token is ``call.first_attributed_position`` past each row's left padding)."""
        mask = steps.decoder_mask.bool()
        padding = (~mask).long().cumprod(-1).sum(-1, keepdim=True)
        index = torch.arange(mask.shape[1], device=mask.device)
        explained = mask & (index >= padding + self.call.first_attributed_position - 1)
        if self.call.kept_from is not None and len(self.call.kept_from) == mask.shape[0]:
            explained &= index >= padding + torch.tensor(self.call.kept_from, device=mask.device)[:, None] - 1
        return explained

    @contextlib.contextmanager
    def explaining_from(self, starts: list[int]):
        """Within it, each sentence of a batch is explained from its own first kept token ``starts[i]`` (unpadded
        index): the dataset runner attributes prompts of different lengths in one batch from position 1 and keeps each
        sentence's columns after its prompt, so the methods skip the prompt rows nobody keeps."""
        previous, self.call.kept_from = self.call.kept_from, list(starts)
        try:
            yield self
        finally:
            self.call.kept_from = previous

    def logit_step_output(
        self,
        steps: StepInputs,
        mask: torch.Tensor,
        scores,
        contrastive: bool,
        step_scores: dict[str, torch.Tensor],
        num_dimensions: int = 0,
    ) -> MixingStepOutput:
        """Step output of signed logit contributions (``scores.target``/``scores.source``, with ``num_dimensions``
        extra axes; ``mask``: the real decoder positions), keeping per-token terms and the model's own ``logit``
        (``contrast_logits_diff`` when contrastive) for the sequences' step scores."""
        self.keep_step_scores({**step_scores, **logit_step_scores(scores, contrastive)}, mask)
        maps = SignedScores(target=scores.target, source=scores.source)
        return self.maps_step_output(maps, steps, num_dimensions, sequence_cls=SignedMixingSequenceOutput)

    def maps_step_output(
        self, maps, steps: StepInputs, num_dimensions: int, sequence_cls: type = MixingSequenceOutput
    ) -> MixingStepOutput:
        """Step output of maps with ``target``, ``source`` and ``encoder`` fields ``(B, [L,] i, j)`` (or None).

        Encoder–decoders: the encoder map goes to ``sequence_scores["encoder_self_scores"]``; without
        ``attribute_target``, the target map goes to ``sequence_scores["decoder_self_scores"]``.
        """
        target = inseq_layout(maps.target, causal=True)
        if not self.spec.is_encoder_decoder:
            return MixingStepOutput(
                target_attributions=target, _num_dimensions=num_dimensions, _sequence_cls=sequence_cls
            )
        sequence_scores = {}
        if getattr(maps, "encoder", None) is not None:
            sequence_scores["encoder_self_scores"] = inseq_layout(maps.encoder, causal=False)
        if not steps.attribute_target:
            sequence_scores["decoder_self_scores"] = target
        return MixingStepOutput(
            source_attributions=inseq_layout(maps.source, causal=False),
            target_attributions=target if steps.attribute_target else None,
            sequence_scores=sequence_scores,
            _num_dimensions=num_dimensions,
            _sequence_cls=sequence_cls,
        )


def check_loaded(attribution_model) -> None:
    """What the generation kind checks of a model loaded from a name or folder: its tokenizer matches it
    (:func:`refuse_mismatched_tokenizer`)."""
    refuse_mismatched_tokenizer(attribution_model.tokenizer, attribution_model.model)


def refuse_mismatched_tokenizer(tokenizer, model) -> None:
    """Refuse, at load, a tokenizer with no ordinary token (transformers builds one from a folder without tokenizer
    files; every text would become nothing) or with ids the model has no embedding for (another model's tokenizer)."""
    if tokenizer is None:
        return
    if len(tokenizer) <= len(set(tokenizer.all_special_tokens)):
        raise ValueError(
            f"The tokenizer has {len(tokenizer)} token(s), all special: it was probably built from a folder without "
            "tokenizer files. Save the tokenizer next to the weights (tokenizer.save_pretrained(folder)), or pass "
            "tokenizer= to inseq.load_model."
        )
    embeddings = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > embeddings:
        raise ValueError(
            f"The tokenizer has {len(tokenizer)} tokens but the model embeds {embeddings}: the tokenizer does not "
            "match the model. Load the model's own tokenizer (or resize the model's embeddings after adding tokens)."
        )


def own_pass_step_scores(attribution_model, names: list[str], logits: torch.Tensor, predicted: torch.Tensor) -> dict:
    """Inseq's step functions ``names`` (of :data:`OWN_PASS_STEP_SCORES`) at every position ``(B, T)``, from the
    traced logits ``(B, T, V)`` and the explained tokens ``(B, T)``: each position is one row of Inseq's step."""
    batch, length, vocab = logits.shape
    args = StepFunctionDecoderOnlyArgs(
        attribution_model=attribution_model,
        forward_output=ModelOutput(logits=logits.reshape(batch * length, 1, vocab).float()),
        target_ids=predicted.reshape(batch * length),
        decoder_input_ids=None,
        decoder_input_embeds=None,
        decoder_attention_mask=None,
        is_attributed_fn=False,
    )
    return {name: STEP_SCORES_MAP[name](args).reshape(batch, length) for name in names}


def fix_attributed_positions(sequences: list, first: int) -> None:
    """Set ``attr_pos_start``/``attr_pos_end`` of encoder–decoder sequences to the positions really attributed.

    Inseq 0.7 attributes target positions ``first .. attr_pos_end`` (inclusive) of encoder–decoders, but records
    ``attr_pos_start = attr_pos_end − steps``, one too low whenever ``attr_pos_end`` is given.
    """
    for seq in sequences:
        scores = seq.source_attributions if seq.source_attributions is not None else seq.target_attributions
        seq.attr_pos_start, seq.attr_pos_end = first, first + scores.shape[1]


def attach_sequence_scores(sequences: list, scores: dict[str, torch.Tensor], mask: torch.Tensor) -> None:
    """Put ``(B, T, ...)`` scores into each sequence's ``sequence_scores``: the positions it has when traced alone.

    A sequence alone is traced on every target token but its last (the one nothing is predicted after). In a batch,
    a sequence shorter than the longest keeps its last token among the traced real positions: that row is dropped.
    """
    mask = mask.cpu().bool()
    for idx, seq in enumerate(sequences):
        traced = len(seq.target) - 1
        sequence_scores = dict(seq.sequence_scores or {})
        sequence_scores.update({name: score[idx][mask[idx]][:traced].clone() for name, score in scores.items()})
        seq.sequence_scores = sequence_scores


def attach_step_scores(sequences: list, scores: dict[str, torch.Tensor], mask: torch.Tensor) -> None:
    """Put ``(B, T)`` per-position scores into each sequence's ``step_scores``, one value per generated token.

    Generated token ``c`` of a sequence is predicted at its (unpadded) position ``attr_pos_start + c - 1``;
    decoder-only batches are left-padded, so the traced position adds the sequence's padding.
    """
    mask = mask.cpu()
    for idx, seq in enumerate(sequences):
        scores_of_seq = seq.source_attributions if seq.source_attributions is not None else seq.target_attributions
        generated = scores_of_seq.shape[1]
        first = int((~mask[idx].bool()).sum()) if not bool(mask[idx, 0]) else 0
        positions = slice(first + seq.attr_pos_start - 1, first + seq.attr_pos_start - 1 + generated)
        step_scores = dict(seq.step_scores or {})
        step_scores.update({name: score[idx, positions].clone() for name, score in scores.items()})
        seq.step_scores = step_scores
