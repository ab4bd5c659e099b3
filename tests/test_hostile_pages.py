"""Every page this package writes (the explorer, the comparison report the demo writes too, the evaluation report, the
image report), opened in headless Chromium with hostile strings in every field a user or a shared file controls:
no script of theirs runs, nothing is requested, the page still works and shows the strings as text. And a saved
output is read through an allow-list of classes: a file naming anything else is refused, by name."""

import json
import re

import pytest
import torch

import inseq_mixing
from inseq_mixing.cli import main
from inseq_mixing.evaluation.items import Skipped
from inseq_mixing.frontends.output import UnsafeOutputError, load_output
from inseq_mixing.testing import image_processor, load_tiny, synthetic_image, tiny_vision
from inseq_mixing.views.eval_report import write_evaluation_report
from inseq_mixing.views.explorer import explore
from inseq_mixing.views.images import image_report
from inseq_mixing.views.report import write_report

#: Strings that run script, ask for a resource or break a page where a field is written unescaped, or substituted
#: into a template twice (``__DATA__``), or where a JSON island escapes ``</`` only (``<!--<script>``), or where a
#: figure's title is parsed as mathtext.
HOSTILE = (
    "</script><script>window.__pwned=1</script>",
    "<!--<script>",
    "<img/src=x/onerror=window.__pwned=2>",
    "__DATA__",
    "__TITLE__",
    '"><svg/onload=window.__pwned=3>',
    "<script>fetch('http://evil.invalid/x')</script>",
    "<img/src='http://evil.invalid/y.png'>",
    "'-alert(1)-'",
    "$\\frac{1}{$",
)


def hostile(index: int) -> str:
    return HOSTILE[index % len(HOSTILE)]


def open_page(browser, path) -> tuple[object, list[str], list[str]]:
    """The page at ``path`` opened with every request outside the page itself recorded and refused, its script
    errors and dialogs recorded."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    requested, problems = [], []

    def route(handle):
        url = handle.request.url
        if url == path.as_uri():
            handle.continue_()
        else:
            requested.append(url)
            handle.abort()

    page.route("**/*", route)
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("dialog", lambda dialog: (problems.append(f"dialog: {dialog.message}"), dialog.dismiss()))
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, requested, problems


def assert_inert(page, requested: list[str], problems: list[str], shown: list[str]) -> None:
    """No injected script ran, nothing was requested, nothing failed, and each of ``shown`` is on the page as text."""
    assert page.evaluate("window.__pwned") is None
    assert requested == [], requested
    assert problems == [], problems
    text = page.evaluate("document.body.innerText + ' ' + document.title")
    missing = [value for value in shown if value not in text]
    assert missing == [], missing


def hostile_generation():
    """An output of a tiny GPT-2 with contribution graphs, every token, text and label replaced by a hostile one."""
    out = load_tiny("gpt2", "alti").attribute("the cat", "the cat sat on the", show_progress=False,
                                              contribution_graphs=True, per_head=True)  # fmt: skip
    sequence = out.sequence_attributions[0]
    for tokens in (sequence.source, sequence.target):  # a decoder-only model's units are its target tokens
        for index, token in enumerate(tokens):
            token.token = hostile(index)
    out.info["input_texts"] = [hostile(0)]
    out.info["contribution_graphs_note"] = hostile(1)
    return out


def test_the_explorer_page_runs_no_injected_script(browser, tmp_path):
    out = hostile_generation()
    title = f"{hostile(3)} {hostile(0)} {hostile(1)}"
    path = tmp_path / "explorer.html"
    explore({hostile(5): out}, path, title=title)
    page, requested, problems = open_page(browser, path)
    try:
        page.click("#panels .panel >> nth=0 >> th.col[data-col='1']")  # its route is drawn, with its tokens
        page.click("#panels .panel >> nth=0 >> th.unit[data-unit='2']")
        assert page.locator("#graph-svg line.edge").count() > 0
        assert page.title() == title
        assert_inert(page, requested, problems, [*HOSTILE[:3], hostile(5)])
    finally:
        page.close()


def test_a_saved_output_is_read_through_an_allow_list_and_its_graphs_checked(browser, tmp_path):
    out = hostile_generation()
    saved = tmp_path / "saved.json"
    out.save(saved)
    loaded = load_output(saved)
    first, again = out.sequence_attributions[0], loaded.sequence_attributions[0]
    torch.testing.assert_close(again.target_attributions, first.target_attributions, equal_nan=True)
    assert [token.token for token in again.target] == [token.token for token in first.target]
    assert main(["explore", "--saved", str(saved), "--out", str(tmp_path / "page.html")]) == 0
    page, requested, problems = open_page(browser, tmp_path / "page.html")
    try:
        page.click("#panels .panel >> nth=0 >> th.col[data-col='0']")
        assert_inert(page, requested, problems, list(HOSTILE[:3]))
    finally:
        page.close()

    text = saved.read_text()
    # a file that names a module and class to build: refused, naming them, before anything is built
    crafted = re.sub(r'"inseq\.utils\.typing",\s*"TokenWithId"', '"subprocess", "Popen"', text, count=1)
    assert crafted != text
    (tmp_path / "crafted.json").write_text(crafted)
    with pytest.raises(UnsafeOutputError, match=r"\['subprocess', 'Popen'\]"):
        load_output(tmp_path / "crafted.json")
    assert main(["explore", "--saved", str(tmp_path / "crafted.json"), "--out", str(tmp_path / "x.html")]) == 2
    assert not (tmp_path / "x.html").exists()

    # a graph whose fields hold markup instead of a kind and a number: refused, not written into a page
    data = json.loads(text)
    graph = data["attributes"]["info"]["contribution_graphs"][0][0]
    graph["edges"][0]["kind"] = hostile(0)
    (tmp_path / "kind.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="kind is one of"):
        explore(load_output(tmp_path / "kind.json"))
    graph["edges"][0]["kind"], graph["threshold"] = "attention", hostile(2)
    (tmp_path / "threshold.json").write_text(json.dumps(data))
    assert main(["explore", "--saved", str(tmp_path / "threshold.json"), "--out", str(tmp_path / "y.html")]) == 2
    assert not (tmp_path / "y.html").exists()


def test_the_comparison_report_runs_no_injected_script(browser, tmp_path):
    comparison = inseq_mixing.compare(load_tiny("marian", "alti"), ["alti_logit", "value_zeroing"], "the cat sat",
                                      "le chat assis", fractions=(0.5,), random_draws=1)  # fmt: skip
    for output in comparison.outputs.values():
        sequence = output.sequence_attributions[0]
        for index, token in enumerate([*sequence.source, *sequence.target]):
            token.token = hostile(index)
    comparison.failed[hostile(0)] = hostile(2)
    path = write_report(comparison, tmp_path / "report.html", title=hostile(1), notes="<p>notes</p>")
    page, requested, problems = open_page(browser, path)
    try:
        assert_inert(page, requested, problems, [*HOSTILE[:3], HOSTILE[5]])
    finally:
        page.close()


def test_the_evaluation_report_runs_no_injected_script(browser, tmp_path):
    model = load_tiny("gpt2", "alti_logit")
    rows = [{"prefix": "the cat sat on the", "target": "mat", "evidence": "cat"}]
    evaluation = inseq_mixing.evaluate(model, ["alti_logit"], rows, "evidence", draws=10)
    evaluation.skipped.append(Skipped(7, hostile(0)))
    evaluation.failed[hostile(1)] = hostile(2)
    evaluation.unknown_words[3] = [hostile(5), hostile(6)]
    for explanation in next(iter(evaluation.examples.values())):
        explanation.item.prefix = " ".join(hostile(index) for index in range(len(explanation.item.context_words)))
        explanation.item.word = hostile(9)
        for index, token in enumerate([*explanation.seq.source, *explanation.seq.target]):
            token.token = hostile(index + 3)
    path = write_evaluation_report(evaluation, tmp_path / "evaluation.html", title=hostile(4))
    page, requested, problems = open_page(browser, path)
    try:
        assert_inert(page, requested, problems, [*HOSTILE[:3], HOSTILE[5]])
    finally:
        page.close()


def test_the_image_report_runs_no_injected_script(browser, tmp_path):
    front = inseq_mixing.load_model(tiny_vision("vit"), "alti", processor=image_processor())
    image = tmp_path / f"{hostile(2).replace('/', '_')}.png"
    from PIL import Image

    Image.fromarray(synthetic_image()).save(image)
    out = front.attribute(str(image), show_progress=False, per_layer=True)
    out.sequence_attributions[0].target[0].token = hostile(0)
    path = tmp_path / "images.html"
    image_report(out, [str(image)], path, title=hostile(1))
    page, requested, problems = open_page(browser, path)
    try:
        assert_inert(page, requested, problems, [hostile(1), image.name])
    finally:
        page.close()
