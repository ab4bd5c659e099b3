"""Decoders whose token mixers are not all attention (issue 55): hybrids (Bamba, Granite 4, LFM2 and LFM2-MoE, Jamba,
Qwen3-Next, Qwen3.5, Nemotron-H) and Mamba, Mamba-2 and Falcon-Mamba (no attention, no FFN), their Mamba-2 and Mamba
layers, short convolutions, Gated DeltaNet layers and gated attention read by the methods through their exact mixing
matrices (:mod:`inseq_mixing.methods.mixers`). The mixers' parts add up to each layer's own output in the traced model,
ALTI-logit adds up to the model's own logits (with foils, per head), the maps' rows sum to 1 and give no weight to
later tokens, a padded row is that row alone, value zeroing is the model run again with a token's value input
zeroed, a trace of attention alone and a long trace give the same maps, the front ends explain the model, and the
methods that do not read mixers refuse it before any forward pass."""

import dataclasses
import logging

import inseq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inseq_mixing.declarations import DECLARATIONS, Request
from inseq_mixing.declarations.base import InputSize
from inseq_mixing.methods.alti_logit import alti_logit
from inseq_mixing.methods.mixers import frozen_mixer
from inseq_mixing.specs import UnsupportedModelError, get_spec
from inseq_mixing.specs.base import MixerSpec
from inseq_mixing.testing import HYBRID_FAMILIES, HYBRID_VARIANTS, load_tiny, tiny_model
from inseq_mixing.trace import MixerTrace, trace_model

from .conftest import forward_hooks, next_tokens
from .reference import mixer_value_inputs

logging.getLogger("transformers").setLevel(logging.ERROR)  # the kernels' fallback notices

#: Families whose mixers' math the tests below read directly (the builder's variants too: Falcon-H1 with its gated
#: norm, normed before the gate).
MIXER_FAMILIES = HYBRID_FAMILIES + HYBRID_VARIANTS
#: The methods that read mixers, as their declarations say.
MIXER_READERS = tuple(name for name, declaration in DECLARATIONS.items() if declaration.reads_mixers)
_MODELS: dict = {}
#: A padded row against that row alone, beyond the default: the Gated DeltaNet families' own forward (its chunked delta
#: rule in float32) leaves a padded row's hidden states up to about 1e-6 relative from the row alone, and on these
#: tiny models ALTI's rows move by up to 1.8e-4 when the embeddings get random noise of that size (5 draws each).
#: Zamba 2's own forward leaves a padded row's last hidden states 2.5e-5 from the row alone (its chunked scan over
#: other chunks; its shared attention), and noise of that size on the embeddings moves its tiny model's ALTI rows by up
#: to 2.6e-2 (GlobEnc's 2.9e-3; 5 draws each): the padded row is measured at 6e-4 at most.
PADDED_ATOL = {"qwen3_next": 3e-4, "qwen3_5": 3e-4, "qwen3_5_moe": 3e-4, "zamba2": 1e-3}
#: AttnLRP's logit against the model's: its pass runs the Mamba-2 mixers as their ``T × T`` mixing (MambaLRP's rules)
#: where the model runs its chunked scan; each layer agrees to 3e-6 relative (the parts test), which Zamba 2's tiny
#: model, as sensitive as above, carries to 6.4e-4 at the logit (its mixers run by their own forward instead: 1e-4).
LRP_LOGIT_ATOL = {"zamba2": 1e-3}


def hybrid(family: str):
    """Three layers: a mixer, attention, a mixer (cached per family)."""
    if family not in _MODELS:
        _MODELS[family] = tiny_model(family, layers=3)
    return _MODELS[family]


def padded_batch(length: int = 11, padded: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of random ids, the second left-padded by ``padded``."""
    ids = torch.randint(5, 60, (2, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1, :padded] = 0
    return ids, mask


def request_of(model, ids, mask, trace, foils=None) -> Request:
    predicted = next_tokens({"input_ids": ids})
    return Request(get_spec(model), model, mask, None, None, predicted, foils, mask.bool(), lambda: trace)


def refused(family: str, method: str) -> bool:
    """Whether ``method`` refuses a kind of mixer ``family`` has (value zeroing: Jamba's Mamba layers)."""
    kinds = {kind for layer in get_spec(hybrid(family)).decoder.layers if isinstance(layer.self_attn, MixerSpec)
             for kind in layer.self_attn.kinds}  # fmt: skip
    return bool(kinds & set(DECLARATIONS[method].unread_mixers))


def mixer_layers(spec, trace):
    pairs = zip(spec.decoder.layers, trace.decoder.layers, strict=True)
    return [(layer.self_attn, record.self_attn) for layer, record in pairs if isinstance(layer.self_attn, MixerSpec)]


@pytest.mark.parametrize("family", MIXER_FAMILIES)
def test_the_traced_mixers_parts_add_up_to_each_layers_output_and_are_causal(family):
    """In the traced model (a left-padded batch crossing the module's chunks of 4): every mixer layer's token parts
    plus what no token carries are its recorded output on every real position; per head they add up to the token
    parts; a later token's part is 0; parts read by windows of keys are the whole kernel's columns; the maps rollout
    reads have rows that sum to 1."""
    model = hybrid(family)
    spec = get_spec(model)
    ids, mask = padded_batch()
    trace = trace_model(model, ids, mask)
    layers = mixer_layers(spec, trace)
    assert len(layers) >= 2 and all(isinstance(record, MixerTrace) for _, record in layers)  # Qwen's attention too
    real = mask.bool()
    for mixer, record in layers:
        with torch.no_grad():
            frozen = frozen_mixer(mixer, record)
            parts = frozen.token_parts()
            torch.testing.assert_close((parts.sum(2) + frozen.unattributed())[real], record.output[real],
                                       rtol=1e-4, atol=1e-5)  # fmt: skip
            assert (parts[:, torch.ones(11, 11, dtype=torch.bool).triu(1)] == 0).all()
            torch.testing.assert_close(frozen.head_parts().sum(2), parts, rtol=1e-5, atol=1e-6)
            for keys in (slice(0, 3), slice(4, 9), slice(9, 11)):
                torch.testing.assert_close(frozen.token_parts(slice(2, 10), keys), parts[:, 2:10, keys],
                                           rtol=1e-5, atol=1e-6)  # fmt: skip
            rows = frozen.map_rows()[:, 0]
            torch.testing.assert_close(rows.sum(-1)[real], torch.ones(int(real.sum())))
            if frozen.per_head:  # read per head: the per-channel reading's map
                per_channel = dataclasses.replace(frozen, per_head=False).map_rows()[:, 0]
                torch.testing.assert_close(rows, per_channel, rtol=1e-5, atol=1e-6)
            total, own = frozen.totals(slice(2, 11))  # without a part per pair: the parts' sum, the diagonal's
            torch.testing.assert_close(total, parts[:, 2:].sum(2), rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(own, parts[:, torch.arange(2, 11), torch.arange(2, 11)], rtol=1e-4, atol=1e-5)


def rerun_zeroed(model, ids, mask, block, inputs, token: int) -> torch.Tensor:
    """``block``'s output in the model run again with ``token``'s ``channels`` of each ``(projection, channels)`` of
    ``inputs`` zeroed (parallel mixers: in every branch)."""
    outputs = {}

    def zeroing(channels):
        def zero(_module, _args, output):
            output = output.clone()
            output[:, token, channels] = 0
            return output

        return zero

    def keep(_module, _args, output):
        outputs["hidden"] = output[0] if isinstance(output, tuple) else output

    zeroed = [(projection, zeroing(channels)) for projection, channels in inputs]
    with forward_hooks(*zeroed, (block, keep)), torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    return outputs["hidden"]


@pytest.mark.parametrize("family", [family for family in MIXER_FAMILIES if not refused(family, "value_zeroing")])
def test_value_zeroing_of_a_mixer_is_the_model_rerun_with_the_tokens_value_input_zeroed(family):
    """Each mixer layer's value-zeroing distances (a left-padded batch; the first two layers) are those of the real
    model run again with a forward hook that zeroes token ``j``'s value input to that mixer (its slice of the input
    projection's output), the layer's output read off the run and compared with the clean one: the mixer, its
    activation, gate and norm, the residual and the FFN all the model's own."""
    from inseq_mixing.methods.value_zeroing import distance, zeroing_distances

    model = hybrid(family)
    spec = get_spec(model)
    ids, mask = padded_batch()
    trace = trace_model(model, ids, mask)
    real = mask.bool()
    for index, (layer, record) in enumerate(zip(spec.decoder.layers, trace.decoder.layers, strict=True)):
        if not isinstance(layer.self_attn, MixerSpec) or index > 1:  # a pass per token: the first two layers
            continue
        with torch.no_grad():
            scores = zeroing_distances(layer, record, "self", causal=True)
        naive = torch.zeros_like(scores)
        inputs = mixer_value_inputs(layer.self_attn.module)
        for token in range(ids.shape[1]):
            naive[:, :, token] = distance(rerun_zeroed(model, ids, mask, layer.module, inputs, token), record.output,
                                          "cosine")  # fmt: skip
        later = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).triu(1)
        cells = real[:, :, None] & real[:, None, :] & ~later
        torch.testing.assert_close(scores[cells], naive[cells], rtol=1e-3, atol=1e-6, msg=f"layer {index}")
        assert scores[cells].max() > 1e-3


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_alti_logit_adds_up_to_the_models_own_logits_with_and_without_foils(family):
    """Token scores plus the terms no token carries are the model's own logit of every explained token (the mixers'
    conv bias and output bias among the unattributed), with a foil the logit difference, and per head the parts
    add up to each layer's part."""
    model = hybrid(family)
    ids, mask = padded_batch()
    trace = trace_model(model, ids, mask)
    predicted = next_tokens({"input_ids": ids})
    foils = (predicted + 7) % 50 + 5
    logits = trace.logits.gather(-1, predicted[..., None])[..., 0] - trace.logits.gather(-1, foils[..., None])[..., 0]
    for explained, own in ((None, trace.logits.gather(-1, predicted[..., None])[..., 0]), (foils, logits)):
        scores = alti_logit(trace, predicted, explained)
        found = scores.target.sum(-1) + sum(scores.unattributed.values())
        real = mask.bool()
        torch.testing.assert_close(found[real], own[real], rtol=1e-4, atol=1e-4)
        assert scores.target.abs().sum() > 0
    from inseq_mixing.methods.readout import sweep_logit, unembedding_direction

    direction = unembedding_direction(trace.spec, predicted, None)
    plain, heads = sweep_logit(trace, direction), sweep_logit(trace, direction, per_head=True)
    for layer, (whole, split) in enumerate(zip(plain.self_parts, heads.self_parts, strict=True)):
        torch.testing.assert_close(split.sum(1), whole, rtol=1e-4, atol=1e-5, msg=f"layer {layer}")


@pytest.mark.parametrize("method", MIXER_READERS)
@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_every_mixer_reader_gives_causal_rows_and_a_padded_row_is_that_row_alone(family, method):
    """Each method that reads mixers, on a left-padded batch: no weight on later tokens, the rows of ALTI, GlobEnc
    and rollout sum to 1, and the padded row's real positions are that row explained alone. A method that refuses
    the family's mixers (value zeroing on Jamba's Mamba layers) says why before any forward pass."""
    model = hybrid(family)
    ids, mask = padded_batch()
    declaration = DECLARATIONS[method]
    if refused(family, method):
        request = request_of(model, ids, mask, None)
        request.tracer = lambda: trace_model(model, ids, mask)  # traced when first read: never, here
        calls = []
        with forward_hooks((model, lambda *_: calls.append(1))), pytest.raises(UnsupportedModelError, match="layer 0"):
            declaration.run(request, declaration.options())
        assert calls == []
        return
    batch = declaration.run(request_of(model, ids, mask, trace_model(model, ids, mask)), declaration.options())
    alone_ids, alone_mask = ids[1:, 3:], mask[1:, 3:]
    alone = declaration.run(request_of(model, alone_ids, alone_mask, trace_model(model, alone_ids, alone_mask)),
                            declaration.options())  # fmt: skip
    target = batch.target  # (B, T, T[, layers])
    later = torch.ones(11, 11, dtype=torch.bool).triu(1)
    assert (target[:, later] == 0).all()
    if declaration.rows_sum_to_one:
        sums = target[1, 3:, 3:].sum(1)
        torch.testing.assert_close(sums, torch.ones_like(sums))
    torch.testing.assert_close(target[1, 3:, 3:], alone.target[0], rtol=1e-4, atol=PADDED_ATOL.get(family, 2e-5))


@pytest.mark.parametrize("family", MIXER_FAMILIES)
def test_attn_lrp_through_mixers_without_biases_gives_the_tokens_the_whole_logit(family):
    """A hybrid of mixer layers only (no attention, so no softmax rule) with every bias zeroed: under MambaLRP's rules
    (the mixing's parameters constants, the gates' products halved, ``silu``'s gate and the norms' statistics frozen)
    the tokens' relevances add up to the logit at every position, and the relevance is not plain Gradient×Input."""
    from inseq_mixing.methods.attn_lrp import attn_lrp

    model = tiny_model(family, layers=1)  # layer 0: a mixer
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.zero_()
    if family.startswith("falcon_h1"):  # attention beside the mixer in every block: silenced (output multiplier 0)
        model.model.layers[0].attn_out_multiplier = 0.0
    if family.startswith("zamba"):  # its shared attention block at layer 0 silenced (its output's linear map zeroed)
        with torch.no_grad():
            model.model.layers[0].linear.weight.zero_()
    spec = get_spec(model)
    assert all(isinstance(layer.self_attn, MixerSpec) for layer in spec.decoder.layers)
    ids, mask = padded_batch()
    predicted = next_tokens({"input_ids": ids})
    own = [dict(vars(module)) for module in model.modules()]
    scores = attn_lrp(model, spec, ids, mask, None, None, predicted)
    assert own == [dict(vars(module)) for module in model.modules()]  # LFM2-MoE's experts get their silu back
    real = mask.bool()
    torch.testing.assert_close(scores.target.sum(-1)[real], scores.logit[real], rtol=1e-4, atol=1e-4)
    assert scores.logit[real].abs().min() > 1e-3
    embeddings = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    logit = model(inputs_embeds=embeddings, attention_mask=mask, use_cache=False).logits[0, -1, predicted[0, -1]]
    plain = (torch.autograd.grad(logit, embeddings)[0] * embeddings).sum(-1)[0].detach()
    assert not torch.allclose(plain, scores.target[0, -1], atol=1e-3)


@pytest.mark.parametrize("family", ["falcon_h1", "granitemoehybrid", "zamba2"])
def test_attn_lrp_of_a_span_in_one_pass_is_the_sum_of_its_tokens_on_hybrids(family):
    """A span's AttnLRP in one backward pass (its logit read from the LM head's input) equals its positions' AttnLRP
    summed, on hybrids whose logits the model scales after the head (Falcon-H1's multiplier, Granite 4's divisor:
    ``ModelSpec.scale_after_head``) and on Zamba 2's shared attention blocks."""
    from inseq_mixing.methods.attn_lrp import lrp_of_call, span_lrp_of_call
    from inseq_mixing.trace import ModelCall, forward_arguments

    model = hybrid(family)
    spec = get_spec(model)
    ids, mask = padded_batch()
    predicted = next_tokens({"input_ids": ids})
    positions = torch.zeros(ids.shape, dtype=torch.bool)
    positions[0, 2:6] = True
    positions[1, 5:] = True
    call = ModelCall(model, forward_arguments(model, spec, ids, mask, None, None))
    each = lrp_of_call(spec, call, predicted, None, positions, max_chunk_elements=2**26)
    span = span_lrp_of_call(spec, call, predicted, None, positions)
    torch.testing.assert_close(span.logit, each.logit.sum(1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(span.target, each.target.sum(1), atol=1e-5, rtol=1e-4)


def test_attn_lrp_gives_every_shared_attention_block_the_stacks_input_leaf_as_its_embeddings():
    """Zamba 2's blocks read the embeddings besides their input: in an AttnLRP pass each hybrid block gets the first
    block's input leaf itself as its embeddings (so their relevance reaches the tokens), and the model's own
    embeddings argument outside the pass."""
    from inseq_mixing.methods.attn_lrp import lrp_pass

    model = hybrid("zamba2")
    spec = get_spec(model)
    hybrids = [layer.module for layer in spec.decoder.layers if layer.self_attn.reads_embeddings]
    assert len(hybrids) == 2
    given = []

    def keep(_module, args, kwargs, _output):  # the arguments the block's forward got (after the pass's hooks)
        given.append(args[1] if len(args) > 1 else kwargs["original_hidden_states"])

    ids, mask = padded_batch()
    with forward_hooks(*[(block, keep) for block in hybrids], with_kwargs=True):
        with lrp_pass(model, spec) as recorded:
            model(input_ids=ids, attention_mask=mask)
        leaf = recorded["decoder"]
        assert len(given) == 2 and all(tensor is leaf for tensor in given)
        model(input_ids=ids, attention_mask=mask)
    assert len(given) == 4 and all(tensor is not leaf for tensor in given[2:])


@pytest.mark.parametrize("family", MIXER_FAMILIES)
def test_attn_lrp_on_a_hybrid_is_causal_its_own_logit_and_a_padded_row_alone(family):
    """AttnLRP on a hybrid (a mixer, attention, a mixer): finite causal scores, the model's own logits, a contrast
    the difference of the two explanations, and a left-padded row's scores those of that row alone."""
    from inseq_mixing.methods.attn_lrp import attn_lrp

    model = hybrid(family)
    spec = get_spec(model)
    ids, mask = padded_batch()
    predicted = next_tokens({"input_ids": ids})
    foils = (predicted + 7) % 50 + 5
    scores = attn_lrp(model, spec, ids, mask, None, None, predicted)
    later = torch.ones(11, 11, dtype=torch.bool).triu(1)
    assert torch.isfinite(scores.target).all() and (scores.target[:, later] == 0).all()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(scores.logit[real], logits.gather(-1, predicted[..., None])[..., 0][real],
                               rtol=1e-4, atol=LRP_LOGIT_ATOL.get(family, 1e-4))  # fmt: skip
    foil = attn_lrp(model, spec, ids, mask, None, None, foils)
    contrast = attn_lrp(model, spec, ids, mask, None, None, predicted, foil_ids=foils)
    torch.testing.assert_close(contrast.target, scores.target - foil.target, rtol=1e-4, atol=1e-5)
    alone = attn_lrp(model, spec, ids[1:, 3:], mask[1:, 3:], None, None, predicted[1:, 3:])
    torch.testing.assert_close(scores.target[1, 3:, 3:], alone.target[0], rtol=1e-4,
                               atol=PADDED_ATOL.get(family, 1e-5))  # fmt: skip


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_a_trace_of_attention_alone_and_a_long_trace_give_rollouts_maps(family, monkeypatch):
    """Rollout from a trace that keeps only what it reads (the mixers' inputs and masks, attention's), and from one
    that recomputes attention by blocks of rows, equals rollout from a trace that keeps everything."""
    import inseq_mixing.trace as trace_module

    model = hybrid(family)
    ids, mask = padded_batch()
    declaration = DECLARATIONS["attention_rollout"]
    kept = declaration.run(request_of(model, ids, mask, trace_model(model, ids, mask)), declaration.options())
    monkeypatch.setattr(trace_module, "ROW_BLOCK_BYTES", 1)  # blocks of one row
    light = trace_model(model, ids, mask, keep_probs=False, records="attention")
    found = declaration.run(request_of(model, ids, mask, light), declaration.options())
    torch.testing.assert_close(found.target, kept.target, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_inseq_explains_a_hybrid_and_the_span_front_end_too(family):
    """``inseq.load_model`` on a hybrid: ALTI-logit's token scores add up to the step's logit with the unattributed
    terms, and rollout explains an answer span over the context (the long-context front end, unchanged)."""
    model = load_tiny(family, "alti_logit")
    out = model.attribute("the cat sat", "the cat sat on the mat", show_progress=False)
    sequence = out.sequence_attributions[0]
    assert torch.isfinite(sequence.target_attributions[: len(sequence.target) - 1].nan_to_num()).all()
    assert sequence.target_attributions.nan_to_num().abs().sum() > 0
    for method in [method for method in ("value_zeroing", "attn_lrp", "decompx") if not refused(family, method)]:
        found = load_tiny(family, method).attribute("the cat sat", "the cat sat on the mat", show_progress=False)
        assert found.sequence_attributions[0].target_attributions.nan_to_num().abs().sum() > 0, method
    units = load_tiny(family, "decompx").attribute("the cat sat . the dog ran .", "the cat sat . the dog ran . she",
                                                   show_progress=False, spans="answer", units="sentences",
                                                   unit_components=True)  # fmt: skip
    assert torch.isfinite(units.sequence_attributions[0].source_attributions).all()
    rollout = load_tiny(family, "attention_rollout")
    spans = rollout.attribute("the cat sat", "the cat sat on the mat", show_progress=False, spans="answer",
                              units="tokens")  # fmt: skip
    answer = spans.sequence_attributions[0].source_attributions[:, 0].double()  # the answer's mean rollout row
    torch.testing.assert_close(answer.sum(), torch.tensor(1.0, dtype=torch.float64))
    assert (answer >= 0).all() and (answer > 0).sum() > 1


def test_every_method_reads_the_hybrids_and_one_that_did_not_would_refuse_before_any_forward_pass():
    """Every method now reads Bamba's and LFM2's mixers; a method declared not to read mixers would refuse a hybrid
    naming the layer, its mixer and the methods that do, before the model runs once."""
    assert set(MIXER_READERS) == set(DECLARATIONS)
    model = load_tiny(HYBRID_FAMILIES[0], "alti")
    blind = dataclasses.replace(DECLARATIONS["alti"], name="blind", reads_mixers=False)
    calls = []
    with forward_hooks((model.model, lambda *_: calls.append(1))):
        with pytest.raises(UnsupportedModelError, match=r"blind .*layer 0 .* mamba2 layer.*alti_logit"):
            blind.check_sizes([InputSize(8)], ["Input 1"], get_spec(model.model), blind.options())
    assert calls == []


def test_decompx_through_a_mixer_gives_each_token_its_part():
    """DecompX's mixer step on components that are each token's own normed input (one component per token) gives
    each token's part of the mixer's output (:meth:`FrozenMixer.token_parts`, tested against the module), and its
    components add up to the mixer's output without its biases' paths."""
    for family in MIXER_FAMILIES:
        model = hybrid(family)
        spec = get_spec(model)
        ids, mask = padded_batch()
        trace = trace_model(model, ids, mask)
        for mixer, record in mixer_layers(spec, trace):
            frozen = frozen_mixer(mixer, record)
            with torch.no_grad():
                normed = record.input.float()
                own = torch.diag_embed(normed.transpose(1, 2)).permute(0, 2, 3, 1)  # (B, T, K=T, d): token k's own
                if mixer.reads_embeddings:  # Zamba 2's: each token's own embedding too
                    embedded = torch.diag_embed(record.call["embeddings"].float().transpose(1, 2)).permute(0, 2, 3, 1)
                    components = frozen.component_outputs(own, embedded)
                else:
                    components = frozen.component_outputs(own)
                torch.testing.assert_close(components, frozen.token_parts(), rtol=1e-4, atol=1e-6)


def test_inseq_and_inseq_mixing_load_a_hybrid_for_every_method():
    """Both entry points load a hybrid for every method; ``inseq_mixing.load_model`` explains it as Inseq does."""
    import inseq_mixing

    tokenizer = load_tiny("lfm2", "alti").tokenizer
    for method in MIXER_READERS:
        assert isinstance(
            inseq.load_model(hybrid("bamba"), method, tokenizer=tokenizer), inseq.models.AttributionModel
        )
    ours = inseq_mixing.load_model(hybrid("lfm2"), "alti", tokenizer=tokenizer)
    theirs = inseq.load_model(hybrid("lfm2"), "alti", tokenizer=tokenizer)
    found = [model.attribute("the cat", "the cat sat on", show_progress=False).sequence_attributions[0]
             for model in (ours, theirs)]  # fmt: skip
    torch.testing.assert_close(found[0].target_attributions, found[1].target_attributions, equal_nan=True)


def test_per_head_on_a_hybrid_whose_mixers_and_attention_have_other_head_counts_is_refused_before_the_work():
    """A Bamba whose Mamba-2 layers have 2 heads and its attention 4: ``per_head=True`` (one slot per head of every
    layer) is refused with the counts before any forward pass; with equal counts it runs."""
    import transformers

    config = transformers.BambaConfig(vocab_size=80, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, attn_layer_indices=[1],
                                      mamba_n_heads=2, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=4,
                                      mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=4)  # fmt: skip
    model = transformers.BambaForCausalLM(config).eval()
    spec, declaration = get_spec(model), DECLARATIONS["alti"]
    calls = []
    with forward_hooks((model, lambda *_: calls.append(1))):
        with pytest.raises(ValueError, match=r"per_head=True .* \[2, 4\] heads .* ask per_head=False"):
            declaration.check_sizes([InputSize(8)], ["Input 1"], spec, declaration.options(per_head=True))
    assert calls == []
    ids, mask = padded_batch()
    same = hybrid("bamba")
    trace = trace_model(same, ids, mask)
    found = declaration.run(request_of(same, ids, mask, trace), declaration.options(per_head=True))
    assert found.target.shape[1] == 3 * (4 + 1)  # three layers of H + 1 slots (4 heads and the residual)


def test_attn_lrp_rules_of_gated_attention_are_the_naive_rules_step_by_step():
    """Qwen3-Next's gated attention under AttnLRP (its forward replaced by the rules') gives its input the relevance a
    naive propagation writes out rule by rule from a relevance on its output: the ε-rule through ``o_proj``, the
    uniform rule on the gate's product, the identity rule on ``σ``, the uniform rule on ``A V`` (a key-value head's
    values shared by two query heads), the softmax rule, the uniform rule on ``q kᵀ``, the ε-rule through the
    partial rotary embedding, the q/k norms frozen, the ε-rule through the four projections."""
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention, Qwen3NextRotaryEmbedding

    from inseq_mixing.methods.attn_lrp import MIXER_RULES, lrp_rules
    from inseq_mixing.methods.mixers import attention_inputs, attention_probs

    config = Qwen3NextConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                             partial_rotary_factor=0.5, num_hidden_layers=1,
                             layer_types=["full_attention"])  # fmt: skip
    torch.manual_seed(0)
    module = Qwen3NextAttention(config, 0).double().eval()
    for parameter in module.parameters():
        torch.nn.init.normal_(parameter, std=0.4)
    length = 7
    x = torch.randn(1, length, 16, dtype=torch.double, requires_grad=True)
    rotary = Qwen3NextRotaryEmbedding(config)(x, torch.arange(length)[None])
    rotary = tuple(part.double() for part in rotary)
    direction = torch.randn(1, length, 16, dtype=torch.double)

    spec = type("Spec", (), {"stacks": {}})()  # the q/k norms' hooks: lrp_rules installs them model-wide
    with lrp_rules(module, spec):
        out, _ = MIXER_RULES["gated_attention"](module, x, None, rotary)
    (out * direction).sum().backward()
    relevance = (x * x.grad).detach()

    def linear_rule(inputs, weight, relevance_out):  # the ε-rule (ε → 0) of a linear map without bias
        return inputs * ((relevance_out / (inputs @ weight.T)) @ weight)

    with torch.no_grad():
        query, key, value, gate = attention_inputs(module, x, rotary, gated=True)
        probs = attention_probs(module, query, key, None)[0].double()  # float32 there, as in the rules
        values = value.repeat_interleave(2, dim=2).flatten(2)  # (1, T, H·P)
        mixed = torch.einsum("bhts,bshp->bthp", probs, values.unflatten(-1, (4, 8))).flatten(2)
        sig = torch.sigmoid(gate)
        out_naive = module.o_proj(mixed * sig)
        relevance_gated = linear_rule(mixed * sig, module.o_proj.weight, out_naive * direction)
        relevance_mixed, relevance_gate = relevance_gated / 2, relevance_gated / 2
        per_head = (relevance_mixed / mixed).unflatten(-1, (4, 8))  # (1, T, H, P)
        terms = probs[..., None] * values.unflatten(-1, (4, 8)).permute(0, 2, 1, 3)[:, :, None]  # (1, H, t, s, P)
        shares = terms * per_head.permute(0, 2, 1, 3)[:, :, :, None]
        relevance_probs, relevance_values = shares.sum(-1) / 2, shares.sum(2) / 2  # (1, H, t, s), (1, H, s, P)
        scores = (query @ key.repeat_interleave(2, 1).transpose(-1, -2)) * module.scaling
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, 0.0)
        relevance_scores = scores * (relevance_probs - probs * relevance_probs.sum(-1, keepdim=True))
        ratio = torch.where(causal, relevance_scores / scores, torch.zeros_like(scores)) * module.scaling / 2
        keys = key.repeat_interleave(2, 1)
        relevance_query = query * (ratio @ keys)  # (1, H, T, D)
        relevance_key = (keys * (ratio.transpose(-1, -2) @ query)).unflatten(1, (2, 2)).sum(2)  # (1, H_kv, T, D)
        relevance_value = relevance_values.unflatten(1, (2, 2)).sum(2).transpose(1, 2)  # (1, T, H_kv, P)

    rotate = __import__(type(module).__module__, fromlist=["apply_rotary_pos_emb"]).apply_rotary_pos_emb

    def back_to_the_projection(relevance_rotated, raw, norm):  # through RoPE (the ε-rule: linear), the frozen norm
        normed = norm(raw).transpose(1, 2).detach().requires_grad_(True)  # (1, heads, T, D)
        rotated = rotate(normed, normed, *rotary)[0]
        (grad,) = torch.autograd.grad(rotated, normed, relevance_rotated / rotated)
        return (normed * grad).detach().transpose(1, 2)  # (1, T, heads, D): the frozen norm passes it on

    with torch.no_grad():
        raw_query = module.q_proj(x).view(1, length, 4, 16)[..., :8]
        raw_key = module.k_proj(x).view(1, length, 2, 8)
    relevance_q = back_to_the_projection(relevance_query, raw_query, module.q_norm)
    relevance_k = back_to_the_projection(relevance_key, raw_key, module.k_norm)
    with torch.no_grad():
        q_weight = module.q_proj.weight.view(4, 16, 16)
        naive = linear_rule(x, q_weight[:, :8].flatten(0, 1), relevance_q.flatten(2))
        naive += linear_rule(x, q_weight[:, 8:].flatten(0, 1), relevance_gate)
        naive += linear_rule(x, module.k_proj.weight, relevance_k.flatten(2))
        naive += linear_rule(x, module.v_proj.weight, relevance_value.flatten(2))
    torch.testing.assert_close(out.detach(), out_naive, rtol=1e-5, atol=1e-6)  # the rules' float32 probabilities
    torch.testing.assert_close(relevance, naive, rtol=1e-4, atol=1e-5)
    assert relevance.abs().max() > 0.1


@pytest.mark.parametrize("method", ["alti", "attention_rollout", "attention_flow", "globenc"])
def test_a_block_without_a_token_mixer_leaves_the_rolled_out_maps_as_they_were(method):
    """Nemotron-H's FFN block mixes no tokens (a block without a token mixer, read as one that adds nothing with the
    identity as its map): the maps rolled out through a Mamba-2 block, an attention block and that FFN block are
    those rolled out through the first two alone (the same model with its last block removed)."""
    model = tiny_model("nemotron_h", layers=3)
    assert get_spec(model).decoder.layers[2].self_attn.kind == "none"
    ids, mask = padded_batch()
    declaration = DECLARATIONS[method]
    full = declaration.run(request_of(model, ids, mask, trace_model(model, ids, mask)), declaration.options())
    model.model.layers = model.model.layers[:2]
    model.config.layers_block_type = model.config.layers_block_type[:2]
    model.config.num_hidden_layers = 2
    cut = declaration.run(request_of(model, ids, mask, trace_model(model, ids, mask)), declaration.options())
    real = mask.bool()
    cells = real[:, :, None] & real[:, None, :]
    assert full.target.shape == cut.target.shape
    torch.testing.assert_close(full.target[cells], cut.target[cells], rtol=1e-5, atol=1e-6)


def test_nemotron_h_mixture_of_experts_blocks_are_refused_with_the_reason():
    """Nemotron-H's experts have no gate and sit behind latent projections: such a block is refused when the model is
    read, naming the layer and what to explain instead."""
    import transformers

    config = transformers.NemotronHConfig(
        vocab_size=64, hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=8, mamba_num_heads=4,
        mamba_head_dim=8, n_groups=2, ssm_state_size=4, conv_kernel=4, chunk_size=4, intermediate_size=32,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, moe_shared_expert_intermediate_size=16,
        layers_block_type=["linear_attention", "moe"], num_hidden_layers=2,
    )  # fmt: skip
    with pytest.raises(UnsupportedModelError, match=r"moe blocks \(layer 1\).*no gate"):
        get_spec(transformers.NemotronHForCausalLM(config))


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_decompx_adds_up_at_every_layer_and_at_the_logit(family):
    """DecompX on each family (a left-padded batch): the components add up to every recorded block output, through
    mixers, missing sub-blocks, mixtures and the branches' multipliers, and the token scores (with the biases' share
    kept apart) to the model's own logit."""
    from inseq_mixing.methods.decompx import DecompXOptions, decompx

    from .test_decompx import assert_complete

    model = hybrid(family)
    ids, mask = padded_batch()
    trace = trace_model(model, ids, mask)
    predicted = next_tokens({"input_ids": ids})
    for options in (DecompXOptions(), DecompXOptions(bias="separate")):
        scores = decompx(trace, predicted, options=options, keep_layers=True)
        assert_complete(trace, scores, 1e-4)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits.gather(-1, predicted[..., None])[..., 0]
    torch.testing.assert_close(scores.logit[mask.bool()], logits[mask.bool()], rtol=1e-4, atol=1e-4)


def test_decompx_on_a_bias_free_zamba2_leaves_nothing_to_the_bias_component():
    """Zamba 2 with every bias zeroed: DecompX's token components (the embeddings' path through each shared attention
    block read from the stack's input's components) add up to the logit with nothing left to the bias component, and
    the embeddings' path carries part of the logit (without it, that part is left to the bias component)."""
    from inseq_mixing.methods.decompx import DecompXOptions, decompx

    model = tiny_model("zamba2", layers=3)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias") and not name.endswith("dt_bias"):  # dt_bias is a step's offset, not an output's
                parameter.zero_()
    ids = padded_batch()[0][:1]
    trace = trace_model(model, ids)
    predicted = next_tokens({"input_ids": ids})
    scores = decompx(trace, predicted, options=DecompXOptions(bias="separate"))
    assert scores.logit.abs().min() > 1e-2
    torch.testing.assert_close(scores.bias, torch.zeros_like(scores.bias), rtol=0, atol=1e-4)
    torch.testing.assert_close(scores.target.sum(-1), scores.logit, rtol=1e-4, atol=1e-4)


def delta_rule_by_recurrence(query, key, beta, log_decay) -> torch.Tensor:
    """The gated delta rule's mixing from its definition, step by step: the state
    ``S_t = α_t S_{t−1} (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ`` run with token ``s``'s value the ``s``-th unit vector, so
    that ``o_t = S_t q_t`` is row ``t`` of ``W`` (``(B, H, T, dk)`` queries and keys, ``(B, H, T)`` steps and log
    decays)."""
    batch, heads, length, width = query.shape
    state = query.new_zeros(batch, heads, length, width)  # values are unit vectors: T rows
    rows = []
    for t in range(length):
        k, q = key[:, :, t], query[:, :, t]
        kept = state - beta[:, :, t, None, None] * (state @ k[..., None]) * k[:, :, None, :]
        state = log_decay[:, :, t, None, None].exp() * kept
        state[:, :, t] += beta[:, :, t, None] * k
        rows.append((state @ q[..., None])[..., 0])
    return torch.stack(rows, dim=2)


@settings(max_examples=40, deadline=None)
@given(length=st.integers(1, 19), width=st.integers(1, 6), chunk=st.integers(1, 8), heads=st.integers(1, 3),
       decay=st.floats(0.0, 8.0), seed=st.integers(0, 2**16))  # fmt: skip
def test_the_chunked_delta_rule_is_the_recurrence(length, width, chunk, heads, decay, seed):
    """For every length, key width, chunk size (one position, uneven last chunks, one chunk for all), head count and
    strength of decay (log decays down to −8 a step: the chunk's running decay underflows towards 0), the chunked
    mixing equals the delta rule run step by step (float64; unit keys and steps in (0, 1) as the layers make them)."""
    from inseq_mixing.methods.mixers import delta_rule_mixing

    generator = torch.Generator().manual_seed(seed)
    shape = (2, heads, length, width)
    query = torch.randn(shape, generator=generator, dtype=torch.float64)
    key = torch.nn.functional.normalize(torch.randn(shape, generator=generator, dtype=torch.float64), dim=-1)
    beta = torch.rand(shape[:3], generator=generator, dtype=torch.float64)
    log_decay = -decay * torch.rand(shape[:3], generator=generator, dtype=torch.float64)
    expected = delta_rule_by_recurrence(query, key, beta, log_decay)
    torch.testing.assert_close(delta_rule_mixing(query, key, beta, log_decay, chunk), expected, rtol=1e-10,
                               atol=1e-12)  # fmt: skip


def test_a_gated_deltanet_layer_read_in_chunks_gives_its_own_output(monkeypatch):
    """With chunks of 4 positions (11 tokens: three chunks, the last uneven), every Gated DeltaNet layer of the traced
    Qwen3-Next (a left-padded batch) still gives token parts that add up to its recorded output, and the same mixing
    as one chunk for all."""
    import inseq_mixing.methods.mixers as mixers

    model = hybrid("qwen3_next")
    spec = get_spec(model)
    ids, mask = padded_batch()
    trace = trace_model(model, ids, mask)
    real = mask.bool()
    layers = [(mixer, record) for mixer, record in mixer_layers(spec, trace) if mixer.kind == "gated_deltanet"]
    assert len(layers) == 2
    for mixer, record in layers:
        whole = frozen_mixer(mixer, record).mixing
        monkeypatch.setattr(mixers, "DELTA_RULE_CHUNK", 4)
        record.slot.clear()
        with torch.no_grad():
            frozen = frozen_mixer(mixer, record)
            torch.testing.assert_close((frozen.token_parts().sum(2) + frozen.unattributed())[real],
                                       record.output[real], rtol=1e-4, atol=1e-5)  # fmt: skip
        torch.testing.assert_close(frozen.mixing, whole, rtol=1e-5, atol=1e-6)
        monkeypatch.setattr(mixers, "DELTA_RULE_CHUNK", 64)
        record.slot.clear()


@pytest.mark.parametrize("method", ["alti_logit", "decompx", "attn_lrp"])
@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_logit_methods_on_a_bfloat16_hybrid_give_float32_scores_that_add_up_to_its_logit(family, method):
    """The model in bfloat16 (its mixers' and attention's own forward in bfloat16; the methods freeze and sum in
    float32): finite float32 scores, on a left-padded batch, causal; ALTI-logit's and DecompX's adding up with the
    unattributed terms to the model's own bfloat16 logit within the logit's rounding. (AttnLRP's relevance pass runs
    the mixers under its rules in float32, so its logit is the model's with float32 mixers: up to 9% of the largest
    logit away from the bfloat16 forward's on these models; it is not compared.) The bound: the parts are rebuilt in
    float32 from states each rounded to bfloat16 (half an ulp, 2⁻⁹ relatively), two stored sums a block, the final
    norm and the head: about eight roundings of states whose readout reaches the logit's scale, ≈ 1.6% of the largest
    logit, doubled for the final norm's rounded statistics: 5%. (Against the float32 model's scores there is no such
    bound: a Mamba model's own bfloat16 forward moves its logits by up to 15% of the largest here.)"""
    from inseq_mixing.methods.attn_lrp import attn_lrp
    from inseq_mixing.methods.decompx import decompx

    from .test_decompx import logit_total

    ids, mask = padded_batch()
    predicted = next_tokens({"input_ids": ids})
    model = tiny_model(family, layers=3).to(torch.bfloat16)
    real = mask.bool()
    if method == "attn_lrp":
        scores = attn_lrp(model, get_spec(model), ids, mask, None, None, predicted)
        own = total = scores.logit
    else:
        trace = trace_model(model, ids, mask)
        scores = (alti_logit if method == "alti_logit" else decompx)(trace, predicted)
        own = scores.logit
        total = scores.target.sum(-1) + sum(scores.unattributed.values()) if method == "alti_logit" else (
            logit_total(scores))  # fmt: skip
    assert scores.target.dtype == torch.float32 and torch.isfinite(scores.target[real]).all()
    assert (scores.target[:, torch.ones(11, 11, dtype=torch.bool).triu(1)] == 0).all()
    assert scores.target[real].abs().sum() > 0
    assert (total - own)[real].abs().max() < 0.05 * own[real].abs().max()


def test_a_request_counts_the_parts_zamba2s_hybrid_blocks_form_per_pair_and_refuses_too_long_a_one():
    """A Zamba 2 hybrid block's parts carry, per pair of positions, the shared FFN's hidden units (wider than its
    mixer's heads): a request with room for the heads' matrices but not for those parts is refused before the model
    runs; with room for them it is not."""
    length, declaration = 512, DECLARATIONS["alti"]
    model = hybrid("zamba2")
    spec = get_spec(model)
    shared = next(layer.self_attn for layer in spec.decoder.layers if layer.self_attn.reads_embeddings)
    width = model.config.intermediate_size
    assert shared.pair_elements == width > shared.num_heads
    ids, mask = padded_batch()
    with torch.no_grad():  # the FFN's hidden parts of every (position, token) pair are formed, as counted
        frozen = frozen_mixer(
            shared,
            next(
                record.self_attn
                for layer, record in zip(
                    spec.decoder.layers, trace_model(model, ids, mask).decoder.layers, strict=True
                )
                if layer.self_attn is shared
            ),
        )
        assert frozen.gate.shape[-1] == width
    calls = []
    room = 2 * shared.num_heads * length * length * 4 * 2  # twice the heads' matrices, float32
    with forward_hooks((model, lambda *_: calls.append(1))), pytest.raises(ValueError, match=r"GiB are free.*"):
        declaration.check_sizes([InputSize(length)], ["Input 1"], spec, declaration.options(), memory=(4, room))
    assert calls == []
    declaration.check_sizes([InputSize(length)], ["Input 1"], spec, declaration.options(),
                            memory=(4, 2 * width * length * length * 4))  # fmt: skip


def test_a_request_counts_a_hybrids_mixing_matrices_and_too_long_a_one_is_refused_before_any_work():
    """ALTI reads a long trace by blocks of query rows, so on attention alone it holds one layer's map at most
    (``2 × T²``); a hybrid's mixer is frozen whole (its ``heads × T²`` mixing, as the frozen mixer holds it), so with
    room for the map but not for the mixing the hybrid is refused with the numbers before the model runs, and a
    Transformer of the same length is not."""
    length, declaration = 512, DECLARATIONS["alti"]
    model = hybrid("bamba")
    spec = get_spec(model)
    ids, mask = padded_batch()
    mixer, record = mixer_layers(spec, trace_model(model, ids, mask))[0]
    assert frozen_mixer(mixer, record).mixing.shape[1] == mixer.num_heads > 2
    free = 4 * length * length * 4  # twice one layer's map and the product it enters, in float32
    calls = []
    with forward_hooks((model, lambda *_: calls.append(1))), pytest.raises(ValueError, match=r"GiB are free.*"):
        declaration.check_sizes([InputSize(length)], ["Input 1"], spec, declaration.options(), memory=(4, free))
    assert calls == []
    llama = tiny_model("llama")
    declaration.check_sizes([InputSize(length)], ["Input 1"], get_spec(llama), declaration.options(), memory=(4, free))
