"""The explorer page: its data laid out from the outputs (layers, (layer, head) slots, columns, units), and the page
driven in headless Chromium (Playwright on Debian's chromium): the layer slider moved with the keyboard, a column and
a row clicked with the mouse, a head picked, and the values the page then shows read back against the outputs'
tensors, for a generation, an encoder, a speech and a vision output; each page fits 1,280 px."""

import json
import math
import re

import pytest
import torch

import inseq_mixing
from inseq_mixing.testing import (
    encoder_tokenizer,
    load_tiny,
    speech_processor,
    synthetic_audio,
    synthetic_image,
    tiny_encoder,
    tiny_speech,
    tiny_vision,
    vision_processor,
)
from inseq_mixing.views.explorer import ALL, explore

PROMPT, GENERATED = "the cat", "the cat sat on the"


@pytest.fixture(scope="module")
def generation():
    value_zeroing = load_tiny("gpt2", "value_zeroing").attribute(PROMPT, GENERATED, show_progress=False,
                                                                 contribution_graphs=True)  # fmt: skip
    alti = load_tiny("gpt2", "alti").attribute(PROMPT, GENERATED, show_progress=False, per_head=True)
    return [value_zeroing, alti]


@pytest.fixture(scope="module")
def encoder():
    model, tokenizer = tiny_encoder("bert", "masked_lm"), encoder_tokenizer()
    text = "the [MASK] sat on the [MASK]"
    return [inseq_mixing.load_model(model, method, tokenizer=tokenizer).attribute(text, show_progress=False, **kw)
            for method, kw in (("alti", {"rollout": False, "contribution_graphs": True}),
                               ("attention_flow", {"every_layer": True}))]  # fmt: skip


@pytest.fixture(scope="module")
def speech():
    model, processor = tiny_speech("wav2vec2"), speech_processor("wav2vec2")
    audio = synthetic_audio(1.0)
    front = inseq_mixing.load_model(model, "alti", processor=processor)
    return [front.attribute(audio, show_progress=False, rollout=False, contribution_graphs=True)], audio


@pytest.fixture(scope="module")
def vision():
    image = synthetic_image()
    front = inseq_mixing.load_model(tiny_vision("vit"), "alti", processor=vision_processor("vit"))
    return [front.attribute(image, show_progress=False, rollout=False)], image


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


@pytest.fixture
def page(browser):
    """A 1,280 px wide page; the test fails if the page's script raised."""
    opened = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    opened.close()
    assert errors == [], errors


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


def test_vision_page_in_chromium(page, vision, tmp_path):
    (alti,), image = vision
    path = alti.explore(tmp_path / "vision.html", images=[image])
    drive(page, path, tmp_path, "vision", column=0, unit=0)
    patches = page.eval_on_selector_all("#media rect.patch", "rs => rs.map(r => r.textContent)")
    tokens = [t.token for t in alti.sequence_attributions[0].source]
    expected = dict(zip(tokens, scores(alti)[:, 0, 1].tolist(), strict=True))
    assert len(patches) == sum(1 for token in tokens if re.match(r"r\d+c\d+$", token)) > 0
    for text in patches:
        name, value = text.split(": ")
        assert float(value) == pytest.approx(expected[name], rel=1e-3, abs=1e-6)
    fills = page.eval_on_selector_all("#media rect.patch", "rs => rs.map(r => r.getAttribute('fill'))")
    alphas = [float(re.search(r",([\d.]+)\)$", fill)[1]) for fill in fills]
    top = max(abs(v) for v in expected.values())  # the colour scale: the largest score of the map
    for text, alpha in zip(patches, alphas, strict=True):
        assert alpha == pytest.approx(abs(expected[text.split(": ")[0]]) / top, abs=2e-3)


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
