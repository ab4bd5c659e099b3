"""Spans of a generation, context units and hops (``model.attribute(..., spans=, units=, hops=)``).

Every property is checked against the per-token output of the same method through Inseq's ``model.attribute`` (one
column per generated token) and against the model's own logits: a span's scores are the sum of its tokens' columns
(logit methods) or their mean (maps), its logit the sum of the model's logits, units the sum of their tokens, a batch
each input alone, hops a token-by-token recursion written here.
"""

import inseq
import pytest
import torch

import inseq_mixing  # noqa: F401  (registers the methods)
from inseq_mixing.testing import ALL_FAMILIES, DECODER_FAMILIES, LOGIT_METHODS, is_seq2seq, tiny_model, word_tokenizer

PROMPT = "the cat sat on the mat . the dog sat on it ."
ANSWERS = {False: " she read a book . they sat .", True: "le chat assis sur tapis . il lus ."}

_LOADED = {}


def loaded(family: str, method: str):
    if (family, method) not in _LOADED:
        tokenizer = word_tokenizer(seq2seq=is_seq2seq(family))
        _LOADED[family, method] = inseq.load_model(tiny_model(family), method, tokenizer=tokenizer)
    return _LOADED[family, method]


def texts(family: str, prompt: str = PROMPT) -> tuple[str, str]:
    seq2seq = is_seq2seq(family)
    return prompt, ANSWERS[True] if seq2seq else prompt + ANSWERS[False]


def per_token(model, family: str, prompt: str, generated: str) -> tuple[torch.Tensor, list[int], list[int]]:
    """The method's per-token output through Inseq: every key's score ``(keys, columns)`` (the decoder's tokens, then
    an encoder–decoder's source; NaN cells of later tokens as 0), the decoder token each column explains, and the
    decoder token ids."""
    seq2seq = is_seq2seq(family)
    out = model.attribute(prompt, generated, show_progress=False, **({"attribute_target": True} if seq2seq else {}))
    sequence = out.sequence_attributions[0]
    keys = sequence.target_attributions
    if seq2seq:
        keys = torch.cat([keys, sequence.source_attributions], 0)
    columns = list(range(sequence.attr_pos_start, sequence.attr_pos_end))
    return keys.nan_to_num(0.0).double(), columns, [token.id for token in sequence.target]


def model_logits(model, family: str, prompt: str, generated: str) -> tuple[torch.Tensor, list[int]]:
    """The model's own logit of each decoder token ``(T,)`` (0 where nothing predicts it; before a final soft-cap,
    which the methods explain) and the decoder ids."""
    tokenizer, net = model.tokenizer, model.model
    with torch.no_grad():
        if is_seq2seq(family):
            ids = [net.config.decoder_start_token_id, *tokenizer(text_target=generated)["input_ids"]]
            source = torch.tensor([tokenizer(prompt)["input_ids"]])
            logits = net(input_ids=source, decoder_input_ids=torch.tensor([ids])).logits[0]
        else:
            ids = tokenizer(generated)["input_ids"]
            logits = net(input_ids=torch.tensor([ids])).logits[0]
    cap = getattr(net.config, "final_logit_softcapping", None)
    if cap:
        logits = cap * torch.atanh(logits.double() / cap)
    chosen = torch.zeros(len(ids), dtype=torch.float64)
    chosen[1:] = logits[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].double()
    return chosen, ids


@pytest.mark.parametrize("method", LOGIT_METHODS)
@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_a_span_is_the_sum_of_its_tokens_and_complete(family, method):
    """Two spans (the answer's sentences) over token units: each unit's score is the sum of the per-token columns of
    the span's tokens (AttnLRP: one backward pass per span against one per token), each span's logit the sum of the
    model's own logits, and unit scores plus the unattributed terms add up to it."""
    model = loaded(family, method)
    prompt, generated = texts(family)
    out = model.attribute(prompt, generated, spans="sentences", units="tokens", show_progress=False)
    sequence, info = out.sequence_attributions[0], out.info
    keys, columns, ids = per_token(model, family, prompt, generated)
    logits, own_ids = model_logits(model, family, prompt, generated)
    assert ids == own_ids
    assert len(info["spans"][0]) == 2 and info["spans"][0][1].strip().startswith(("they", "il"))
    scores = sequence.source_attributions.double()
    assert scores.shape == (len(info["units"][0]), 2)
    tolerance = {"rtol": 1e-4, "atol": 1e-4 * float(keys.abs().max())}
    for span, tokens in enumerate(info["span_tokens"][0]):
        cells = [columns.index(token) for token in tokens]
        expected = torch.stack([keys[unit_keys][:, cells].sum() for unit_keys in info["unit_keys"][0]])
        torch.testing.assert_close(scores[:, span], expected, **tolerance)
        own = logits[tokens].sum()
        torch.testing.assert_close(sequence.step_scores["logit"][span].double(), own, rtol=1e-4, atol=1e-4)
        terms = sum(value[span].double() for name, value in sequence.step_scores.items() if name.startswith("un"))
        torch.testing.assert_close(scores[:, span].sum() + terms, own, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", ["alti_logit", "decompx", "attention_rollout", "attn_lrp"])
@pytest.mark.parametrize("family", ["gpt2", "marian"])
def test_a_span_call_never_computes_the_full_vocabulary_logits(family, method):
    """No step score of a span call reads the LM head's logits over the vocabulary (at 4,096 tokens of a GPT-2-sized
    model, 0.8 GB): its trace skips the head's product (the head runs as a broadcast view of zeros) and the logit
    methods gather the explained tokens' logits from the final hidden state (complete against the model's own
    logits: the test above)."""
    model = loaded(family, method)
    calls = []
    head = model.model.get_output_embeddings()
    handle = head.register_forward_hook(lambda module, args, output: calls.append(output.stride(-1)))
    try:
        model.attribute(*texts(family), spans="answer", units="sentences", show_progress=False)
    finally:
        handle.remove()
    assert calls and all(stride == 0 for stride in calls)


@pytest.mark.parametrize(
    ("family", "method"),
    [(family, "alti") for family in ALL_FAMILIES]
    + [(family, method) for family in ("gpt2", "llama", "bart", "t5") for method in ("value_zeroing",
                                                                                     "attention_rollout")],
)  # fmt: skip
def test_a_map_span_is_the_mean_of_its_rows(family, method):
    """Map methods give a span the mean of its tokens' rows (every slot of per-layer maps too)."""
    model = loaded(family, method)
    prompt, generated = texts(family)
    out = model.attribute(prompt, generated, spans="answer", units="tokens", show_progress=False)
    sequence, info = out.sequence_attributions[0], out.info
    keys, columns, _ = per_token(model, family, prompt, generated)
    cells = [columns.index(token) for token in info["span_tokens"][0][0]]
    expected = torch.stack([keys[unit_keys][:, cells].sum(0).mean(0) for unit_keys in info["unit_keys"][0]])
    torch.testing.assert_close(sequence.source_attributions[:, 0].double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_span_s_context_mixing_ratio_is_its_rows_mean_per_layer(family):
    """The attention norm's context-mixing ratio (per position and layer) of each span, in its sequence scores
    ``(spans, layers)``: the mean of the rows that predict the span's tokens, layer by layer."""
    model = loaded(family, "attention_norm")
    prompt, generated = texts(family)
    ratio = model.attribute(prompt, generated, show_progress=False).sequence_attributions[0]
    ratio = ratio.sequence_scores["context_mixing_ratio"]  # (positions, layers): row t predicts token t + 1
    out = model.attribute(prompt, generated, spans="sentences", units="tokens", show_progress=False)
    spans, tokens = out.sequence_attributions[0].sequence_scores["context_mixing_ratio"], out.info["span_tokens"][0]
    assert spans.shape == (2, ratio.shape[1])
    for span, span_tokens in enumerate(tokens):
        torch.testing.assert_close(spans[span], ratio[[token - 1 for token in span_tokens]].mean(0))


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_units_are_the_sum_of_their_tokens_and_partition_the_text(family):
    """Sentences, passages and given documents: each unit's score is the sum of its tokens' scores, units cover every
    token once (the rest is its own unit), and their labels name them."""
    model = loaded(family, "alti_logit")
    prompt = "the cat sat on the mat .\n\nthe dog sat on it . she read a book ."
    prompt, generated = texts(family, prompt)
    tokens = model.attribute(prompt, generated, units="tokens", show_progress=False)
    by_token = tokens.sequence_attributions[0].source_attributions[:, 0].double()
    token_keys = [keys[0] for keys in tokens.info["unit_keys"][0]]
    for units in ("sentences", "passages", ["the dog sat on it .", "she read a book ."]):
        out = model.attribute(prompt, generated, units=units, show_progress=False)
        unit_keys = out.info["unit_keys"][0]
        flat = sorted(key for keys in unit_keys for key in keys)
        assert flat == sorted(set(flat)) and len(flat) == len(out.info["unit_keys"][0][-1]) + sum(
            len(keys) for keys in unit_keys[:-1]
        )
        everything = len(generated.split()) + (len(prompt.split()) if is_seq2seq(family) else 0)
        assert len(flat) >= everything
        scores = out.sequence_attributions[0].source_attributions[:, 0].double()
        for unit, keys in enumerate(unit_keys):
            expected = sum((by_token[token_keys.index(key)] for key in keys if key in token_keys), torch.tensor(0.0))
            torch.testing.assert_close(scores[unit], expected.double(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(scores.sum(), by_token.sum(), rtol=1e-5, atol=1e-6)
    passages = model.attribute(prompt, generated, units="passages", show_progress=False).info["units"][0]
    assert passages[:2] == ["the cat sat on the mat .", "the dog sat on it . she read a book ."]
    sentences = model.attribute(prompt, generated, units="sentences", show_progress=False).info["units"][0]
    assert [text.strip() for text in sentences[:3]] == ["the cat sat on the mat .", "the dog sat on it .",
                                                         "she read a book ."]  # fmt: skip


@pytest.mark.parametrize(
    ("family", "method"),
    [(family, "alti_logit") for family in ALL_FAMILIES]
    + [(family, method) for family in ("gpt2", "gemma2", "bart", "t5") for method in ("attn_lrp", "alti")],
)
def test_a_batch_is_each_input_alone(family, method):
    """Two inputs of different lengths in one padded batch give what each gives alone."""
    model = loaded(family, method)
    first = texts(family)
    second = texts(family, "the dog sat .")
    batch = model.attribute([first[0], second[0]], [first[1], second[1]], spans="sentences", units="sentences",
                            batch_size=2, show_progress=False)  # fmt: skip
    for index, (prompt, generated) in enumerate([first, second]):
        alone = model.attribute(prompt, generated, spans="sentences", units="sentences", show_progress=False)
        mine, expected = batch.sequence_attributions[index], alone.sequence_attributions[0]
        assert [token.token for token in mine.source] == [token.token for token in expected.source]
        torch.testing.assert_close(mine.source_attributions, expected.source_attributions, rtol=1e-4, atol=1e-5)
        for name, value in expected.step_scores.items():
            torch.testing.assert_close(mine.step_scores[name], value, rtol=1e-4, atol=1e-5)


def naive_hops(keys: torch.Tensor, columns: list[int], generated: list[int], span: list[int], hops: int, mean: bool):
    """Hops written token by token: level ``h`` holds the score that has been passed ``h`` times; a generated key's
    share at level ``h`` moves to level ``h + 1`` along its own column (the row predicting it), divided by that
    column's L1 norm. A span starts from its columns' sum (logit methods) or mean (maps). Returns the scores over keys
    after ``hops`` hops, and each hop's part on the prompt keys."""
    count = keys.shape[0]
    level = [keys[:, [columns.index(token) for token in span]].sum(1) / (len(span) if mean else 1)]
    parts = []
    for _ in range(hops):
        current, following = level[-1], torch.zeros(count, dtype=torch.float64)
        parts.append(torch.tensor([0.0 if key in generated else float(current[key]) for key in range(count)]).double())
        for key in generated:
            if float(current[key]) == 0.0:
                continue
            row = keys[:, columns.index(key)]  # the per-token column explaining ``key``: keys before it
            norm = float(row.abs().sum())
            for other in range(count):
                following[other] += float(current[key]) * float(row[other]) / norm
        level.append(following)
    parts.append(level[-1])
    return sum(parts), parts


@pytest.mark.parametrize(
    ("family", "method", "hops"),
    [(family, "alti_logit", 2) for family in ALL_FAMILIES]
    + [(family, method, hops) for family, method in (("gpt2", "alti_logit"), ("llama", "alti"), ("bart", "alti_logit"))
       for hops in (1, 8)],
)  # fmt: skip
def test_hops_against_a_token_by_token_recursion(family, method, hops):
    """Hops through the answer's own tokens equal the recursion written token by token; each hop's part is stored;
    enough hops leave nothing on generated tokens (the answer is then explained by the prompt alone)."""
    model = loaded(family, method)
    prompt, generated = texts(family)
    out = model.attribute(prompt, generated, spans=["they sat ."] if not is_seq2seq(family) else ["il lus ."],
                          units="tokens", hops=hops, show_progress=False)  # fmt: skip
    sequence, info = out.sequence_attributions[0], out.info
    keys, columns, ids = per_token(model, family, prompt, generated)
    first_generated = 1 if is_seq2seq(family) else columns[0]
    generated_keys = list(range(first_generated, len(ids)))
    expected, parts = naive_hops(keys, columns, generated_keys, info["span_tokens"][0][0], hops, method == "alti")
    unit_keys = info["unit_keys"][0]
    scores = sequence.source_attributions[:, 0].double()
    torch.testing.assert_close(scores, torch.stack([expected[k].sum() for k in unit_keys]), rtol=1e-4, atol=1e-6)
    stored = sequence.sequence_scores["hops"].double()
    assert stored.shape == (len(unit_keys), 1, hops + 1)
    for hop, part in enumerate(parts):
        torch.testing.assert_close(stored[:, 0, hop], torch.stack([part[k].sum() for k in unit_keys]),
                                   rtol=1e-4, atol=1e-6)  # fmt: skip
    if hops == 8:  # as many hops as generated tokens before the span's last: all on the prompt
        on_generated = [unit for unit, keys_of_unit in enumerate(unit_keys) if keys_of_unit[0] in generated_keys]
        assert scores[on_generated].abs().max() < 1e-9
    if method == "alti":  # rows of a map sum to 1: hops keep the span's total
        torch.testing.assert_close(scores.sum(), torch.tensor(1.0, dtype=torch.float64), rtol=1e-5, atol=1e-5)


def test_bad_spans_and_units_are_refused_before_any_work():
    model = loaded("gpt2", "alti_logit")
    prompt, generated = texts("gpt2")
    cases = [
        ({"spans": ["a dragon"]}, "Input 0: the span 'a dragon' is not in the text"),
        ({"units": ["the zebra"]}, "the unit 'the zebra' is not in the text"),
        ({"spans": "paragraphs"}, "use one of ['answer', 'sentences']"),
        ({"units": "chapters"}, "use one of ['tokens', 'sentences', 'passages']"),
        ({"hops": -1}, "hops takes a whole number"),
        ({"spans": [(0, 999)]}, "outside the text's characters"),
        ({"spans": "answer", "contrast_targets": "x"}, "the contrast text must start with the prompt"),
        ({"spans": "answer", "contrast_targets": PROMPT + " x", "hops": 1}, "use contrast_targets without hops"),
        ({"spans": "answer", "magic": 1}, "Unknown option(s) ['magic']"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            model.attribute(prompt, generated, show_progress=False, **kwargs)
    with pytest.raises(ValueError, match="must start with its prompt"):
        model.attribute(prompt, "something else entirely", spans="answer", show_progress=False)
    for method in ("value_zeroing", "attention_norm"):  # their default, the layers' mean, is one row per token
        with pytest.raises(ValueError, match=f"{method} gives one per layer or head with these options"):
            loaded("gpt2", method).attribute(prompt, generated, hops=1, per_layer=True, show_progress=False)
    with pytest.raises(ValueError, match="adds no token to the prompt"):
        model.attribute(prompt, prompt, spans="answer", show_progress=False)
    with pytest.raises(ValueError, match="explains no logit"):
        loaded("gpt2", "alti").attribute(prompt, generated, spans="answer", contrast_targets=generated,
                                         show_progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="as long"):
        model.attribute(
            prompt, generated, spans="answer", contrast_targets=prompt + " she read .", show_progress=False
        )
    source, target = texts("bart")
    with pytest.raises(ValueError, match="not with an encoder–decoder"):
        loaded("bart", "decompx").attribute(source, target, units="sentences", unit_components=True,
                                            show_progress=False)  # fmt: skip


@pytest.mark.parametrize("method", ["integrated_gradients", "saliency", "input_x_gradient"])
def test_inseq_s_own_methods_refuse_spans_and_units_before_any_work(method):
    """Inseq would print "Unused arguments" and explain every token instead (minutes on a long prompt)."""
    model = tiny_model("gpt2")
    attribution_model = inseq.load_model(model, method, tokenizer=word_tokenizer(seq2seq=False))
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    prompt, generated = texts("gpt2")
    try:
        for keyword, value in (("spans", "answer"), ("units", "sentences"), ("hops", 1)):
            with pytest.raises(ValueError, match=f"\\['{keyword}'\\] explain spans .* not with '{method}'"):
                attribution_model.attribute(prompt, generated, show_progress=False, **{keyword: value})
    finally:
        handle.remove()
    assert not calls  # refused before the model ran
    plain = attribution_model.attribute(prompt, generated, show_progress=False)  # without them: as Inseq gives it
    assert plain.sequence_attributions[0].target_attributions is not None


def test_span_output_shows_saves_and_loads(tmp_path):
    """The output is Inseq's: it shows units against spans, saves and loads."""
    model = loaded("gpt2", "alti_logit")
    prompt, generated = texts("gpt2")
    out = model.attribute(prompt, generated, spans="sentences", units="sentences", show_progress=False)
    page = out.show(display=False, return_html=True)
    assert "the dog sat on it ." in page and "they sat ." in page and "explained, spans" in page
    out.save(tmp_path / "spans.json")
    back = inseq.FeatureAttributionOutput.load(tmp_path / "spans.json")
    torch.testing.assert_close(back.sequence_attributions[0].source_attributions,
                               out.sequence_attributions[0].source_attributions)  # fmt: skip


@pytest.mark.parametrize("family", ["gpt2", "marian"])
def test_a_dataset_run_stores_what_model_attribute_gives_each_row(family, tmp_path):
    """``attribute_dataset(..., units=, spans=, hops=)``: each stored row (batches of 3 rows of different lengths)
    equals ``model.attribute`` with the same arguments on the row alone; the CLI's ``--option`` takes them too."""
    from inseq_mixing.cli import main
    from inseq_mixing.runs import attribute_dataset, load_run

    model = loaded(family, "alti_logit")
    prompts = [PROMPT, "the dog sat . she read a book .", "hello world . good morning ."]
    rows = [{"id": f"r{index}", "source": prompt, "target": texts(family, prompt)[1]}
            for index, prompt in enumerate(prompts)]  # fmt: skip
    arguments = {"units": "sentences", "spans": "sentences", "hops": 1}
    attribute_dataset(model, "alti_logit", rows, tmp_path / "run", batch_size=3, show_progress=False, id_column="id",
                      **arguments)  # fmt: skip
    run = load_run(tmp_path / "run")
    for row in rows:
        alone = model.attribute(row["source"], row["target"], show_progress=False, **arguments).sequence_attributions[
            0
        ]
        stored = run[row["id"]]
        assert [token.token for token in stored.source] == [token.token for token in alone.source]
        assert [token.token for token in stored.target] == [token.token for token in alone.target]
        torch.testing.assert_close(stored.source_attributions, alone.source_attributions, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(stored.sequence_scores["hops"], alone.sequence_scores["hops"], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="units='chapters'"):
        attribute_dataset(model, "alti_logit", rows, tmp_path / "bad", units="chapters", show_progress=False)
    if is_seq2seq(family):  # a saved tiny Marian reloads other sinusoidal positions than its random ones
        return
    folder = tmp_path / "model"
    model.model.save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(__import__("json").dumps(row) for row in rows))
    code = main(["attribute-dataset", str(data), "--model", str(folder), "--method", "alti_logit", "--out",
                 str(tmp_path / "cli"), "--id-column", "id", "--batch-size", "3", "--option", "units=sentences",
                 "--option", "spans=sentences", "--option", "hops=1"])  # fmt: skip
    assert code == 0
    cli_run = load_run(tmp_path / "cli")
    for row in rows:
        torch.testing.assert_close(cli_run[row["id"]].source_attributions, run[row["id"]].source_attributions,
                                   rtol=1e-4, atol=1e-5)  # fmt: skip


@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_decompx_over_context_units_equals_its_tokens_summed(family):
    """``unit_components=True``: DecompX decomposes the text over its units from the first block (one component per
    unit, the rest unit holding the first token); with ``bias="separate"`` it equals the token decomposition summed
    per unit, in a padded batch of two too; encoder–decoders and hops are refused."""
    model = loaded(family, "decompx")
    first, second = texts(family), texts(family, "the dog sat . she read a book .")
    arguments = {"spans": "sentences", "units": "sentences", "bias": "separate", "batch_size": 2,
                 "show_progress": False}  # fmt: skip
    pairs = ([first[0], second[0]], [first[1], second[1]])
    # sentences; and one document in the middle of each prompt (the rest, a unit listed last, holds the first token)
    for units in ("sentences", [["the dog sat on it ."], ["she read a book ."]]):
        arguments["units"] = units
        tokens = model.attribute(*pairs, **arguments)
        by_units = model.attribute(*pairs, unit_components=True, **arguments)
        assert by_units.info["units"][0][-1] == "(rest of the text)" or units == "sentences"
        for mine, expected in zip(by_units.sequence_attributions, tokens.sequence_attributions, strict=True):
            torch.testing.assert_close(mine.source_attributions, expected.source_attributions, rtol=1e-4, atol=1e-5)
            for name, value in expected.step_scores.items():
                torch.testing.assert_close(mine.step_scores[name], value, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="nor with hops"):
        model.attribute(*first, units="sentences", unit_components=True, hops=1, show_progress=False)


FOILS = {False: " she read a dog . they sat .", True: "le chien assis sur tapis . il lus ."}


@pytest.mark.parametrize("method", LOGIT_METHODS)
@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma2", "bart", "t5"])
def test_a_contrastive_span_is_the_sum_of_its_tokens_differences(family, method):
    """``contrast_targets=`` with spans: each span explains the sum of its tokens' logit differences (target minus
    foil, the foil text one to one with the generated one): unit scores equal the per-token contrastive columns of
    ``model.attribute(..., contrast_targets=...)`` summed, ``contrast_logits_diff`` the model's own differences."""
    model = loaded(family, method)
    prompt, generated = texts(family)
    seq2seq = is_seq2seq(family)
    foil = FOILS[True] if seq2seq else prompt + FOILS[False]
    out = model.attribute(prompt, generated, spans="sentences", units="tokens", contrast_targets=foil,
                          show_progress=False)  # fmt: skip
    sequence, info = out.sequence_attributions[0], out.info
    extra = {"attribute_target": True} if seq2seq else {}
    per_token = model.attribute(prompt, generated, contrast_targets=foil, show_progress=False, **extra)
    per_token = per_token.sequence_attributions[0]
    keys = per_token.target_attributions
    if seq2seq:
        keys = torch.cat([keys, per_token.source_attributions], 0)
    keys = keys.nan_to_num(0.0).double()
    columns = list(range(per_token.attr_pos_start, per_token.attr_pos_end))
    logits, ids = model_logits(model, family, prompt, generated)
    tokenizer, net = model.tokenizer, model.model
    foil_ids = ([net.config.decoder_start_token_id, *tokenizer(text_target=foil)["input_ids"]] if seq2seq
                else tokenizer(foil)["input_ids"])  # fmt: skip
    with torch.no_grad():
        if seq2seq:
            source = torch.tensor([tokenizer(prompt)["input_ids"]])
            raw = net(input_ids=source, decoder_input_ids=torch.tensor([ids])).logits[0].double()
        else:
            raw = net(input_ids=torch.tensor([ids])).logits[0].double()
    cap = getattr(net.config, "final_logit_softcapping", None)
    raw = cap * torch.atanh(raw / cap) if cap else raw
    assert sequence.step_scores.keys() >= {"contrast_logits_diff"}
    for span, tokens in enumerate(info["span_tokens"][0]):
        cells = [columns.index(token) for token in tokens]
        expected = torch.stack([keys[unit_keys][:, cells].sum() for unit_keys in info["unit_keys"][0]])
        torch.testing.assert_close(sequence.source_attributions[:, span].double(), expected, rtol=1e-4,
                                   atol=1e-4 * float(keys.abs().max()))  # fmt: skip
        difference = sum(raw[token - 1, ids[token]] - raw[token - 1, foil_ids[token]] for token in tokens)
        torch.testing.assert_close(sequence.step_scores["contrast_logits_diff"][span].double(), difference,
                                   rtol=1e-4, atol=1e-4)  # fmt: skip
    assert float(sequence.step_scores["contrast_logits_diff"][0].abs()) > 0  # the first sentence differs: book/dog


@pytest.mark.parametrize("family", ["gpt2", "marian"])
def test_without_a_generated_text_the_models_own_generation_is_explained(family):
    """``generated_texts`` left out: the model's greedy generation (the prompt kept as written, blank lines included)
    is explained, as if it had been given."""
    model = loaded(family, "alti_logit")
    prompt = "the cat sat on the mat .\n\nthe dog sat on it ."
    out = model.attribute(prompt, units="passages", generation_args={"max_new_tokens": 3}, show_progress=False)
    generated = out.info["generated_texts"][0]
    assert is_seq2seq(family) or (generated.startswith(prompt) and len(generated) > len(prompt))
    tokenizer = model.tokenizer
    if not is_seq2seq(family):  # the explained tokens are the model's own greedy continuation
        ids = torch.tensor([tokenizer(prompt)["input_ids"]])
        greedy = model.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False)
        assert tokenizer(generated)["input_ids"] == greedy[0].tolist()
    given = model.attribute(prompt, generated, units="passages", show_progress=False)
    assert given.info["units"] == out.info["units"] and out.info["units"][0][:2] == prompt.split("\n\n")
    torch.testing.assert_close(out.sequence_attributions[0].source_attributions,
                               given.sequence_attributions[0].source_attributions)  # fmt: skip
