"""The explorer page: its data laid out from the outputs (layers, (layer, head) slots, columns, units), and the page
driven in headless Chromium (Playwright on Debian's chromium): the layer slider moved with the keyboard, a column and
a row clicked with the mouse, a head picked, and the values the page then shows read back against the outputs'
tensors, for a generation, an encoder, a speech and a vision output; each page fits 1,280 px."""

import json
import math
import re

import inseq
import pytest
import torch

import inseq_mixing
from inseq_mixing.testing import (
    WORDS,
    encoder_tokenizer,
    image_processor,
    load_tiny,
    speech_processor,
    synthetic_audio,
    synthetic_image,
    tiny_encoder,
    tiny_model,
    tiny_speech,
    tiny_vision,
    vision_processor,
    word_tokenizer,
)
from inseq_mixing.views.explorer import ALL, explore, row_groups

PROMPT, GENERATED = "the cat", "the cat sat on the"


@pytest.fixture(scope="module")
def generation():
    value_zeroing = load_tiny("gpt2", "value_zeroing").attribute(PROMPT, GENERATED, show_progress=False,
                                                                 contribution_graphs=True, per_layer=True)  # fmt: skip
    alti = load_tiny("gpt2", "alti").attribute(PROMPT, GENERATED, show_progress=False, per_head=True)
    return [value_zeroing, alti]


@pytest.fixture(scope="module")
def encoder():
    model, tokenizer = tiny_encoder("bert", "masked_lm"), encoder_tokenizer()
    text = "the [MASK] sat on the [MASK]"
    return [inseq_mixing.load_model(model, method, tokenizer=tokenizer).attribute(text, show_progress=False, **kw)
            for method, kw in (("alti", {"per_layer": True, "contribution_graphs": True}),
                               ("attention_flow", {"per_layer": True}))]  # fmt: skip


@pytest.fixture(scope="module")
def speech():
    model, processor = tiny_speech("wav2vec2"), speech_processor("wav2vec2")
    audio = synthetic_audio(1.0)
    front = inseq_mixing.load_model(model, "alti", processor=processor)
    return [front.attribute(audio, show_progress=False, per_layer=True, contribution_graphs=True)], audio


@pytest.fixture(scope="module")
def vision():
    image = synthetic_image()
    front = inseq_mixing.load_model(tiny_vision("vit"), "alti", processor=vision_processor("vit"))
    return [front.attribute(image, show_progress=False, per_layer=True)], image


def tensor(values) -> torch.Tensor:
    """Page values (None: no score) as a float64 tensor with NaN."""
    return torch.tensor([[math.nan if v is None else v for v in row] for row in values], dtype=torch.float64)


def page_data(page: str) -> dict:
    found = re.search(r'<script id="explorer-data" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(found[1].replace("<\\/", "</"))


def scores(output, row: int = 0):
    """The sequence's units × columns scores: source units first, then target ones (as the page lists them)."""
    sequence = output.sequence_attributions[row]
    blocks = [b for b in (sequence.source_attributions, sequence.target_attributions) if b is not None]
    return torch.cat(blocks, dim=0).double()


def test_the_page_lays_out_layers_slots_and_sums(generation):
    value_zeroing, alti = generation
    data = page_data(explore(generation))
    (sequence,) = data["sequences"]
    assert sequence["columns"] == ["sat", "on", "the"]
    assert [unit["token"] for unit in sequence["units"]][:2] == ["the", "cat"]
    first, second = sequence["methods"]
    assert first["layers"] == ["layer 0", "layer 1"] and first["slots"] == [ALL]
    heads = len(alti.info["score_axis"]) // 2 - 1
    assert second["slots"] == [ALL, *[f"head {h}" for h in range(heads)], "residual"]
    full = scores(alti)
    for layer in range(2):
        for slot in range(heads + 1):
            expected = full[..., layer * (heads + 1) + slot]
            got = tensor(second["values"][layer][slot + 1])
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, equal_nan=True)
        summed = tensor(second["values"][layer][0])
        torch.testing.assert_close(summed, full[..., layer * (heads + 1) : (layer + 1) * (heads + 1)].sum(-1),
                                   rtol=1e-5, atol=1e-6, equal_nan=True)  # fmt: skip
    assert len(sequence["graphs"]) == 3 and sequence["graphs"][0]["tokens"]["decoder"][:2] == ["the", "cat"]
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", explore(generation))  # no network assets


def test_mismatched_outputs_and_media_are_refused(generation, encoder, vision):
    with pytest.raises(ValueError, match="explains 2 entries over 8 units in sequence 0, the first 3"):
        explore([generation[0], encoder[0]])
    with pytest.raises(ValueError, match=r"1 sequence\(s\), but 2 image\(s\) were given"):
        explore(vision[0], images=[vision[1], vision[1]])
    with pytest.raises(ValueError, match="at least one output"):
        explore([])


# ----- in the browser -----


def shown(page, selector: str) -> list[float | None]:
    """The values the page shows (4 significant digits; "–" for none) in the elements ``selector`` matches."""
    texts = page.eval_on_selector_all(f"{selector} .v", "nodes => nodes.map(n => n.textContent)")
    return [None if text == "–" else float(text) for text in texts]


def assert_shown(values: list, expected: torch.Tensor) -> None:
    assert len(values) == len(expected) > 0
    for value, truth in zip(values, expected.tolist(), strict=True):
        if math.isnan(truth):
            assert value is None
        else:
            assert value == pytest.approx(truth, rel=1e-3, abs=1e-6)


def fits(page, tmp_path, name: str) -> None:
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280


def drive(page, path, tmp_path, name: str, column: int = 0, unit: int = 0, layer_steps: int = 1) -> None:
    """Load the page, move the slider ``layer_steps`` to the right with the keyboard, click column ``column`` and
    row ``unit`` with the mouse."""
    page.goto(path.as_uri())
    page.focus("#layer")
    for _ in range(layer_steps):
        page.keyboard.press("ArrowRight")
    page.click(f"#panels .panel >> nth=0 >> th.col[data-col='{column}']")
    page.click(f"#panels .panel >> nth=0 >> th.unit[data-unit='{unit}']")
    fits(page, tmp_path, name)


def test_generation_page_in_chromium(page, generation, tmp_path):
    value_zeroing, alti = generation
    path = value_zeroing.explore(tmp_path / "generation.html", others=[alti])
    drive(page, path, tmp_path, "generation", column=1, unit=1)
    assert page.text_content("#layer-label") == "layer 1"
    per_layer, heads = scores(value_zeroing), len(alti.info["score_axis"]) // 2
    assert_shown(shown(page, "#from .item[data-method='0']"), per_layer[:, 1, 1])
    assert_shown(shown(page, "#into .item[data-method='0']"), per_layer[1, :, 1])
    assert_shown(shown(page, "#from .item[data-method='1']"), scores(alti)[:, 1, heads:].sum(-1))
    page.select_option("#slot", "head 2")
    assert_shown(shown(page, "#from .item[data-method='1']"), scores(alti)[:, 1, heads + 2])
    assert_shown(shown(page, "#from .item[data-method='0']"), per_layer[:, 1, 1])  # no heads: unchanged
    graph = value_zeroing.info["contribution_graphs"][0][1]
    assert page.locator("#graph-svg line.edge").count() == len(graph["edges"]) > 0
    assert page.locator("#graph-svg circle.node").count() == len(graph["nodes"])
    page.focus("#layer")
    page.keyboard.press("ArrowLeft")
    assert page.text_content("#layer-label") == "layer 0"
    assert_shown(shown(page, "#from .item[data-method='0']"), per_layer[:, 1, 0])


def test_encoder_page_in_chromium(page, encoder, tmp_path):
    alti, flow = encoder
    path = alti.explore(tmp_path / "encoder.html", others=flow)
    drive(page, path, tmp_path, "encoder", column=1, unit=2)
    assert page.locator("#panels .panel").count() == 2
    assert_shown(shown(page, "#from .item[data-method='0']"), scores(alti)[:, 1, 1])
    assert_shown(shown(page, "#from .item[data-method='1']"), scores(flow)[:, 1, 1])
    assert_shown(shown(page, "#into .item[data-method='1']"), scores(flow)[2, :, 1])
    graph = alti.info["contribution_graphs"][0][1]
    assert page.locator("#graph-svg line.edge").count() == len(graph["edges"])


def test_speech_page_in_chromium(page, speech, tmp_path):
    (alti,), audio = speech
    path = alti.explore(tmp_path / "speech.html", audio=[audio])
    drive(page, path, tmp_path, "speech", column=0, unit=1)
    graph = alti.info["contribution_graphs"][0][0]
    assert graph["lengths"]["decoder"] > len(alti.sequence_attributions[0].source)  # frames, not units
    assert page.locator("#graph-svg text.token").count() == 0  # so its nodes are not labelled with units
    expected = scores(alti)[:, 0, 1]
    assert_shown(shown(page, "#from .item[data-method='0']"), expected)
    segments = page.eval_on_selector_all("#media rect.segment", "rs => rs.map(r => r.textContent)")
    assert len(segments) == len(expected)  # each unit shaded on the waveform, its score in its tooltip
    values = {text.split(": ")[0]: float(text.split(": ")[1]) for text in segments}
    units = [t.token for t in alti.sequence_attributions[0].source]
    for unit, truth in zip(units, expected.tolist(), strict=True):
        assert values[unit] == pytest.approx(truth, rel=1e-3)


def opened_within(page, path, seconds: float, selector: str) -> float:
    """Open the page and wait until ``selector`` is drawn: the time it took (the page's clock), under ``seconds``."""
    page.goto(path.as_uri())
    page.wait_for_selector(selector)
    elapsed = page.evaluate("performance.now()") / 1000
    assert elapsed < seconds, f"the page took {elapsed:.2f} s to open and draw"
    return elapsed


def within_budget(page, tmp_path, name: str) -> None:
    """The page fits 1,280 px wide and 2,000 px tall."""
    fits(page, tmp_path, name)
    assert page.evaluate("document.documentElement.scrollHeight") <= 2000


def hovered(page, selector: str) -> list[tuple[str, float | None]]:
    """(label, value) of each element's hover text (``label: value``, 3 significant digits)."""
    titles = page.eval_on_selector_all(selector, "nodes => nodes.map(n => n.getAttribute('title'))")
    pairs = [title.rsplit(": ", 1) for title in titles]
    return [(label, None if value == "–" else float(value)) for label, value in pairs]


@pytest.fixture(scope="module")
def vision_196():
    """A ViT on a 56-pixel image in patches of 4: [CLS] and 196 patches (ViT-B/16's count), ALTI per layer with its
    contribution graphs, and attention rollout."""
    image = synthetic_image(56)
    model, processor = tiny_vision("vit", image_size=56, patch_size=4), image_processor(56)
    alti = inseq_mixing.load_model(model, "alti", processor=processor)
    outputs = [alti.attribute(image, show_progress=False, per_layer=True, contribution_graphs={"threshold": 0.02}),
               alti.for_method("attention_rollout").attribute(image, show_progress=False)]  # fmt: skip
    return outputs, image


def test_vision_page_at_196_patches_in_chromium(page, vision_196, tmp_path):
    """The overlays come first, one per method with its colour bar; a patch clicked is what the "mixes into" list
    shows; the route's input row is the patch grid; the page fits 1,280 × 2,000 px and opens within 2 s."""
    (alti, rollout), image = vision_196
    path = alti.explore(tmp_path / "vision.html", images=[image], others=[rollout])
    opened_within(page, path, 2.0, "#overlays .overlay")
    overlays = page.locator("#overlays .overlay")
    assert overlays.count() == 2
    first_box, table_box = overlays.nth(0).bounding_box(), page.locator("#panels").bounding_box()
    assert first_box["y"] < table_box["y"]  # the overlay is the main view, above the tables
    tokens = [t.token for t in alti.sequence_attributions[0].source]
    patches = [index for index, token in enumerate(tokens) if re.match(r"r\d+c\d+$", token)]
    assert len(tokens) == 197 and len(patches) == 196
    page.focus("#layer")
    page.keyboard.press("ArrowRight")  # layer 1
    for method, output in enumerate((alti, rollout)):
        full = scores(output)
        expected = full[:, 0, 1] if full.dim() == 3 else full[:, 0]
        drawn = page.eval_on_selector_all(f"#overlays .overlay[data-method='{method}'] rect.patch",
                                          "rs => rs.map(r => r.textContent)")  # fmt: skip
        assert len(drawn) == 196
        values = dict(zip(tokens, expected.tolist(), strict=True))
        for text in drawn:
            name, value = text.split(": ")
            assert float(value) == pytest.approx(values[name], rel=1e-3, abs=1e-6)
        bar = page.text_content(f"#overlays .overlay[data-method='{method}'] .colourbar .high")
        top = expected[patches].abs().max().item()  # the scale spans the patches ([CLS] would wash them out)
        assert float(bar) == pytest.approx(top, rel=5e-3)
        fills = page.eval_on_selector_all(f"#overlays .overlay[data-method='{method}'] rect.patch",
                                          "rs => rs.map(r => r.getAttribute('fill'))")  # fmt: skip
        for text, fill in zip(drawn, fills, strict=True):
            alpha = float(re.search(r",([\d.]+)\)$", fill)[1])
            assert alpha == pytest.approx(abs(values[text.split(": ")[0]]) / top, abs=2e-3)
        caption = page.text_content(f"#overlays .overlay[data-method='{method}'] .what")
        assert f"[CLS] {expected[0].item():.3g}"[:10] in caption  # [CLS]'s own value said beside the image
    # a click on patch r3c5: it is outlined, and "mixes into" lists its row of each method
    unit = tokens.index("r3c5")
    page.click(f"#overlays .overlay[data-method='0'] rect.patch[data-unit='{unit}']")
    assert "r3c5" in page.text_content("#into-title")
    assert page.locator(f"#overlays rect.patch.selected[data-unit='{unit}']").count() == 2
    assert_shown(shown(page, "#into .item[data-method='0']"), scores(alti)[unit, :, 1])
    # what [CLS] mixes from: a heat strip of 197 cells, values on hover with 3 significant digits
    page.click("#panels .panel >> nth=0 >> th.col[data-col='0']")
    cells = hovered(page, "#from .strip[data-method='0'] .cell")
    assert [label for label, _ in cells] == tokens
    for (_, value), truth in zip(cells, scores(alti)[:, 0, 1].tolist(), strict=True):
        assert value == pytest.approx(truth, rel=6e-3, abs=1e-9)
    graph = alti.info["contribution_graphs"][0][0]
    grid = page.eval_on_selector_all("#graph .input-grid rect", "rs => rs.map(r => r.textContent)")
    assert len(grid) == 196 and page.locator("#graph-svg text.token").count() == 0  # no smear of 197 labels
    leaving = {}
    for edge in graph["edges"]:
        if edge["source"]["stage"] == "embedding":
            leaving[edge["source"]["position"]] = leaving.get(edge["source"]["position"], 0) + edge["weight"]
    for text in grid:
        name, value = text.split(": ")
        assert float(value) == pytest.approx(leaving.get(tokens.index(name), 0.0), rel=6e-3, abs=1e-9)
    within_budget(page, tmp_path, "vision")


@pytest.fixture(scope="module")
def long_prompt():
    """A 4,024-token prompt of 20 passages (200 words and a full stop each) and a 3-token answer explained as one
    span by ALTI-logit and attention rollout, on a tiny Llama whose positions reach 8,192."""
    import random

    from inseq_mixing.frontends.patches import register

    register()
    model = tiny_model("llama")
    model.config.max_position_embeddings = 8192
    words = [word for word in WORDS if word.isalpha()][:30]
    rng = random.Random(0)
    prompt = " ".join(" ".join(rng.choice(words) for _ in range(200)) + " ." for _ in range(20))
    outputs = []
    for method in ("alti_logit", "attention_rollout"):
        front = inseq.load_model(model, method, tokenizer=word_tokenizer())
        outputs.append(front.attribute(prompt, prompt + " the cat sat", spans="answer", show_progress=False))
    return outputs


def test_long_prompt_page_at_4000_tokens_in_chromium(page, long_prompt, tmp_path):
    """20 passage rows to start with, each the sum of its tokens; one opened shows its tokens' rows; "mixes from" is
    20 passage chips and a heat strip of every token; the page fits 1,280 × 2,000 px and opens within 2 s."""
    alti_logit, rollout = long_prompt
    path = alti_logit.explore(tmp_path / "long.html", others=[rollout])
    opened_within(page, path, 2.0, "#panels table.map")
    units = scores(alti_logit)[:, 0]
    assert len(units) > 4000
    groups = page_data(path.read_text(encoding="utf-8"))["sequences"][0]["groups"]
    assert len(groups) == 20 and groups[0]["start"] == 0 and groups[-1]["end"] == len(units)
    assert all(group["end"] == following["start"] for group, following in zip(groups, groups[1:], strict=False))
    rows = page.locator("#panels .panel >> nth=0 >> tr.group-row")
    assert rows.count() == 20 and page.locator("#panels .panel >> nth=0 >> th.unit").count() == 0
    sums = page.eval_on_selector_all("#panels .panel >> nth=0 >> td[data-group]", "ts => ts.map(t => +t.dataset.v)")
    for value, group in zip(sums, groups, strict=True):
        assert value == pytest.approx(units[group["start"] : group["end"]].sum().item(), rel=1e-4, abs=1e-6)
    page.click("#panels .panel >> nth=0 >> th.group[data-group='3']")  # drill down into passage 3
    opened = page.eval_on_selector_all(
        "#panels .panel >> nth=0 >> tr.member th.unit", "ts => ts.map(t => +t.dataset.unit)"
    )
    assert opened == list(range(groups[3]["start"], groups[3]["end"]))
    page.click(f"#panels .panel >> nth=0 >> th.unit[data-unit='{groups[3]['start'] + 5}']")
    page.click("#panels .panel >> nth=0 >> th.col[data-col='0']")
    chips = shown(page, "#from .list .item[data-method='0']")
    assert len(chips) == 20
    strip = hovered(page, "#from .strip[data-method='0'] .cell")
    assert len(strip) == len(units)
    for (_, value), truth in zip(strip[::97], units[::97].tolist(), strict=True):
        assert value == pytest.approx(truth, rel=6e-3, abs=1e-9)
    page.click("#panels .panel >> nth=0 >> th.group[data-group='3']")  # closed again
    assert page.locator("#panels .panel >> nth=0 >> tr.member").count() == 0
    within_budget(page, tmp_path, "long")


def test_rows_group_into_passages_or_runs_of_sentences():
    words = [{"token": "w", "group": "source"}] * 9 + [{"token": "Ġ.", "group": "source"}]
    assert row_groups(words * 6) is None  # 60 units: each its own row
    grouped = row_groups(words * 40)  # 400 units, a sentence end every 10: 20 runs of 20
    assert [group["end"] - group["start"] for group in grouped] == [20] * 20
    breaks = words * 10 + [{"token": "ĊĊ", "group": "source"}] + words * 3  # a blank line: two passages
    assert [(group["start"], group["end"]) for group in row_groups(breaks)] == [(0, 101), (101, 131)]
    plain = [{"token": "w", "group": "source"}] * 100 + [{"token": "w", "group": "target"}] * 3  # no sentence end
    bounds = [(group["start"], group["end"]) for group in row_groups(plain)]
    assert (100 in [start for start, _ in bounds]) and all(end - start <= 6 for start, end in bounds)  # multiples of 6
    assert bounds[0][0] == 0 and bounds[-1][1] == 103
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))


def test_the_explore_command_on_the_demo_model_and_on_saved_outputs(tmp_path, generation, capsys):
    from inseq_mixing.cli import main

    out = tmp_path / "demo.html"
    code = main(["explore", "the dogs near the cat find the old house", "--model", "demo", "--methods", "alti",
                 "value_zeroing", "--option", "alti:per_head=true", "--threshold", "0.1",
                 "--out", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    (sequence,) = page_data(out.read_text())["sequences"]
    assert [m["name"] for m in sequence["methods"]] == ["alti", "value_zeroing"]
    assert len(sequence["methods"][0]["slots"]) > 2  # per head
    assert len(sequence["graphs"]) == len(sequence["columns"]) > 3
    assert all(edge["weight"] > 0.1 for graph in sequence["graphs"] for edge in graph["edges"])
    assert any(node["stack"] == "encoder" for node in sequence["graphs"][0]["nodes"])
    saved = []
    for index, output in enumerate(generation):
        saved.append(str(tmp_path / f"saved{index}.json"))
        output.save(saved[-1])
    assert main(["explore", "--saved", *saved, "--out", str(tmp_path / "saved.html")]) == 0
    assert page_data((tmp_path / "saved.html").read_text()) == page_data(explore(generation, title="x")) | {
        "title": "inseq-mixing explorer"
    }
    assert main(["explore", "--saved", saved[0], "--model", "demo", "--out", str(tmp_path / "x.html")]) == 2
    assert "either --saved outputs or a model" in capsys.readouterr().err
    bad = ["explore", "x", "--model", "demo", "--option", "decompx:bias=x", "--out", str(tmp_path / "y.html")]
    assert main(bad) == 2
    assert "'decompx' is not among the methods" in capsys.readouterr().err
