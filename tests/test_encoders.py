"""Encoder-only models (BERT, RoBERTa, XLM-R, ELECTRA, DistilBERT, ALBERT): masked LMs, classifiers and bare
encoders through ``inseq_mixing.load_model``. Completeness against the model's own logits, value zeroing / ALTI /
attention norm / GlobEnc against pair-by-pair computations on the HF modules, padding invariance, a failed call,
Inseq's show / save / load, and the errors a user meets."""

import functools
import json

import inseq
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import inseq_mixing
from inseq_mixing.methods.norm_based import attention_norm, globenc
from inseq_mixing.methods.value_zeroing import value_zeroing
from inseq_mixing.specs import get_spec
from inseq_mixing.testing import (
    ENCODER_FAMILIES,
    LOGIT_METHODS,
    MAP_METHODS,
    encoder_tokenizer,
    randomize_weights,
    tiny_encoder,
)
from inseq_mixing.trace import trace_model

from .reference import (
    capture_value_inputs,
    frozen_norm_map,
    hf_attention_part,
    hf_value_vectors,
    naive_alti_layer,
    naive_value_zeroing,
)

TEXTS = ["the dog [MASK] the cat on the mat", "a [MASK] sat"]
PAIR = ("the books were read", "by many people")


@functools.cache
def tokenizer():
    return encoder_tokenizer()


@functools.cache
def encoder(family: str, task: str = "masked_lm"):
    return tiny_encoder(family, task)


def model_inputs(texts, pair=None):
    encoded = tokenizer()(texts, pair, return_tensors="pt", padding=True)
    return dict(encoded)


def own_logits(model, texts) -> torch.Tensor:
    with torch.no_grad():
        return model(**model_inputs(texts)).logits


@pytest.fixture(params=ENCODER_FAMILIES)
def family(request):
    return request.param


@pytest.mark.parametrize("task", ["masked_lm", "sequence_classification", "token_classification"])
def test_logit_methods_add_up_to_the_models_own_logit(family, task):
    """Token scores plus the unattributed step scores equal the model's own logit (an independent forward pass) at
    every explained position, with and without a foil."""
    model = encoder(family, task)
    logits = own_logits(model, TEXTS)
    targets = {"masked_lm": ["cat", "dog"], "sequence_classification": ["positive", 0], "token_classification": None}
    foils = {"masked_lm": ["mat", "a"], "sequence_classification": ["negative", "neutral"],
             "token_classification": None}  # fmt: skip
    for method in LOGIT_METHODS:
        attribution = inseq_mixing.load_model(model, method, tokenizer=tokenizer())
        for foil in (None, foils[task]):
            out = attribution.attribute(TEXTS, targets[task], foil, show_progress=False)
            name = "logit" if foil is None else "contrast_logits_diff"
            assert out.info["attributed_fn"] == name
            for row, sequence in enumerate(out.sequence_attributions):
                steps = sequence.step_scores
                terms = sum(value for key, value in steps.items() if key.startswith("unattributed_"))
                total = sequence.source_attributions.sum(0) + terms
                ids = torch.tensor([token.id for token in sequence.target])
                if task == "sequence_classification":
                    expected = logits[row, ids]
                else:
                    cells = _explained_cells(model_inputs(TEXTS)["input_ids"][row], task, len(sequence.source))
                    expected = logits[row, cells, ids]
                if foil is not None:
                    foil_ids = [_output_index(model, task, value) for value in _as_list(foil[row])]
                    if task == "sequence_classification":
                        expected = expected - logits[row, foil_ids]
                    else:
                        expected = expected - logits[row, cells, foil_ids]
                torch.testing.assert_close(steps[name], expected, atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(total, expected, atol=1e-4, rtol=1e-4)


def _as_list(value):
    return [value] if isinstance(value, str | int) else list(value)


def _output_index(model, task, value):
    if task == "masked_lm":
        return tokenizer().convert_tokens_to_ids(value)
    return model.config.label2id[value] if isinstance(value, str) else value


def _explained_cells(ids, task, length):
    if task == "masked_lm":
        return (ids[:length] == tokenizer().mask_token_id).nonzero().flatten()
    return torch.arange(length)


def test_targets_are_the_models_predictions_by_default(family):
    model = encoder(family, "masked_lm")
    out = inseq_mixing.load_model(model, "alti_logit", tokenizer=tokenizer()).attribute(TEXTS, show_progress=False)
    logits = own_logits(model, TEXTS)
    for row, sequence in enumerate(out.sequence_attributions):
        cells = _explained_cells(model_inputs(TEXTS)["input_ids"][row], "masked_lm", len(sequence.source))
        assert [token.id for token in sequence.target] == logits[row, cells].argmax(-1).tolist()
    assert "first subword" in out.info["explained"]


def test_value_zeroing_matches_zeroing_values_through_a_hook(family):
    """Zero token j's value vectors through a hook on the real value projection, re-run the layer on its clean
    input, measure the cosine distance: every token is zeroed for every position (encoder maps are not causal)."""
    model = encoder(family)
    kwargs = model_inputs(TEXTS[:1])
    spec = get_spec(model)
    naive = naive_value_zeroing(model, spec, kwargs, "decoder", "self")
    fast = value_zeroing(trace_model(model, kwargs["input_ids"], kwargs["attention_mask"], spec=spec,
                                     extra={"token_type_ids": kwargs["token_type_ids"]}))  # fmt: skip
    torch.testing.assert_close(fast.decoder[0], naive, atol=1e-5, rtol=1e-4)
    assert naive[0, 0, -1] > 0  # the first position mixes with the last token: not causal (layer 0 is global)


def test_sliding_window_layers_give_exactly_zero_outside_the_window():
    """ModernBERT's odd layers attend to 2 tokens on each side: every map is exactly 0 beyond them."""
    model = encoder("modernbert")
    kwargs, trace = _trace(model, TEXTS[:1])
    far = (torch.arange(10)[:, None] - torch.arange(10)[None, :]).abs() > 2
    for method in ("value_zeroing", "alti", "attention_norm", "globenc"):
        maps = inseq_mixing.declarations.DECLARATIONS[method].compute(_request(model, trace, kwargs), _options(method))
        assert (maps.target[0, 1][far] == 0).all() and (maps.target[0, 0][far] != 0).any(), method


def _trace(model, texts, pair=None):
    kwargs = model_inputs(texts, pair)
    extra = {"token_type_ids": kwargs["token_type_ids"]}
    return kwargs, trace_model(model, kwargs["input_ids"], kwargs["attention_mask"], extra=extra)


def test_alti_matches_the_definition_pair_by_pair(family):
    model = encoder(family)
    kwargs, trace = _trace(model, *PAIR)
    spec = get_spec(model)
    maps = inseq_mixing.declarations.DECLARATIONS["alti"].compute(_request(model, trace, kwargs), _options("alti"))
    for idx in (0, len(spec.decoder.layers) - 1):
        naive = naive_alti_layer(model, spec, trace, kwargs, "decoder", idx, "self")
        torch.testing.assert_close(maps.target[0, idx], naive, atol=1e-5, rtol=1e-4)


def released_alti_layer(model, spec, trace, kwargs, idx: int) -> torch.Tensor:
    """One BERT layer's ALTI map (batch 0) as mt-upc/transformer-contributions computes it, pair by pair on the HF
    modules: parts through the LayerNorm's gain and centring scaled by 1/σ of its input without eps, the output
    y_i = L(z_i)/σ + β, importance −pairwise_distance(T_i(x_j), y_i, p=1) (PyTorch's function, with its eps), plus
    ‖y_i‖₁, clipped at 0, rows normalised."""
    layer, record = spec.decoder.layers[idx], trace.decoder.layers[idx]
    attn = layer.self_attn
    values = hf_value_vectors(attn, capture_value_inputs(model, spec, kwargs)[("decoder", idx, "self")])
    probs, norm = record.self_attn.probs[0], attn.norm
    with torch.no_grad():
        scores = torch.zeros(probs.shape[1:], dtype=torch.float64)
        for i in range(probs.shape[1]):
            z = record.self_attn.norm_input[0, i]
            sigma = z.std(unbiased=False)

            def frozen(vector, sigma=sigma):
                return norm.weight * (vector - vector.mean()) / sigma

            output = frozen(z) + norm.bias
            for j in range(probs.shape[2]):
                part = hf_attention_part(attn, values, probs, i, j) + (record.input[0, i] if i == j else 0)
                importance = -F.pairwise_distance(frozen(part)[None], output[None], p=1)[0]
                scores[i, j] = (importance + output.abs().sum()).clamp(min=0)
        return scores / scores.sum(-1, keepdim=True)


def test_alti_reference_convention_is_the_released_codes_formula():
    """``convention="reference"`` equals the authors' released formula in float64 (where its 1e-6 shows), and differs
    from the paper's."""
    model = tiny_encoder("bert", "masked_lm", seed=3).double()
    kwargs, trace = _trace(model, *PAIR)
    spec = get_spec(model)
    compute = inseq_mixing.declarations.DECLARATIONS["alti"].compute
    reference = compute(_request(model, trace, kwargs), _options("alti", convention="reference")).target
    paper = compute(_request(model, trace, kwargs), _options("alti")).target
    for idx in range(len(spec.decoder.layers)):
        torch.testing.assert_close(reference[0, idx], released_alti_layer(model, spec, trace, kwargs, idx),
                                   atol=1e-12, rtol=1e-10)  # fmt: skip
    assert float((reference - paper).abs().max()) > 1e-8


def _options(method: str, **values):
    """Per-layer maps: ``per_layer=True``, which every map method takes."""
    declaration = inseq_mixing.declarations.DECLARATIONS[method]
    per_layer = {"per_layer": True}
    return declaration.make_options({**per_layer, **values})


def _request(model, trace, kwargs):
    ids = kwargs["input_ids"]
    return inseq_mixing.declarations.Request(
        get_spec(model), model, kwargs["attention_mask"], None, None, torch.zeros_like(ids), None,
        kwargs["attention_mask"].bool(), lambda: trace,
    )  # fmt: skip


def naive_encoder_vectors(model, kwargs, trace, layer_index: int, norms: str):
    """Self-attention vectors ``z_ij`` of batch 0 at one layer, for every pair (no causal mask), through the HF value
    and output projections; ``norms``: ``""`` (N), ``"residual"`` (N-Res), ``"ln"`` (N-ResLN: + the attention's
    post-LN, frozen; pre-LN: the FFN's input norm), ``"globenc"`` (+ the FFN's post-LN too; pre-LN: no norm)."""
    spec = get_spec(model)
    layer, record = spec.decoder.layers[layer_index], trace.decoder.layers[layer_index]
    attn = layer.self_attn
    values = hf_value_vectors(attn, capture_value_inputs(model, spec, kwargs)[("decoder", layer_index, "self")])
    num = int(kwargs["attention_mask"][0].sum())
    vectors = torch.zeros(num, num, record.input.shape[-1])
    with torch.no_grad():
        for i in range(num):
            for j in range(num):
                part = hf_attention_part(attn, values, record.self_attn.probs[0], i, j)
                if norms and i == j:
                    part = part + record.input[0, i]
                if norms in ("ln", "globenc") and attn.post_norm is not None:
                    part = frozen_norm_map(attn.post_norm, record.self_attn.norm_input[0, i])(part)
                elif norms == "ln":  # pre-LN (ModernBERT): the norm that next reads the residual stream
                    part = frozen_norm_map(layer.ffn.in_norm, record.ffn_norm_input[0, i])(part)
                if norms == "globenc" and layer.ffn.post_norm is not None:
                    part = frozen_norm_map(layer.ffn.post_norm, record.ffn_norm_input[0, i])(part)
                vectors[i, j] = part
    return vectors


def test_attention_norm_and_globenc_match_the_definition_pair_by_pair(family):
    model = encoder(family)
    kwargs, trace = _trace(model, TEXTS[:1])
    num = int(kwargs["attention_mask"][0].sum())
    for variant, options in (("", {}), ("residual", {"residual": True}), ("ln", {"layer_norm": True})):
        maps = attention_norm(trace, **options)
        for idx in range(maps.target.shape[1]):
            naive = torch.linalg.vector_norm(naive_encoder_vectors(model, kwargs, trace, idx, variant), dim=-1)
            torch.testing.assert_close(maps.target[0, idx, :num, :num], naive, atol=1e-5, rtol=1e-4)
    maps = globenc(trace, rollout=False)
    for idx in range(maps.target.shape[1]):
        naive = torch.linalg.vector_norm(naive_encoder_vectors(model, kwargs, trace, idx, "globenc"), dim=-1)
        expected = naive / naive.sum(-1, keepdim=True)
        torch.testing.assert_close(maps.target[0, idx, :num, :num], expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("method", LOGIT_METHODS + MAP_METHODS + ("integrated_gradients",))
def test_a_padded_batch_equals_each_text_alone(method):
    model = encoder("bert", "sequence_classification")
    attribution = inseq_mixing.load_model(model, method, tokenizer=tokenizer())
    texts = ["the dog sat on the mat and it read many books", "a cat"]
    batched = attribution.attribute(texts, show_progress=False, batch_size=2)
    for text, sequence in zip(texts, batched.sequence_attributions, strict=True):
        alone = attribution.attribute(text, show_progress=False).sequence_attributions[0]
        torch.testing.assert_close(sequence.source_attributions, alone.source_attributions, atol=1e-5, rtol=1e-4)
        for name, value in alone.step_scores.items():
            torch.testing.assert_close(sequence.step_scores[name], value, atol=1e-5, rtol=1e-4)
        for name, value in (alone.sequence_scores or {}).items():
            torch.testing.assert_close(sequence.sequence_scores[name], value, atol=1e-5, rtol=1e-4)


def test_token_types_are_passed_to_the_model():
    """A sentence pair's second segment has token type 1: the scores are those of the model given both."""
    model = encoder("bert", "sequence_classification")
    attribution = inseq_mixing.load_model(model, "alti_logit", tokenizer=tokenizer())
    out = attribution.attribute(" ".join(PAIR), show_progress=False)  # one segment: token types all 0
    with torch.no_grad():
        single = model(**model_inputs([" ".join(PAIR)])).logits
    label = out.sequence_attributions[0].target[0].id
    torch.testing.assert_close(out.sequence_attributions[0].step_scores["logit"], single[:, label], atol=1e-5,
                               rtol=1e-5)  # fmt: skip
    kwargs, trace = _trace(model, *PAIR)
    assert kwargs["token_type_ids"].max() == 1
    with torch.no_grad():
        paired = model(**kwargs).logits
    torch.testing.assert_close(trace.logits[:, 0], paired, atol=1e-5, rtol=1e-5)


def test_bare_encoders_take_map_methods_and_explain_the_first_token_by_default(family):
    model = encoder(family, "bare")
    out = inseq_mixing.load_model(model, "alti", tokenizer=tokenizer()).attribute(TEXTS, show_progress=False)
    sequence = out.sequence_attributions[0]
    assert [token.token for token in sequence.target] == ["[CLS]"]
    maps = sequence.sequence_scores["encoder_self_scores"]
    assert maps.shape == (len(sequence.source), len(sequence.source))
    torch.testing.assert_close(sequence.source_attributions[:, 0], maps[:, 0])
    torch.testing.assert_close(maps.sum(0), torch.ones(len(sequence.source)))  # every row sums to 1
    chosen = inseq_mixing.load_model(model, "value_zeroing", tokenizer=tokenizer())
    out = chosen.attribute(TEXTS[0], positions=[2, 3], show_progress=False)
    assert [token.token for token in out.sequence_attributions[0].target] == ["dog", "[MASK]"]
    assert out.sequence_attributions[0].source_attributions.shape[1:] == (2,)  # (tokens, explained): one map
    for method in LOGIT_METHODS + ("integrated_gradients",):
        with pytest.raises(ValueError, match="ForMaskedLM, ...ForSequenceClassification"):
            inseq_mixing.load_model(model, method, tokenizer=tokenizer())


def test_show_save_load_and_weighting_work_as_for_generation_models(tmp_path):
    model = encoder("roberta", "masked_lm")
    for method in ("decompx", "value_zeroing"):
        out = inseq_mixing.load_model(model, method, tokenizer=tokenizer()).attribute(TEXTS, show_progress=False)
        page = out.show(display=False, return_html=True)
        assert page.count("<table") >= 2 and "[MASK]" in page
        path = tmp_path / f"{method}.json"
        out.save(path)
        loaded = inseq.FeatureAttributionOutput.load(path)
        for before, after in zip(out.sequence_attributions, loaded.sequence_attributions, strict=True):
            torch.testing.assert_close(after.source_attributions, before.source_attributions)
        assert loaded.info["attributed_fn"] == out.info["attributed_fn"]
        assert out.aggregate().sequence_attributions[0].source_attributions.ndim == 2
    logit_out = inseq_mixing.load_model(model, "decompx", tokenizer=tokenizer()).attribute(TEXTS, show_progress=False)
    before = [seq.source_attributions.clone() for seq in logit_out.sequence_attributions]
    logit_out.weight_attributions("logit")
    for seq, scores in zip(logit_out.sequence_attributions, before, strict=True):
        torch.testing.assert_close(seq.source_attributions, scores * seq.step_scores["logit"])


def test_a_failed_call_leaves_the_model_as_it_was():
    model = tiny_encoder("bert", "masked_lm")
    model.train()
    model.set_attn_implementation("sdpa")
    attribution = inseq_mixing.load_model(model, "value_zeroing", tokenizer=tokenizer())
    with torch.no_grad():
        model.bert.encoder.layer[1].intermediate.dense.weight[0, 0] = float("nan")
    hooks = sum(len(module._forward_hooks) + len(module._forward_pre_hooks) for module in model.modules())
    with pytest.raises((FloatingPointError, ValueError), match="non-finite|NaN"):
        attribution.attribute(TEXTS, show_progress=False)
    assert model.training and model.config._attn_implementation == "sdpa"
    assert hooks == sum(len(module._forward_hooks) + len(module._forward_pre_hooks) for module in model.modules())


def test_bad_inputs_get_errors_that_say_what_to_do():
    mlm = inseq_mixing.load_model(encoder("bert"), "alti_logit", tokenizer=tokenizer())
    with pytest.raises(ValueError, match=r"no mask token: put \[MASK\]"):
        mlm.attribute("the dog sat", show_progress=False)
    with pytest.raises(ValueError, match="unknown token"):
        mlm.attribute("the dog [MASK]", "zyzzyva", show_progress=False)
    with pytest.raises(ValueError, match="2 position"):
        mlm.attribute("the [MASK] [MASK]", "dog", show_progress=False)
    classifier = inseq_mixing.load_model(encoder("bert", "sequence_classification"), "decompx", tokenizer=tokenizer())
    with pytest.raises(ValueError, match="Unknown label 'happy'.*negative"):
        classifier.attribute("the dog sat", "happy", show_progress=False)
    with pytest.raises(ValueError, match="Unknown option"):
        classifier.attribute("the dog sat", nope=1, show_progress=False)
    with pytest.raises(ValueError, match="Unknown method"):
        inseq_mixing.load_model(encoder("bert"), "lime", tokenizer=tokenizer())


def test_gradient_baselines_explain_the_same_logit():
    """Captum's methods run on the same input and explain the same logit; Integrated Gradients' scores add up to
    the logit minus the all-zero-embedding baseline's (its completeness)."""
    model = encoder("electra", "sequence_classification")
    kwargs = model_inputs(TEXTS[:1])
    label = int(own_logits(model, TEXTS[:1]).argmax())
    for method in ("integrated_gradients", "deeplift", "saliency", "input_x_gradient"):
        out = inseq_mixing.load_model(model, method, tokenizer=tokenizer()).attribute(TEXTS[0], show_progress=False)
        sequence = out.sequence_attributions[0]
        assert sequence.target[0].id == label and sequence.source_attributions.shape == (len(sequence.source), 1)
    out = inseq_mixing.load_model(model, "integrated_gradients", tokenizer=tokenizer()).attribute(
        TEXTS[0], n_steps=300, show_progress=False
    )
    others = {name: value for name, value in kwargs.items() if name != "input_ids"}
    with torch.no_grad():
        width = model.get_input_embeddings().embedding_dim
        zero = model(inputs_embeds=torch.zeros(1, kwargs["input_ids"].shape[1], width), **others).logits[0, label]
    logit = out.sequence_attributions[0].step_scores["logit"]
    torch.testing.assert_close(out.sequence_attributions[0].source_attributions.sum(), logit[0] - zero, atol=2e-3,
                               rtol=2e-2)  # fmt: skip


def test_alti_rows_read_from_the_maps_of_every_position():
    """A masked LM's explained row is the mask position's row of the full encoder map."""
    model = encoder("distilbert")
    out = inseq_mixing.load_model(model, "alti", tokenizer=tokenizer()).attribute(TEXTS[0], show_progress=False)
    sequence = out.sequence_attributions[0]
    maps = sequence.sequence_scores["encoder_self_scores"]
    mask = [token.token for token in sequence.source].index("[MASK]")
    torch.testing.assert_close(sequence.source_attributions[:, 0], maps[:, mask])
    assert F.relu(-maps).sum() == 0


@given(
    family=st.sampled_from(ENCODER_FAMILIES),
    task=st.sampled_from(["masked_lm", "sequence_classification", "token_classification"]),
    layers=st.integers(1, 3),
    heads=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([2, 4]),
    lengths=st.lists(st.integers(1, 7), min_size=1, max_size=3),
    seed=st.integers(0, 1000),
)
def test_every_configuration_is_complete_and_padding_free(family, task, layers, heads, head_dim, lengths, seed):
    """For random encoders: ALTI-logit's and DecompX's parts add up to the model's own logit in a padded batch, and
    each text's scores are its scores alone; ALTI's and value zeroing's rows sum to 1."""
    model = tiny_encoder(family, task, d_model=heads * head_dim * 2, layers=layers, heads=heads,
                         ffn=heads * head_dim * 4, seed=seed)  # fmt: skip
    generator = torch.Generator().manual_seed(seed)
    words = tokenizer().convert_ids_to_tokens(list(range(5, len(tokenizer()))))
    texts = [
        " ".join(words[i] for i in torch.randint(len(words), (length,), generator=generator)) for length in lengths
    ]
    texts = [f"{text} [MASK]" if task == "masked_lm" else text for text in texts]
    logits = own_logits(model, texts)
    for method in ("alti_logit", "decompx", "alti", "value_zeroing"):
        attribution = inseq_mixing.load_model(model, method, tokenizer=tokenizer())
        batched = attribution.attribute(texts, show_progress=False)
        for row, (text, sequence) in enumerate(zip(texts, batched.sequence_attributions, strict=True)):
            alone = attribution.attribute(text, show_progress=False).sequence_attributions[0]
            torch.testing.assert_close(sequence.source_attributions, alone.source_attributions, atol=1e-4, rtol=1e-3)
            if method in LOGIT_METHODS:
                ids = torch.tensor([token.id for token in sequence.target])
                length = len(sequence.source)
                cells = _explained_cells(model_inputs(texts)["input_ids"][row], task, length)
                expected = logits[row, ids] if task == "sequence_classification" else logits[row, cells, ids]
                terms = sum(v for k, v in sequence.step_scores.items() if k.startswith("unattributed_"))
                torch.testing.assert_close(sequence.source_attributions.sum(0) + terms, expected, atol=1e-4, rtol=1e-3)
            else:
                maps = sequence.sequence_scores["encoder_self_scores"]
                torch.testing.assert_close(maps.sum(0), torch.ones(maps.shape[1:]), atol=1e-5, rtol=1e-5)


def test_models_that_mix_tokens_outside_one_position_are_refused_with_the_reason():
    import transformers

    from inseq_mixing.specs import UnsupportedModelError

    config = tiny_encoder("deberta-v2", "bare").config
    config.conv_kernel_size = 3
    with pytest.raises(UnsupportedModelError, match="convolution beside its first block"):
        get_spec(transformers.DebertaV2Model(config))
    config = tiny_encoder("modernbert", "sequence_classification").config
    config.classifier_pooling = "mean"
    with pytest.raises(UnsupportedModelError, match="pools by 'mean'"):
        get_spec(transformers.ModernBertForSequenceClassification(config))


# ----- dataset runs and the papers' protocols on encoder models -----


@pytest.fixture(scope="module")
def encoder_dirs(tmp_path_factory) -> dict:
    """A tiny BERT masked LM and a tiny RoBERTa classifier saved with the tokenizer, as a user's checkpoints."""
    folders = {}
    for name, family, task in (("mlm", "bert", "masked_lm"), ("clf", "roberta", "sequence_classification")):
        folder = tmp_path_factory.mktemp(name)
        encoder(family, task).save_pretrained(folder)
        tokenizer().save_pretrained(folder)
        folders[name] = folder
    return folders


MLM_ROWS = [
    {"source": "the books on the mat [MASK] read", "target": "were", "foil": "was", "cues": ["books"],
     "evidence": ["books"]},
    {"source": "a dog [MASK] on the mat", "target": "sat", "foil": "read", "cues": ["dog"],
     "evidence": ["dog", "mat"]},
    {"source": "the cat near the dogs [MASK]", "target": "sat", "foil": "sat", "cues": ["cat"], "evidence": ["cat"]},
    {"source": "no mask here", "target": "sat", "cues": ["mask"], "evidence": ["no"]},
]  # fmt: skip
CLF_ROWS = [{"source": "the dog sat on the mat and read many books", "target": "neutral"},
            {"source": "a cat sat", "target": 2}, {"source": "the books were read by many people"}]  # fmt: skip


def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(row) for row in rows))
    return path


def test_a_dataset_run_of_an_encoder_stores_what_attribute_gives_each_text_alone(encoder_dirs, tmp_path):
    data = _jsonl(tmp_path / "clf.jsonl", CLF_ROWS)
    model = inseq_mixing.load_model(str(encoder_dirs["clf"]), "decompx")
    for method, options in (("decompx", {}), ("value_zeroing", {}), ("integrated_gradients", {"n_steps": 4})):
        summary = inseq_mixing.attribute_dataset(str(encoder_dirs["clf"]), method, data, tmp_path / method,
                                                 batch_size=2, show_progress=False, **options)  # fmt: skip
        assert summary.attributed == 3
        run = inseq_mixing.load_run(tmp_path / method)
        alone = inseq_mixing.load_model(model.model, method, tokenizer=model.tokenizer)
        for row, stored in zip(CLF_ROWS, run.to_inseq().sequence_attributions, strict=True):
            target = None if "target" not in row else str(row["target"])
            expected = alone.attribute(row["source"], target, show_progress=False, **options).sequence_attributions[0]
            assert [t.id for t in stored.target] == [t.id for t in expected.target]
            torch.testing.assert_close(stored.source_attributions, expected.source_attributions, atol=1e-5, rtol=1e-4)
            for name, value in expected.step_scores.items():
                torch.testing.assert_close(stored.step_scores[name], value, atol=1e-5, rtol=1e-4)
    assert [t.token for t in run.to_inseq().sequence_attributions[0].target] == ["neutral"]


def test_the_commands_take_encoder_models(encoder_dirs, tmp_path, capsys):
    from inseq_mixing.cli import main

    data = _jsonl(tmp_path / "mlm.jsonl", MLM_ROWS[:2])
    assert main(["attribute-dataset", str(data), "--model", str(encoder_dirs["mlm"]), "--method", "alti_logit",
                 "--out", str(tmp_path / "run")]) == 0  # fmt: skip
    stored = inseq_mixing.load_run(tmp_path / "run").to_inseq().sequence_attributions
    assert [[t.token for t in seq.target] for seq in stored] == [["were"], ["sat"]]  # the target column, per mask
    for protocol in ("cue", "evidence"):
        out = tmp_path / f"{protocol}.html"
        code = main(["evaluate", str(data), "--model", str(encoder_dirs["mlm"]), "--protocol", protocol, "--methods",
                     "value_zeroing", "alti_logit", "--draws", "20", "--out", str(out)])  # fmt: skip
        assert code == 0, capsys.readouterr().err
        assert out.is_file()
    page = tmp_path / "c.html"
    code = main(["compare", "the dog sat on the mat and read many books", "--model", str(encoder_dirs["clf"]),
                 "--methods", "decompx", "value_zeroing", "integrated_gradients", "--out", str(page),
                 "--option", "value_zeroing:per_layer=true"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert page.read_text().count('class="heatmap"') >= 3 and "per layer" in page.read_text()


def test_compare_scores_an_encoder_by_deleting_tokens(encoder_dirs):
    """Each method's AOPC row is the deletion AOPC of its own ranking, and every two methods get an agreement."""
    from inseq_mixing.evaluation.encoders import encoder_faithfulness

    texts = [row["source"] for row in CLF_ROWS]
    result = inseq_mixing.compare(str(encoder_dirs["clf"]), ["decompx", "alti"], texts, random_draws=2)
    assert set(result.outputs) == {"decompx", "alti"} and len(result.agreement) == len(texts)
    front = inseq_mixing.load_model(str(encoder_dirs["clf"]), "alti")
    own = encoder_faithfulness(front, list(_wrapped(result.outputs["alti"])), random_draws=2)
    rows = [row for row in result.tokens if row["method"] == "alti"]
    assert [row["comprehensiveness_prob"] for row in rows] == [row["comprehensiveness_prob"] for row in own]


def _wrapped(out):
    from types import SimpleNamespace

    return (SimpleNamespace(seq=seq) for seq in out.sequence_attributions)


def test_cue_and_evidence_on_a_masked_lm_read_the_mask_row(encoder_dirs, tmp_path):
    """The cue contribution is the share of the mask position's row on the cue words, per layer, from the front
    end's own output; rows without a mask, or whose target and foil share their token, are skipped with the reason."""
    data = _jsonl(tmp_path / "mlm.jsonl", MLM_ROWS)
    evaluation = inseq_mixing.evaluate(str(encoder_dirs["mlm"]), ["value_zeroing", "alti_logit"], data, "cue",
                                       draws=20)  # fmt: skip
    reasons = {skip.row: skip.reason for skip in evaluation.skipped}
    assert set(reasons) == {2, 3} and "share their explained token" in reasons[2] and "no mask token" in reasons[3]
    front = inseq_mixing.load_model(str(encoder_dirs["mlm"]), "value_zeroing")
    shares = []
    for row in MLM_ROWS[:2]:
        seq = front.attribute(row["source"], row["target"], show_progress=False, per_layer=True)
        seq, words = seq.sequence_attributions[0], row["source"].split()
        scores = seq.source_attributions[1:-1, 0]  # (words, layers): one token per word, [CLS] and [SEP] left out
        cue = scores[[words.index(word) for word in row["cues"]]].sum(0)
        shares.append(cue / scores.sum(0))
    expected = torch.stack(shares).mean(0)  # per layer
    result = evaluation.results["value_zeroing"]
    layers = torch.stack([statistic.value() for statistic in result.layer_statistics])
    torch.testing.assert_close(layers, expected.double(), atol=1e-5, rtol=1e-4)
    evidence = inseq_mixing.evaluate(str(encoder_dirs["mlm"]), ["alti_logit"], data, "evidence", draws=20)
    assert 0 < float(evidence.results["alti_logit"].statistics["mrr"].value()) <= 1


def test_faithfulness_deletes_the_top_tokens_of_a_classifier(encoder_dirs, tmp_path):
    """The probabilities AOPC reads after deleting tokens are the model's on the text without them."""
    from inseq_mixing.evaluation.encoders import _reader

    front = inseq_mixing.load_model(str(encoder_dirs["clf"]), "alti")
    text = CLF_ROWS[0]["source"]
    ids = torch.tensor(tokenizer()(text).input_ids)
    read = _reader(front, ids, 0, 1)
    kept = torch.ones(len(ids), dtype=torch.bool)
    kept[[2, 5]] = False  # "dog" and "mat"
    prob, logit = read(kept[None])
    shorter = " ".join(word for n, word in enumerate(text.split()) if n not in (1, 4))
    with torch.no_grad():
        direct = front.model(**model_inputs([shorter])).logits[0]
    torch.testing.assert_close(logit[0], direct[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(prob[0], direct.softmax(-1)[1], atol=1e-6, rtol=1e-5)
    data = _jsonl(tmp_path / "clf.jsonl", CLF_ROWS[:2])
    evaluation = inseq_mixing.evaluate(str(encoder_dirs["clf"]), ["decompx", "alti"], data, "faithfulness", draws=20)
    assert set(evaluation.results) == {"decompx", "alti"} and "comprehensiveness_prob" in evaluation.baseline


@pytest.mark.parametrize("task", ["masked_lm", "sequence_classification"])
def test_decompx_through_the_head_adds_up_for_every_bias_split(task):
    """The components go through the head's steps with each bias split on the way: every split and convention adds up
    to the model's logit."""
    from inseq_mixing.methods.decompx import BIAS_SPLITS, CONVENTIONS, DecompXOptions, decompx

    model = encoder("roberta", task)
    kwargs, trace = _trace(model, TEXTS[:1])
    label = torch.full_like(kwargs["input_ids"], 2)
    expected = trace.logits[0, :, 2]
    with torch.no_grad():
        own = model(**kwargs).logits[0]
    torch.testing.assert_close(expected[0] if task != "masked_lm" else expected, own[2] if task != "masked_lm" else
                               own[:, 2], atol=1e-5, rtol=1e-5)  # fmt: skip
    for bias in BIAS_SPLITS:
        for convention in CONVENTIONS:
            scores = decompx(trace, label, options=DecompXOptions(bias=bias, convention=convention))
            total = scores.target[0].sum(-1) + (0 if scores.bias is None else scores.bias[0])
            torch.testing.assert_close(total, expected, atol=1e-4, rtol=1e-4)


def test_the_reference_convention_keeps_the_first_value_bias_with_each_token():
    """The released code's first layer gives its value bias to each key's own token: with bias='separate', the two
    conventions differ by that alone, so they agree once it is zero."""
    from inseq_mixing.methods.decompx import DecompXOptions, decompx

    model = tiny_encoder("bert", "sequence_classification")
    kwargs = model_inputs(TEXTS[:1])

    def both():
        trace = _trace(model, TEXTS[:1])[1]
        label = torch.zeros_like(kwargs["input_ids"])
        return [decompx(trace, label, options=DecompXOptions(bias="separate", convention=convention)).target[0, 0]
                for convention in ("paper", "reference")]  # fmt: skip

    paper, reference = both()
    assert (paper - reference).abs().max() > 1e-4
    with torch.no_grad():
        model.bert.encoder.layer[0].attention.self.value.bias.zero_()
    paper, reference = both()
    torch.testing.assert_close(paper, reference, atol=1e-6, rtol=1e-5)


# ----- the invariants every method inherits, on every encoder family -----

ALL_METHODS = LOGIT_METHODS + MAP_METHODS


@pytest.mark.parametrize("method", ALL_METHODS)
def test_bfloat16_runs_and_nan_weights_are_refused_on_every_family(family, method):
    """Half precision gives finite scores; a NaN weight is refused with a clear error, the weights and hooks left as
    they were; a call that fails in the last block leaves no hook behind and the model's own output unchanged."""
    model = tiny_encoder(family, "sequence_classification").to(torch.bfloat16)
    out = inseq_mixing.load_model(model, method, tokenizer=tokenizer()).attribute(TEXTS[0], show_progress=False)
    assert torch.isfinite(out.sequence_attributions[0].source_attributions).all()
    model = tiny_encoder(family, "sequence_classification")
    attribution = inseq_mixing.load_model(model, method, tokenizer=tokenizer())
    with torch.no_grad():
        before = model(**model_inputs(TEXTS[:1])).logits
    last = get_spec(model).decoder.layers[-1].module

    def fail(*_):
        raise RuntimeError("provoked")

    handle = last.register_forward_hook(fail)
    try:
        with pytest.raises(RuntimeError, match="provoked"):
            attribution.attribute(TEXTS[0], show_progress=False)
    finally:
        handle.remove()
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in model.modules())
    with torch.no_grad():
        torch.testing.assert_close(model(**model_inputs(TEXTS[:1])).logits, before, rtol=0, atol=0)
        next(p for name, p in model.named_parameters() if p.dim() == 2 and "embed" not in name)[0, 0] = float("nan")
    state = {name: value.clone() for name, value in model.state_dict().items()}
    with pytest.raises((ValueError, FloatingPointError), match="(?i)nan|non-finite|finite"):
        attribution.attribute(TEXTS[0], show_progress=False)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, state[name], rtol=0, atol=0, equal_nan=True)


def test_debertas_tied_masked_lm_head_adds_up():
    """DeBERTa-v2's non-legacy masked-LM head reads out through the word embeddings' transpose plus its own bias."""
    import transformers

    config = tiny_encoder("deberta-v2", "bare").config
    config.legacy = False
    model = transformers.DebertaV2ForMaskedLM(config).eval()
    randomize_weights(model, 3)  # the head's own bias included
    assert model.lm_predictions.lm_head.bias.abs().max() > 0
    logits = own_logits(model, TEXTS[:1])[0]
    cell = _explained_cells(model_inputs(TEXTS[:1])["input_ids"][0], "masked_lm", logits.shape[0])
    for method in LOGIT_METHODS:
        out = inseq_mixing.load_model(model, method, tokenizer=tokenizer()).attribute(TEXTS[0], show_progress=False)
        sequence = out.sequence_attributions[0]
        terms = sum(value for name, value in sequence.step_scores.items() if name.startswith("unattributed_"))
        expected = logits[cell, sequence.target[0].id]
        torch.testing.assert_close(sequence.source_attributions.sum(0) + terms, expected, atol=1e-4, rtol=1e-4)


def test_a_dataset_run_takes_an_encoder_attribution_model_for_another_method(tmp_path):
    data = _jsonl(tmp_path / "clf.jsonl", CLF_ROWS[:2])
    front = inseq_mixing.load_model(encoder("bert", "sequence_classification"), "alti", tokenizer=tokenizer())
    summary = inseq_mixing.attribute_dataset(front, "decompx", data, tmp_path / "run", show_progress=False)
    assert summary.attributed == 2
    assert inseq_mixing.load_run(tmp_path / "run").manifest["method"] == "decompx"


def test_load_model_sends_generation_models_to_inseq_in_the_dtype_asked():
    from inseq_mixing.testing import tiny_model, word_tokenizer

    model = inseq_mixing.load_model(tiny_model("gpt2"), "alti_logit", tokenizer=word_tokenizer(False),
                                    dtype=torch.bfloat16)  # fmt: skip
    assert isinstance(model, inseq.models.AttributionModel) and model.model.dtype == torch.bfloat16
    encoder_model = inseq_mixing.load_model(tiny_encoder("bert"), "alti", tokenizer=tokenizer(), dtype=torch.float64)
    assert encoder_model.model.dtype == torch.float64
