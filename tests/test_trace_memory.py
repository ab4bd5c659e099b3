"""A trace that holds one layer's attention probabilities at most (issue 52, item 1): above ``KEPT_PROBS_BYTES`` it
keeps each attention call's arguments and recomputes a layer's probabilities when read. The recomputed probabilities
are the forward pass's bit for bit on every family (generation, encoder-only, speech, vision), every method gives the
same scores from either trace, and the bytes a long trace holds are counted."""

import dataclasses

import pytest
import torch

import inseq_mixing.trace as trace_module
from inseq_mixing.declarations import DECLARATIONS, Request
from inseq_mixing.specs import get_spec
from inseq_mixing.testing import (
    ALL_FAMILIES,
    ENCODER_FAMILIES,
    SPEECH_FAMILIES,
    VISION_FAMILIES,
    is_seq2seq,
    load_tiny,
    speech_processor,
    synthetic_audio,
    synthetic_image,
    tiny_encoder,
    tiny_model,
    tiny_speech,
    tiny_vision,
    vision_processor,
)
from inseq_mixing.trace import (
    ModelCall,
    ProbsSource,
    RecomputedLayer,
    TraceError,
    Unrecorded,
    trace_call,
    trace_model,
)

from .conftest import example_kwargs, get_tiny, next_tokens, trace_of

#: Methods whose math reads the recorded probabilities, one for each place that reads them (ALTI's parts, the logit
#: read-out, DecompX, value zeroing, the norms, the rollout's layer maps).
READERS = ("alti_logit", "decompx", "value_zeroing", "attention_norm", "globenc", "attention_rollout")


def attention_records(trace):
    for stack in (trace.decoder, trace.encoder):
        for layer in [] if stack is None else stack.layers:
            yield from (record for record in (layer.self_attn, layer.cross_attn) if record is not None)


#: What a forward pass run by blocks of query rows may differ by from the whole layer's (float32), relative to the
#: largest value compared (at least 1): a block's products may sum in another order than the whole layer's (none does
#: on the tiny generation models; on the speech and vision ones up to 2.4e-7 in probabilities and 1.4e-6 in attention
#: outputs of order 1 were seen), later layers read those outputs, and DecompX's components, which mix a long layer's
#: probabilities a block of rows at a time, carry each difference through every later layer (up to 1.9e-5 on BART's
#: scores of order 3 seen; in float64 the same comparison differs by 1e-14: rounding, not another number).
ROUNDING = 1e-5


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of one or a few query rows for a trace that keeps no probabilities (its forward pass and its reads)."""
    monkeypatch.setattr(trace_module, "ROW_BLOCK_BYTES", 4 * 2 * 4 * 16 * 2)


def assert_same_probs(kept, recomputed) -> None:
    """The recomputed probabilities, whole and by rows, and the attention outputs of a forward pass run by blocks of
    rows are those of the trace that kept them."""
    pairs = list(zip(attention_records(kept), attention_records(recomputed), strict=True))
    assert pairs and all(record.source is not None and record.kept_probs is None for _, record in pairs)
    for first, second in pairs:
        torch.testing.assert_close(first.probs, second.probs, equal_nan=True, rtol=0, atol=ROUNDING)
        torch.testing.assert_close(first.output, second.output, equal_nan=True, rtol=0, atol=ROUNDING)
        rows = first.kept_probs.shape[2]
        for queries in (slice(0, 1), slice(1, rows), slice(rows - 1, rows)):
            # the same rows of the same recomputed layer, whole or by rows: bit for bit
            assert torch.equal(second.probs[:, :, queries].nan_to_num(-1.0),
                               second.probs_rows(queries).nan_to_num(-1.0))  # fmt: skip
        assert sum(block.shape[2] for _, block in second.row_blocks()) == rows


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_recomputed_probabilities_are_the_forward_passes_on_every_generation_family(family, small_blocks):
    model = get_tiny(family)
    kwargs = example_kwargs(family, batch=2)
    kwargs["attention_mask"] = torch.ones_like(kwargs["input_ids"])
    kwargs["attention_mask"][1, :2] = 0  # padding in the second row (left for decoder-only, as the front ends pad)
    if is_seq2seq(family):
        kwargs["attention_mask"] = kwargs["attention_mask"].flip(-1)  # right padding for an encoder
    assert_same_probs(trace_of(model, kwargs, keep_probs=True), trace_of(model, kwargs, keep_probs=False))


@pytest.mark.parametrize("family", ENCODER_FAMILIES)
def test_recomputed_probabilities_on_every_encoder_family(family, small_blocks):
    model = tiny_encoder(family)
    ids, mask = torch.tensor([[2, 9, 10, 11, 12, 3], [2, 9, 10, 3, 0, 0]]), torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0
    assert_same_probs(trace_model(model, ids, mask, keep_probs=True), trace_model(model, ids, mask, keep_probs=False))


@pytest.mark.parametrize("family", [*SPEECH_FAMILIES, *VISION_FAMILIES])
def test_recomputed_probabilities_on_every_speech_and_vision_family(family, small_blocks):
    if family in SPEECH_FAMILIES:
        model, processor = tiny_speech(family), speech_processor(family)
        inputs = dict(processor.feature_extractor(synthetic_audio(0.5), sampling_rate=16_000, return_tensors="pt"))
        if family == "whisper":
            inputs["decoder_input_ids"] = torch.tensor([[1, 5, 6]])
    else:
        model, processor = tiny_vision(family), vision_processor(family)
        inputs = dict(processor(images=[synthetic_image()], return_tensors="pt"))

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


def assert_same_results(first, second, rounding: float = ROUNDING) -> None:
    """Two method results hold the same tensors (NaN cells alike) up to ``rounding`` times the largest value of the
    first result's (at least 1: the scores' scale, which a rounding difference is carried at), and the same other
    fields."""
    values = [getattr(first, item.name) for item in dataclasses.fields(first)]
    tensors = [t for v in values for t in (v.values() if isinstance(v, dict) else [v]) if isinstance(t, torch.Tensor)]
    scale = max([1.0] + [t[t.isfinite()].abs().max().item() for t in tensors if t.isfinite().any()])

    def assert_close(a, b) -> None:
        torch.testing.assert_close(a, b, equal_nan=True, rtol=0, atol=rounding * scale)

    for item in dataclasses.fields(first):
        a, b = getattr(first, item.name), getattr(second, item.name)
        if isinstance(a, dict):
            assert a.keys() == b.keys(), item.name
            for key in a:
                assert_close(a[key], b[key])
        elif isinstance(a, torch.Tensor):
            assert_close(a, b)
        else:
            assert a == b, item.name


@pytest.mark.parametrize("method", READERS)
@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_every_method_gives_the_same_scores_without_kept_probabilities(family, method, small_blocks):
    """The same scores from a trace that keeps every layer's probabilities and from one that keeps none and runs and
    reads attention by blocks of query rows (blocks of one to three rows here)."""
    model = get_tiny(family)
    kwargs = example_kwargs(family, batch=2, seed=1)

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
    assert_same_results(*results)


@pytest.mark.parametrize("method", ("alti_logit", "attention_rollout", "value_zeroing"))
@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_a_padded_batch_gives_the_same_scores_without_kept_probabilities(family, method, small_blocks):
    """A left-padded batch (a right-padded source for encoder–decoders): its fully masked rows see every key in a
    block run, the other blocks only the keys their rows see (:func:`~inseq_mixing.trace.key_limits`); the scores
    are those of the trace that kept every layer's probabilities."""

    model, spec = get_tiny(family), get_spec(get_tiny(family))
    kwargs = example_kwargs(family, batch=2, seed=3)
    ids, target = kwargs["input_ids"], kwargs.get("decoder_input_ids")
    mask = torch.ones_like(ids)
    if target is None:
        mask[0, :3] = 0
    else:
        mask[0, -2:] = 0
    kwargs["attention_mask"] = mask
    decoder_mask = mask if target is None else torch.ones_like(target)
    results = []
    for keep in (True, False):
        traced = trace_of(model, kwargs, keep_probs=keep)
        request = Request(spec, model, mask, target, None if target is None else decoder_mask, next_tokens(kwargs),
                          None, decoder_mask.bool(), lambda traced=traced: traced)  # fmt: skip
        declaration = DECLARATIONS[method]
        results.append(declaration.run(request, declaration.options()))
    assert_same_results(*results)


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
        elif isinstance(value, RecomputedLayer):
            seen.add(id(value))
            stack += value.holds()
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


@pytest.mark.parametrize("family", ["gpt2", "llama", "bart"])
def test_decompx_mixing_a_long_layer_by_blocks_of_rows_is_exact_in_float64(family, small_blocks):
    """DecompX on a trace that keeps no probabilities mixes each layer's components a block of query rows at a time
    (self- and cross-attention): in float64 its scores are those of the trace that keeps them to 1e-12, so the float32
    differences the test above allows are rounding, not another definition."""
    model = get_tiny(family).to(torch.float64)
    try:
        kwargs = example_kwargs(family, batch=2, seed=1)
        ids, target = kwargs["input_ids"], kwargs.get("decoder_input_ids")
        decoder = ids if target is None else target
        results = []
        for keep in (True, False):
            traced = trace_of(model, kwargs, keep_probs=keep)
            assert (traced.decoder.layers[0].self_attn.kept_probs is None) != keep
            target_mask = None if target is None else torch.ones_like(target)
            rows = torch.ones_like(decoder, dtype=torch.bool)
            request = Request(get_spec(model), model, torch.ones_like(ids), target, target_mask, next_tokens(kwargs),
                              None, rows, lambda traced=traced: traced)  # fmt: skip
            results.append(DECLARATIONS["decompx"].run(request, DECLARATIONS["decompx"].options()))
        assert_same_results(*results, rounding=1e-12)
    finally:
        model.to(torch.float32)


def test_decompx_over_units_mixes_a_long_layer_in_one_slab_by_blocks_of_rows(monkeypatch, small_blocks):
    """DecompX over context units on a long trace whose slabs of components would be cut small (``max_chunk_elements``
    tiny, as a long prompt's are): one slab of every component, its probabilities read by blocks of rows (the path
    counted), and in float64 the scores of the trace that keeps every layer's probabilities to 1e-12."""
    import inseq

    import inseq_mixing.methods.decompx as decompx_module
    from inseq_mixing.testing import WORDS, word_tokenizer

    model = tiny_model("gpt2", layers=2, heads=8, d_model=32).to(torch.float64)  # a slab of 5 under 8 heads' T²
    generator = torch.Generator().manual_seed(3)
    words = [WORDS[int(index)] for index in torch.randint(len(WORDS), (150,), generator=generator)]
    prompt = " . ".join(" ".join(words[start : start + 50]) for start in (0, 50, 100)) + " ."
    front = inseq.load_model(model, "decompx", tokenizer=word_tokenizer(seq2seq=False))
    mixed = []
    by_rows = decompx_module._mixed_by_rows
    monkeypatch.setattr(decompx_module, "_mixed_by_rows", lambda *args: mixed.append(1) or by_rows(*args))
    scores = {}
    for kept in (True, False):
        monkeypatch.setattr(trace_module, "KEPT_PROBS_BYTES", 2**40 if kept else 0)
        out = front.attribute(prompt, prompt + " the cat sat", spans="answer", units="sentences",
                              unit_components=True, max_chunk_elements=256, show_progress=False)  # fmt: skip
        scores[kept] = out.sequence_attributions[0]
        assert bool(mixed) != kept  # the long trace's layers by rows, the kept one's whole
    torch.testing.assert_close(scores[False].source_attributions, scores[True].source_attributions, rtol=0,
                               atol=1e-12)  # fmt: skip
    assert scores[True].source_attributions.abs().sum() > 0


def test_a_long_trace_holds_one_layers_probabilities_at_most(monkeypatch):
    """Above ``KEPT_PROBS_BYTES`` a trace keeps no probabilities and not the model's causal mask (a float a pair of
    positions): reading the layers one at a time holds one layer's probabilities at most, each the kept trace's bit
    for bit, and ALTI's scores are the same."""
    layers, heads, length = 6, 4, 384
    model = tiny_model("gpt2", layers=layers, heads=heads, d_model=32)
    ids = torch.randint(5, 60, (1, length), generator=torch.Generator().manual_seed(0))
    one_layer = heads * length * length * 4  # float32
    kept = trace_model(model, ids, keep_probs=True)
    assert quadratic_bytes(kept, length) >= layers * one_layer  # every layer's probabilities
    monkeypatch.setattr(trace_module, "KEPT_PROBS_BYTES", layers * one_layer - 1)  # just below: the trace chooses
    trace = trace_model(model, ids)
    assert all(record.kept_probs is None for record in attention_records(trace))
    limit = one_layer  # one layer's probabilities; the model's (1, 1, T, T) causal mask is not kept (made by rows)
    assert quadratic_bytes(trace, length) == 0  # nothing read yet: no layer's probabilities, no mask
    assert trace_module._CAUSAL_ROWS.get() is False  # set only while a layer runs again
    for layer, kept_layer in zip(trace.decoder.layers, kept.decoder.layers, strict=True):  # a layer at a time,
        probs = layer.self_attn.probs  # as the methods read them
        assert torch.equal(probs, kept_layer.self_attn.probs)
        del probs
        assert quadratic_bytes(trace, length) <= limit
    kept_scores = DECLARATIONS["alti"].compute(_request(model, ids, kept), DECLARATIONS["alti"].options())
    lazy_scores = DECLARATIONS["alti"].compute(_request(model, ids, trace), DECLARATIONS["alti"].options())
    assert torch.equal(kept_scores.target, lazy_scores.target)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_long_trace_keeps_a_mask_that_is_not_the_causal_one(family, monkeypatch):
    """A left-padded batch's mask is not the causal mask alone: a long trace keeps it (its quadratic bytes), and the
    layers read from it are the kept trace's bit for bit; the same batch unpadded keeps none."""
    model = tiny_model(family, layers=2, heads=4, d_model=32)
    length = 160  # its square above the logits' elements (2 × 160 × the tiny vocabulary)
    ids = torch.randint(5, 60, (2, length), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    monkeypatch.setattr(trace_module, "KEPT_PROBS_BYTES", 0)
    for padding, held in ((mask, True), (torch.ones_like(ids), False)):
        kept = trace_model(model, ids, padding, keep_probs=True)
        trace = trace_model(model, ids, padding)
        assert (quadratic_bytes(trace, length) > 0) == held
        for layer, kept_layer in zip(trace.decoder.layers, kept.decoder.layers, strict=True):
            assert torch.equal(layer.self_attn.probs.nan_to_num(-1.0), kept_layer.self_attn.probs.nan_to_num(-1.0))


def long_trace_bytes(trace, length: int) -> int:
    """The bytes of a trace's records besides its logits and what grows with ``length``² (the shared causal mask),
    each checked to hold no more memory than its own elements (GPT-2's values are a slice of its fused
    query-key-value projection: kept alone, not with the queries and keys)."""
    records = [t for t in reachable_tensors(trace) if t.numel() < length * length]
    assert all(t.untyped_storage().nbytes() <= t.numel() * t.element_size() for t in records)
    logits = 0 if trace.logits is None else trace.logits.untyped_storage().nbytes()
    return sum(t.untyped_storage().nbytes() for t in records) - logits


@pytest.mark.parametrize("records", ("all", "attention"))
@pytest.mark.parametrize("family", ("gpt2", "llama"))
def test_a_long_trace_keeps_one_row_of_d_model_a_layer_and_rebuilds_the_one_layer_read(family, records):
    """A long trace keeps each layer's input (the previous one's output) and its call: one ``T × d_model`` a layer,
    the embeddings and final norm's input, and a few ``(T,)`` vectors (masks, positions, the rows' key limits). A
    layer read is rebuilt once, and holds its records (five rows for ``"all"``: the attention's input, values,
    attention output, the FFN's norm input, the output; two for ``"attention"``) until another layer is read, which
    frees them: the trace never holds two layers' records."""
    layers, length, d_model = 6, 384, 32
    model = tiny_model(family, layers=layers, heads=4, d_model=d_model)
    ids = torch.randint(5, 60, (1, length), generator=torch.Generator().manual_seed(0))
    trace = trace_model(model, ids, keep_probs=False, records=records)
    row, vectors = length * d_model * 4, 16 * length * 8
    assert long_trace_bytes(trace, length) <= (layers + 2) * row + vectors
    rebuilt = 5 if records == "all" else 2
    for index in (2, 3, 3):
        layer = trace.decoder.layers[index]
        assert layer.self_attn.source is not None  # read: rebuilt, then held (its probabilities not read here)
        assert long_trace_bytes(trace, length) <= (layers + 2 + rebuilt) * row + vectors
        assert long_trace_bytes(trace, length) >= (layers + rebuilt) * row
    assert [layer.reruns for layer in trace.decoder.layers] == [0, 0, 1, 1, 0, 0]  # layer 3 read twice, built once
    if records == "attention":
        assert isinstance(trace.decoder.layers[0].self_attn.values, Unrecorded)
    with pytest.raises(ValueError, match="records='values'"):
        trace_model(model, ids, records="values")


@pytest.mark.parametrize("method", list(DECLARATIONS))
def test_every_method_rebuilds_each_layer_of_a_long_trace_once(method):
    """A method reads a long trace's layers in one pass over the stack, not back and forth: each layer is rebuilt
    once (ALTI-logit folds each layer's map into its parts in the sweep's pass, the attention norms read each layer's
    mixing ratio with its map), so the rebuilds cost one more pass through the blocks; AttnLRP reads none of the
    records."""
    model = tiny_model("gpt2", layers=4)  # two passes over fewer layers would find the last one read still held
    ids = torch.randint(5, 60, (1, 24), generator=torch.Generator().manual_seed(0))
    mask, declaration, traces = torch.ones_like(ids), DECLARATIONS[method], []

    def traced():
        traces.append(trace_model(model, ids, mask, keep_probs=False, records=declaration.records))
        return traces[-1]

    rows = torch.zeros_like(mask, dtype=torch.bool)
    rows[:, -4:] = True
    request = Request(get_spec(model), model, mask, None, None, ids.roll(-1, 1), None, rows, traced)
    declaration.run(request, declaration.options())
    reruns = [layer.reruns for trace in traces for layer in trace.decoder.layers]
    assert set(reruns) == ({0} if method == "attn_lrp" else {1})


#: The methods that read the probabilities and nothing else of a trace, as their declarations say.
ATTENTION_READERS = tuple(name for name, declaration in DECLARATIONS.items() if declaration.records == "attention")


def test_the_methods_tracing_attention_alone_are_rollout_and_flow():
    assert set(ATTENTION_READERS) == {"attention_rollout", "attention_flow"}


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_rollout_and_flow_give_the_same_maps_from_a_trace_of_attention_alone(family, small_blocks):
    """A trace that keeps only each layer's input, output and what recomputes its probabilities (and reads them by
    blocks of one to three rows) gives rollout and flow the maps (rolled out and per layer) of a trace that keeps
    everything; a method that reads more than attention is refused on it, never given a number."""

    model, spec = get_tiny(family), get_spec(get_tiny(family))
    kwargs = example_kwargs(family, batch=2, seed=2)
    ids, target = kwargs["input_ids"], kwargs.get("decoder_input_ids")
    decoder = ids if target is None else target
    traces = {
        "all": trace_of(model, kwargs, keep_probs=True),
        "attention": trace_of(model, kwargs, keep_probs=False, records="attention"),
    }
    dropped = traces["attention"].decoder.layers[0]
    assert isinstance(dropped.self_attn.values, Unrecorded) and isinstance(dropped.ffn_norm_input, Unrecorded)

    def request(traced) -> Request:
        target_mask = None if target is None else torch.ones_like(target)
        return Request(spec, model, torch.ones_like(ids), target, target_mask, next_tokens(kwargs), None,
                       torch.ones_like(decoder, dtype=torch.bool), lambda: traced)  # fmt: skip

    for method, options in (("attention_rollout", {}), ("attention_rollout", {"per_layer": True}),
                            ("attention_flow", {})):  # fmt: skip
        declaration = DECLARATIONS[method]
        found = [declaration.run(request(traces[records]), declaration.options(**options)) for records in traces]
        assert_same_results(*found)
    with pytest.raises(TraceError, match="records='all'"):
        DECLARATIONS["alti"].run(request(traces["attention"]), DECLARATIONS["alti"].options())


def test_model_attribute_traces_attention_alone_for_rollout_and_everything_for_graphs(monkeypatch):
    """The front ends ask the declaration what to record: rollout's call through Inseq and through spans records
    attention alone, the same call with contribution graphs (which read ALTI's) records everything, and ALTI's does
    too; the maps are the same either way."""
    asked = []
    own = trace_module.trace_call

    def spy(*args, **kwargs):
        asked.append(kwargs.get("records", args[4] if len(args) > 4 else "all"))
        return own(*args, **kwargs)

    monkeypatch.setattr(trace_module, "trace_call", spy)
    rollout = load_tiny("gpt2", "attention_rollout")
    plain = rollout.attribute("the cat", "the cat sat on the", show_progress=False)
    graphs = rollout.attribute("the cat", "the cat sat on the", show_progress=False, contribution_graphs=True)
    rollout.attribute("the cat", "the cat sat on the", show_progress=False, spans="answer")
    load_tiny("gpt2", "alti").attribute("the cat", "the cat sat on the", show_progress=False)
    assert asked == ["attention", "all", "attention", "all"]
    torch.testing.assert_close(plain.sequence_attributions[0].target_attributions,
                               graphs.sequence_attributions[0].target_attributions, equal_nan=True)  # fmt: skip


#: The methods that read a long trace's probabilities by blocks of query rows (DecompX and value zeroing read a whole
#: layer's at a time), as their declarations say.
ROW_READERS = tuple(name for name, declaration in DECLARATIONS.items() if declaration.reads_rows)


def test_the_row_readers_are_the_five_map_and_alti_methods():
    assert set(ROW_READERS) == {"alti", "alti_logit", "globenc", "attention_rollout", "attention_norm"}


def test_a_long_trace_runs_and_reads_attention_by_blocks_of_query_rows(monkeypatch):
    """Neither the forward pass of a trace that keeps no probabilities nor the methods that read it by rows give the
    family's eager attention more than one block of query rows (counted where transformers calls it), and their
    scores are those of the trace that kept every layer's probabilities."""
    import transformers.models.gpt2.modeling_gpt2 as gpt2

    length, heads, rows = 384, 4, 16
    model = tiny_model("gpt2", layers=2, heads=heads, d_model=32)
    ids = torch.randint(5, 60, (1, length), generator=torch.Generator().manual_seed(0))
    seen, keys = [], []
    eager = gpt2.eager_attention_forward

    def counted(module, query, key, *args, **kwargs):
        seen.append(query.shape[2])
        keys.append(key.shape[2])
        return eager(module, query, key, *args, **kwargs)

    monkeypatch.setattr(gpt2, "eager_attention_forward", counted)
    kept = trace_model(model, ids, keep_probs=True)
    assert set(seen) == {length}  # the kept trace: whole layers, as before
    monkeypatch.setattr(trace_module, "ROW_BLOCK_BYTES", 4 * heads * length * rows)
    seen.clear()
    keys.clear()
    trace = trace_model(model, ids, keep_probs=False)
    assert max(seen) == rows and len(seen) == 2 * length // rows  # the forward pass: 24 blocks a layer
    # each block gives the eager function the keys its rows see, none after the block's last row (causal)
    assert keys == 2 * list(range(rows, length + 1, rows))
    for method in ROW_READERS:
        declaration = DECLARATIONS[method]
        seen.clear()
        keys.clear()
        lazy = declaration.compute(_request(model, ids, trace), declaration.options())
        assert seen and max(seen) <= rows, method
        assert sum(keys) <= sum(seen) * length / 2 + rows * len(seen), method  # about half the keys: the seen ones
        whole = declaration.compute(_request(model, ids, kept), declaration.options())
        torch.testing.assert_close(lazy.target, whole.target, rtol=0, atol=ROUNDING)
    # value zeroing reads only the rows it explains (an answer's), whatever their number: here one block's
    explained = torch.zeros_like(ids, dtype=torch.bool)
    explained[:, -rows:] = True
    declaration = DECLARATIONS["value_zeroing"]
    seen.clear()
    lazy = declaration.compute(_request(model, ids, trace, explained), declaration.options())
    assert seen and max(seen) <= rows
    whole = declaration.compute(_request(model, ids, kept, explained), declaration.options())
    assert lazy.target[:, -rows:].abs().sum() > 0
    torch.testing.assert_close(lazy.target, whole.target, rtol=0, atol=ROUNDING)


def _request(model, ids, trace, positions: torch.Tensor | None = None) -> Request:

    mask = torch.ones_like(ids)
    positions = mask.bool() if positions is None else positions
    return Request(get_spec(model), model, mask, None, None, torch.roll(ids, -1, 1), None, positions,
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


@pytest.mark.parametrize("reads", ["whole layers", "rows"])
@pytest.mark.parametrize("front", ["generation", "spans", "encoder"])
def test_a_batch_that_cannot_fit_is_refused_before_the_forward_pass_with_the_numbers(front, reads, monkeypatch):
    """What a method holds at once must fit in the device's free memory: one layer's eager attention (its scores and
    probabilities, 2 × batch × heads × T²) for DecompX and value zeroing, which read a layer's probabilities whole,
    one layer's map
    and the product it enters (2 × batch × T²) for a method that reads them by rows. A call whose batch cannot fit is
    refused before anything runs, with the estimate; batch_size=1 or a shorter input passes."""
    import inseq

    import inseq_mixing
    import inseq_mixing.frontends.common as common
    import inseq_mixing.frontends.inseq_adapter.base as adapter
    from inseq_mixing.testing import encoder_tokenizer, word_tokenizer

    def refuse(*args, **kwargs):
        raise AssertionError("the model was traced before the call was refused")

    text = " ".join(["the cat sat on the mat ."] * 8)  # 56 words
    row_method, whole_method = ("alti", "value_zeroing") if front == "encoder" else ("alti_logit", "decompx")
    method = row_method if reads == "rows" else whole_method
    if front == "encoder":
        model = inseq_mixing.load_model(tiny_encoder("bert"), method, tokenizer=encoder_tokenizer())
        heads, tokens = 4, 58  # [CLS] and [SEP]

        def attribute(**kwargs):
            return model.attribute([text, text], show_progress=False, **kwargs)
    else:
        model = inseq.load_model(tiny_model("gpt2"), method, tokenizer=word_tokenizer(seq2seq=False))
        heads, tokens = 4, 56 + 3 - 1  # the prompt, three words, without the last token
        spans = {"spans": "answer"} if front == "spans" else {}
        tokens += 1 if spans else 0  # a span traces the whole text

        def attribute(**kwargs):
            return model.attribute([text, text], [text + " she read it", text + " she read it"], show_progress=False,
                                   **spans, **kwargs)  # fmt: skip

    heads = heads if reads == "whole layers" else 1
    one = 2 * heads * tokens * tokens * 4  # one input's scores and probabilities (or map and product) in float32
    what = "heads × " if reads == "whole layers" else "map and the product it enters, "

    def free(available: int) -> None:
        for module in (common, adapter):
            monkeypatch.setattr(module, "available_bytes", lambda device: available)

    with monkeypatch.context() as patched:
        patched.setattr("inseq_mixing.trace.trace_call", refuse)
        free(one - 1)  # not even one input
        expected = rf"{method} needs about 0\.0 GiB at once .*{what}{tokens}² positions, for 1 input\(s\)\), and 0\.0 "
        with pytest.raises(ValueError, match=expected + r"GiB are free: give a shorter input"):
            attribute(batch_size=1)
        if front != "generation":  # Inseq attributes a decoder-only model's given texts one at a time
            free(2 * one - 1)  # one input fits, not two
            with pytest.raises(ValueError, match=r"(Input|Text) 0 and the rest of its batch"):
                attribute(batch_size=2)
    free(2 * one - 1)
    assert len(attribute(batch_size=1).sequence_attributions) == 2  # one at a time fits
