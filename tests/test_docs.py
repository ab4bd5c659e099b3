"""The guide (``mkdocs.yml``, ``docs/``): it builds in strict mode (a broken link, a missing page or an unresolvable
API reference fails), every method page lists every option of its method, every topic the README hands over has its
page, and the built getting-started page fits 1,280 px in headless Chromium. The code blocks of the README and of the
guide's pages run in ``tests/test_readme.py``."""

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from inseq_mixing.declarations import DECLARATIONS

ROOT = Path(__file__).resolve().parents[1]

#: What the README's front door leaves to the guide: each topic's page.
TOPICS = {
    "Getting started": "index.md",
    "Generation models and Inseq": "tasks/generation.md",
    "Encoder-only models": "tasks/encoders.md",
    "Speech models": "tasks/speech.md",
    "Vision models": "tasks/vision.md",
    "Vision-language models": "tasks/vision-language.md",
    "Long contexts and spans": "tasks/long-contexts.md",
    "Dataset runs": "tasks/datasets.md",
    "Evaluation protocols": "tasks/evaluation.md",
    "Comparing methods": "tasks/compare.md",
    "The explorer": "tasks/explorer.md",
    "Command line": "command-line.md",
    "Supported models": "supported-models.md",
    "Limits and errors": "limits.md",
    "Speed": "speed.md",
    "Design notes": "DESIGN.md",
    "Development": "development.md",
}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)], cwd=ROOT,
                           capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": ""})  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    return folder


def nav_pages(entries) -> dict[str, str]:
    """Title → page of every entry of the navigation."""
    found = {}
    for entry in entries:
        if isinstance(entry, str):
            found[entry] = entry
            continue
        for title, value in entry.items():
            for name, page in (nav_pages(value) if isinstance(value, list) else {title: value}).items():
                found.setdefault(name, page)  # the first entry of a title (the API's pages come last)
    return found


def test_every_topic_and_method_has_its_page_in_the_navigation():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    pages = nav_pages(config["nav"])
    for title, page in TOPICS.items():
        assert pages.get(title) == page and len((ROOT / "docs" / page).read_text().splitlines()) > 10, title
    for method in DECLARATIONS:
        assert pages.get(method) == f"methods/{method}.md", method
    assert config["strict"] == "true" and config["theme"]["font"] == "false"  # strict, and no web fonts


def test_the_site_builds_strictly_and_lists_every_option(site):
    for method, declaration in DECLARATIONS.items():
        page = (site / "methods" / f"{method}.html").read_text()
        assert html.escape(declaration.summary.split(":")[0], quote=False) in page
        for option in declaration.option_names():
            assert f"<code>{option}</code>" in page, (method, option)
    api = (site / "reference" / "explorer.html").read_text()
    assert "contribution_graphs" in api and "ContributionGraph" in api and "solve_flows" in api
    assert not re.search(r"""<(link|script)[^>]+(src|href)=["']https?://""", (site / "index.html").read_text())


def test_a_broken_link_fails_the_strict_build(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# x\n\n[a page that is not there](missing.md)\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: x\nstrict: true\n")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict"], cwd=tmp_path, capture_output=True,
                           text=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": ""})  # fmt: skip
    assert built.returncode != 0 and "missing.md" in built.stderr


def test_the_readme_is_a_front_door_whose_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 160
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / target).exists(), target
    for page in ("docs/index.md", "docs/tasks/explorer.md", "docs/limits.md"):
        assert f"]({page})" in readme


def test_the_getting_started_page_fits_1280_px_in_chromium(site, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        page.goto((site / "index.html").as_uri())
        assert page.text_content("h1").rstrip("¶") == "Getting started"
        assert page.locator("nav a", has_text="The explorer").count() > 0
        page.screenshot(path=str(tmp_path / "getting-started.png"), full_page=True)
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    finally:
        page.close()


TASK_PAGES = sorted(page for page in TOPICS.values() if page.startswith("tasks/"))


def test_every_task_page_shows_its_example_first_fits_and_navigates_from_a_file(site, browser):
    """The example right under the title (its first code block within the first 900 px of a 1,280 px window), code
    blocks that wrap (the page no wider than the window), and links that work from ``file://`` (pages as files:
    ``use_directory_urls: false``): a click on the navigation lands on the page's file."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        for name in TASK_PAGES:
            page.goto((site / name.replace(".md", ".html")).as_uri())
            top = page.evaluate("document.querySelector('.md-content pre').getBoundingClientRect().top + scrollY")
            assert top < 900, (name, top)
            assert page.evaluate("document.documentElement.scrollWidth") <= 1280, name
        page.goto((site / "index.html").as_uri())
        page.locator("nav a", has_text="Long contexts and spans").first.click()
        page.wait_for_load_state()
        assert page.url.endswith("tasks/long-contexts.html")
        assert page.text_content("h1").rstrip("¶").startswith("Long contexts")
    finally:
        page.close()


def test_the_table_of_default_layouts_says_what_every_method_returns():
    """docs/methods/index.md's table: every method gives one map by default; a method whose per-layer cell is filled
    takes ``per_layer=True`` and gives one map per layer, labelled, the default being their mean or the last one where
    the table says so; a method whose cell is empty does not take the option (on a tiny GPT-2)."""
    import torch

    import inseq_mixing
    from inseq_mixing.testing import tiny_model, word_tokenizer

    text = (ROOT / "docs" / "methods" / "index.md").read_text()
    table = text[text.index("## What each method returns by default") :]
    rows = {match[1]: (match[2].strip(), match[3].strip()) for match in
            re.finditer(r"^\| `(\w+)` \| ([^|]+) \| ([^|]+) \| [^|]+ \|$", table, re.M)}  # fmt: skip
    assert sorted(rows) == sorted(DECLARATIONS)
    model, tokenizer = tiny_model("gpt2"), word_tokenizer(seq2seq=False)
    layers = model.config.num_hidden_layers

    def attribute(method: str, **options):
        out = inseq_mixing.load_model(model, method, tokenizer=tokenizer).attribute(
            "the cat sat", "the cat sat on the mat", show_progress=False, **options
        )
        return out.sequence_attributions[0].target_attributions, out.info

    for method, (default, per_layer) in rows.items():
        one, info = attribute(method)
        assert one.dim() == 2 and "score_axis" not in info, method
        if per_layer == "—":
            assert "per_layer" not in DECLARATIONS[method].option_names(), method
            continue
        each, info = attribute(method, per_layer=True)
        assert each.shape == (*one.shape, layers), method
        assert info["score_axis"] == [f"layer {layer}" for layer in range(layers)], method
        if default.startswith("the layers' mean"):
            torch.testing.assert_close(one, each.mean(-1), equal_nan=True, msg=method)
        elif "the last slot is the default" in per_layer:
            torch.testing.assert_close(one, each[..., -1], equal_nan=True, msg=method)
        else:  # a rollout: a product of the layer maps, not their mean
            assert not torch.allclose(one.nan_to_num(), each.mean(-1).nan_to_num()), method
