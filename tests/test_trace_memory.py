"""A trace that holds one layer's attention probabilities at most (issue 52, item 1): above ``KEPT_PROBS_BYTES`` it
keeps each attention call's arguments and recomputes a layer's probabilities when read. The recomputed probabilities
are the forward pass's bit for bit on every family (generation, encoder-only, speech, vision), every method gives the
same scores from either trace, and the bytes a long trace holds are counted."""

import dataclasses

import pytest
import torch

import inseq_mixing.trace as trace_module
from inseq_mixing.declarations import DECLARATIONS, Request
from inseq_mixing.testing import (
    ALL_FAMILIES,
    ENCODER_FAMILIES,
    SPEECH_FAMILIES,
    VISION_FAMILIES,
    is_seq2seq,
    speech_processor,
    synthetic_audio,
    synthetic_image,
    tiny_encoder,
    tiny_model,
    tiny_speech,
    tiny_vision,
    vision_processor,
)
from inseq_mixing.trace import ModelCall, ProbsSource, trace_call, trace_model

from .conftest import example_kwargs, get_tiny, next_tokens, trace_of

#: Methods whose math reads the recorded probabilities, one for each place that reads them (ALTI's parts, the logit
#: read-out, DecompX, value zeroing, the norms, the rollout's layer maps).
READERS = ("alti_logit", "decompx", "value_zeroing", "attention_norm", "globenc", "attention_rollout")


def attention_records(trace):
    for stack in (trace.decoder, trace.encoder):
        for layer in [] if stack is None else stack.layers:
            yield from (record for record in (layer.self_attn, layer.cross_attn) if record is not None)


def assert_same_probs(kept, recomputed) -> None:
    pairs = list(zip(attention_records(kept), attention_records(recomputed), strict=True))
    assert pairs and all(record.source is not None and record.kept_probs is None for _, record in pairs)
    for first, second in pairs:
        assert torch.equal(first.probs.nan_to_num(-1.0), second.probs.nan_to_num(-1.0))


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_recomputed_probabilities_are_the_forward_passes_on_every_generation_family(family):
    model = get_tiny(family)
    kwargs = example_kwargs(family, batch=2)
    kwargs["attention_mask"] = torch.ones_like(kwargs["input_ids"])
    kwargs["attention_mask"][1, :2] = 0  # padding in the second row (left for decoder-only, as the front ends pad)
    if is_seq2seq(family):
        kwargs["attention_mask"] = kwargs["attention_mask"].flip(-1)  # right padding for an encoder
    assert_same_probs(trace_of(model, kwargs, keep_probs=True), trace_of(model, kwargs, keep_probs=False))


@pytest.mark.parametrize("family", ENCODER_FAMILIES)
def test_recomputed_probabilities_on_every_encoder_family(family):
    model = tiny_encoder(family)
    ids, mask = torch.tensor([[2, 9, 10, 11, 12, 3], [2, 9, 10, 3, 0, 0]]), torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0
    assert_same_probs(trace_model(model, ids, mask, keep_probs=True), trace_model(model, ids, mask, keep_probs=False))


@pytest.mark.parametrize("family", [*SPEECH_FAMILIES, *VISION_FAMILIES])
def test_recomputed_probabilities_on_every_speech_and_vision_family(family):
    if family in SPEECH_FAMILIES:
        model, processor = tiny_speech(family), speech_processor(family)
        inputs = dict(processor.feature_extractor(synthetic_audio(0.5), sampling_rate=16_000, return_tensors="pt"))
        if family == "whisper":
            inputs["decoder_input_ids"] = torch.tensor([[1, 5, 6]])
    else:
        model, processor = tiny_vision(family), vision_processor(family)
        inputs = dict(processor(images=[synthetic_image()], return_tensors="pt"))
    from inseq_mixing.specs import get_spec

    spec = get_spec(model)
    inputs.pop("attention_mask", None)
    masks = _masks(model, spec, inputs)
    call = ModelCall(model, inputs, frame_masks=masks)
    assert_same_probs(trace_call(spec, call, True, True), trace_call(spec, call, True, False))


def _masks(model, spec, inputs: dict) -> dict:
    """All-ones frame masks of the stacks, sized by a plain forward pass's hidden states."""
    with torch.no_grad():
        output = model(**inputs, output_hidden_states=True)
    masks = {}
    if spec.is_encoder_decoder:
        masks["encoder"] = torch.ones(output.encoder_hidden_states[-1].shape[:2], dtype=torch.long)
        masks["decoder"] = torch.ones(inputs["decoder_input_ids"].shape, dtype=torch.long)
    else:
        masks["decoder"] = torch.ones(output.hidden_states[-1].shape[:2], dtype=torch.long)
    return masks


def results_equal(first, second) -> bool:
    """Whether two method results hold the same tensors, bit for bit (NaN cells alike)."""
    for item in dataclasses.fields(first):
        a, b = getattr(first, item.name), getattr(second, item.name)
        if isinstance(a, dict):
            if a.keys() != b.keys() or not all(torch.equal(a[key].nan_to_num(-1.0), b[key].nan_to_num(-1.0))
                                               for key in a):  # fmt: skip
                return False
        elif isinstance(a, torch.Tensor):
            if not torch.equal(a.nan_to_num(-1.0), b.nan_to_num(-1.0)):
                return False
        elif a != b:
            return False
    return True


@pytest.mark.parametrize("method", READERS)
@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_every_method_gives_the_same_scores_without_kept_probabilities(family, method):
    model = get_tiny(family)
    kwargs = example_kwargs(family, batch=2, seed=1)
    from inseq_mixing.specs import get_spec

    spec = get_spec(model)
    ids, target = kwargs["input_ids"], kwargs.get("decoder_input_ids")
    decoder = ids if target is None else target
    results = []
    for keep in (True, False):
        traced = trace_of(model, kwargs, keep_probs=keep)
        target_mask = None if target is None else torch.ones_like(target)
        request = Request(spec, model, torch.ones_like(ids), target, target_mask, next_tokens(kwargs), None,
                          torch.ones_like(decoder, dtype=torch.bool), lambda traced=traced: traced)  # fmt: skip
        declaration = DECLARATIONS[method]
        results.append(declaration.run(request, declaration.options()))
    assert results_equal(*results)


def reachable_tensors(root) -> list[torch.Tensor]:
    """Every tensor a trace holds (through its dataclasses, lists, tuples, dictionaries and probability sources),
    each storage once."""
    found, seen, stack = {}, set(), [root]
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            found.setdefault(value.untyped_storage().data_ptr(), value)
        elif id(value) in seen or isinstance(value, torch.nn.Module):
            continue
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            seen.add(id(value))
            stack += [getattr(value, item.name) for item in dataclasses.fields(value)]
        elif isinstance(value, ProbsSource):
            seen.add(id(value))
            stack += [value.args, value.kwargs, value.slot]
        elif isinstance(value, list | tuple):
            seen.add(id(value))
            stack += list(value)
        elif isinstance(value, dict):
            seen.add(id(value))
            stack += list(value.values())
    return list(found.values())


def quadratic_bytes(trace, length: int) -> int:
    """The bytes of the held tensors that grow with the square of the length (probabilities, masks, biases)."""
    return sum(t.untyped_storage().nbytes() for t in reachable_tensors(trace) if t.numel() >= length * length)


def test_a_long_trace_holds_one_layers_probabilities_at_most(monkeypatch):
    layers, heads, length = 6, 4, 384
    model = tiny_model("gpt2", layers=layers, heads=heads, d_model=32)
    ids = torch.randint(5, 60, (1, length), generator=torch.Generator().manual_seed(0))
    one_layer = heads * length * length * 4  # float32
    kept = trace_model(model, ids, keep_probs=True)
    assert quadratic_bytes(kept, length) >= layers * one_layer  # every layer's probabilities
    monkeypatch.setattr(trace_module, "KEPT_PROBS_BYTES", layers * one_layer - 1)  # just below: the trace chooses
    trace = trace_model(model, ids)
    assert all(record.kept_probs is None for record in attention_records(trace))
    limit = one_layer + length * length * 4  # one layer's probabilities, and one (1, 1, T, T) mask shared by all
    assert quadratic_bytes(trace, length) <= limit - one_layer  # nothing read yet: no layer's probabilities
    for layer, kept_layer in zip(trace.decoder.layers, kept.decoder.layers, strict=True):  # a layer at a time,
        probs = layer.self_attn.probs  # as the methods read them
        assert torch.equal(probs, kept_layer.self_attn.probs)
        del probs
        assert quadratic_bytes(trace, length) <= limit
    kept_scores = DECLARATIONS["alti"].compute(_request(model, ids, kept), DECLARATIONS["alti"].options())
    lazy_scores = DECLARATIONS["alti"].compute(_request(model, ids, trace), DECLARATIONS["alti"].options())
    assert torch.equal(kept_scores.target, lazy_scores.target)


def _request(model, ids, trace) -> Request:
    from inseq_mixing.specs import get_spec

    mask = torch.ones_like(ids)
    return Request(get_spec(model), model, mask, None, None, torch.roll(ids, -1, 1), None, mask.bool(),
                   lambda: trace)  # fmt: skip


def test_an_argument_changed_in_place_is_refused_not_recomputed_wrongly():
    model = tiny_model("gpt2")
    trace = trace_model(model, torch.tensor([[5, 6, 7, 8]]), keep_probs=False)
    record = trace.decoder.layers[1].self_attn
    tensor = next(value for value in record.source.args if isinstance(value, torch.Tensor))
    tensor.mul_(2.0)
    with pytest.raises(trace_module.TraceError, match="changed in place"):
        _ = record.probs


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma2", "opt_post_ln", "gpt_neox"])
def test_rollouts_one_layer_at_a_time_equal_every_depths_rollout_on_the_rows_read(family):
    """ALTI, attention rollout and GlobEnc rolled out top-down for the rows from the first explained one (one layer's
    map held at a time) equal the rows of the rollout of every layer's maps; ALTI-logit summed in Horner's form
    equals its parts traced back through every depth's rollout."""
    from inseq_mixing.methods.alti import alti, alti_maps, alti_rollout
    from inseq_mixing.methods.alti_logit import alti_logit
    from inseq_mixing.methods.norm_based import attention_rollout, globenc, rollout_scores

    model = get_tiny(family)
    kwargs = example_kwargs(family, batch=2, seed=2)
    trace, first = trace_of(model, kwargs), 3
    pairs = [
        (alti_rollout(trace, first).target, alti_maps(alti(trace), rollout=True).target),
        (attention_rollout(trace, first).target, alti_maps(rollout_scores(trace), rollout=True).target),
        (globenc(trace, first_row=first).target, globenc(trace, rollout=False).target),
    ]
    for mine, stacked in pairs:
        if stacked.dim() == 4:  # GlobEnc's per-layer maps: rolled out here by hand, bottom-up
            rolled = stacked[:, 0]
            for layer in range(1, stacked.shape[1]):
                rolled = stacked[:, layer] @ rolled
            stacked = rolled
        torch.testing.assert_close(mine[:, first:], stacked[:, first:], rtol=1e-5, atol=1e-6)
        assert not mine[:, :first].any()  # rows nothing reads are not computed
    ids = next_tokens(kwargs)
    streamed = alti_logit(trace, ids)
    every_depth = alti_logit(trace, ids, scores=alti(trace))
    torch.testing.assert_close(streamed.target, every_depth.target, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("front", ["generation", "spans", "encoder"])
def test_a_batch_that_cannot_fit_is_refused_before_the_forward_pass_with_the_numbers(front, monkeypatch):
    """One layer's eager attention (its scores and probabilities, 2 × batch × heads × T²) must fit in the device's
    free memory: a call whose batch cannot is refused before anything runs, with the estimate; batch_size=1 or a
    shorter input passes."""
    import inseq

    import inseq_mixing
    import inseq_mixing.frontends.common as common
    import inseq_mixing.frontends.inseq_adapter.base as adapter
    from inseq_mixing.testing import encoder_tokenizer, word_tokenizer

    def refuse(*args, **kwargs):
        raise AssertionError("the model was traced before the call was refused")

    text = " ".join(["the cat sat on the mat ."] * 8)  # 56 words
    if front == "encoder":
        model = inseq_mixing.load_model(tiny_encoder("bert"), "alti", tokenizer=encoder_tokenizer())
        heads, tokens = 4, 58  # [CLS] and [SEP]

        def attribute(**kwargs):
            return model.attribute([text, text], show_progress=False, **kwargs)
    else:
        model = inseq.load_model(tiny_model("gpt2"), "alti_logit", tokenizer=word_tokenizer(seq2seq=False))
        heads, tokens = 4, 56 + 3 - 1  # the prompt, three words, without the last token
        spans = {"spans": "answer"} if front == "spans" else {}
        tokens += 1 if spans else 0  # a span traces the whole text

        def attribute(**kwargs):
            return model.attribute([text, text], [text + " she read it", text + " she read it"], show_progress=False,
                                   **spans, **kwargs)  # fmt: skip

    one = 2 * heads * tokens * tokens * 4  # one input's scores and probabilities in float32

    def free(available: int) -> None:
        for module in (common, adapter):
            monkeypatch.setattr(module, "available_bytes", lambda device: available)

    with monkeypatch.context() as patched:
        patched.setattr("inseq_mixing.trace.trace_call", refuse)
        free(one - 1)  # not even one input
        with pytest.raises(ValueError, match=rf"needs about 0\.0 GiB at once .* heads × {tokens}² positions, for 1 "
                           r"input\(s\)\), and 0\.0 GiB are free: give a shorter input"):  # fmt: skip
            attribute(batch_size=1)
        if front != "generation":  # Inseq attributes a decoder-only model's given texts one at a time
            free(2 * one - 1)  # one input fits, not two
            with pytest.raises(ValueError, match=r"(Input|Text) 0 and the rest of its batch"):
                attribute(batch_size=2)
    free(2 * one - 1)
    assert len(attribute(batch_size=1).sequence_attributions) == 2  # one at a time fits
