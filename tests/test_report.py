"""The HTML report (self-contained, checked in a real headless browser), the per-layer figures and the CLI."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

import inseq_mixing
from inseq_mixing.cli import main
from inseq_mixing.testing import load_tiny, tiny_model, word_tokenizer
from inseq_mixing.views.figures import layer_figure
from inseq_mixing.views.report import render_report, write_report

from .test_inseq_glue import SOURCE, TARGET

METHODS = ["value_zeroing", "alti_logit", "decompx", "integrated_gradients"]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


@pytest.fixture(scope="module")
def comparison():
    return inseq_mixing.compare(
        load_tiny("marian", "alti"), METHODS, SOURCE, TARGET, fractions=(0.5,), random_draws=1,
        method_kwargs={"integrated_gradients": {"n_steps": 4}, "value_zeroing": {"per_layer": True}},
    )  # fmt: skip


def browser() -> str | None:
    found = next((shutil.which(name) for name in BROWSERS if shutil.which(name)), None)
    if found is None and os.environ.get("INSEQ_MIXING_REQUIRE_BROWSER"):
        pytest.fail("No headless browser found, but INSEQ_MIXING_REQUIRE_BROWSER is set (CI installs chromium).")
    if found is None:
        pytest.skip("chromium is not installed here (.ci/run installs it)")
    return found


def test_report_is_self_contained_with_every_method(comparison):
    page = render_report(comparison)
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # no network assets
    assert 'id="metrics"' in page
    for method in METHODS:
        assert f'id="method-{method}"' in page and f'id="{method}-0-source"' in page
    assert page.count("data:image/png;base64,") == 2  # value_zeroing's per-layer panels: source and target


def test_report_loads_in_headless_browser(comparison, tmp_path):
    executable = browser()
    path = write_report(comparison, tmp_path / "report.html")
    common = [executable, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,1600"]
    dom = subprocess.run([*common, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert "<table" in dom and 'id="metrics"' in dom
    for method in METHODS:
        assert f'id="method-{method}"' in dom and f'id="{method}-0-target"' in dom
    screenshot = tmp_path / "shot.png"
    subprocess.run([*common, f"--screenshot={screenshot}", path.as_uri()], capture_output=True, timeout=120)
    image = Image.open(screenshot).convert("L")
    low, high = image.getextrema()
    assert high - low > 100  # not blank: dark text and coloured cells on white


def test_layer_figure_has_one_panel_per_layer():
    scores = torch.rand(5, 4, 6)
    scores[0, 0, 0] = float("nan")
    figure = layer_figure(scores, list("abcde"), list("wxyz"))
    panels = [axis for axis in figure.axes if axis.get_title().startswith("layer")]
    assert len(panels) == 6
    # numbered as the outputs' info["score_axis"] ("layer 0", ...) and the model's own modules (model.layers[0])
    assert [axis.get_title() for axis in panels] == [f"layer {layer}" for layer in range(6)]
    with pytest.raises(ValueError, match="layers"):
        layer_figure(scores[..., 0], list("abcde"), list("wxyz"))


def test_cli_methods_lists_ours_and_inseqs(capsys):
    assert main(["methods"]) == 0
    listed = capsys.readouterr().out
    for name in [*inseq_mixing.METHODS, "integrated_gradients", "deeplift"]:
        assert re.search(rf"^{name}\s", listed, re.MULTILINE)


def test_cli_compare_on_a_local_model(tmp_path, capsys):
    folder = tmp_path / "model"
    tiny_model("bart").save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    out = tmp_path / "report.html"
    code = main(["compare", SOURCE, "--target", TARGET, "--model", str(folder), "--methods", "alti", "decompx",
                 "--out", str(out), "--json", str(tmp_path / "m.json"), "--random-draws", "1"])  # fmt: skip
    assert code == 0 and out.exists() and (tmp_path / "m.json").exists()
    assert "decompx" in capsys.readouterr().out


def test_cli_reports_unknown_methods_and_models(tmp_path, capsys):
    assert main(["compare", "hi", "--model", "x", "--methods", "magic"]) == 2
    assert "unknown method" in capsys.readouterr().err
    assert main(["compare", "hi", "--model", str(tmp_path / "missing"), "--methods", "alti"]) == 2
    assert "could not load model" in capsys.readouterr().err


def test_console_script_is_installed():
    result = subprocess.run([sys.executable, "-m", "inseq_mixing.cli", "methods"], capture_output=True, text=True)
    assert result.returncode == 0 and "decompx" in result.stdout


def computed_cell_colours(html_page: str, folder, executable: str) -> list[tuple[str, str]]:
    """``(inline style, computed background colour)`` of every cell with an inline background, in Chromium."""
    probe = (
        "<script>window.addEventListener('load', () => { const cells = [...document.querySelectorAll("
        "'[style*=\"background\"]')]; const out = document.createElement('pre'); out.id = 'colours'; "
        "out.textContent = cells.map(c => c.getAttribute('style') + '=>' + getComputedStyle(c).backgroundColor)"
        ".join('|'); document.body.appendChild(out); });</script>"
    )
    path = folder / "show.html"
    path.write_text(f"<!DOCTYPE html><html><body>{html_page}{probe}</body></html>", encoding="utf-8")
    command = [executable, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", path.as_uri()]
    dom = subprocess.run(command, capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'<pre id="colours">([^<]*)</pre>', dom)
    assert found, "the probe did not run"
    return [tuple(cell.split("=&gt;")) for cell in found.group(1).split("|")]


@pytest.mark.parametrize("method", ["alti", "alti_logit"])
def test_inseq_show_heatmaps_have_colours_in_chromium(method, tmp_path):
    """Inseq 0.7 under numpy 2 writes ``rgba(np.float64(...))``, which browsers drop: cells would be transparent.
    Every cell Inseq meant to colour (alpha above 0; NaN and zero scores are transparent by design) must be painted."""
    executable = browser()
    model = load_tiny("marian", method)
    out = model.attribute(SOURCE, TARGET, attribute_target=True, show_progress=False)
    page = out.show(display=False, return_html=True)
    cells = computed_cell_colours(page, tmp_path, executable)
    meant = [computed for style, computed in cells if not re.search(r",\s*0(\.0)?\)", style)]
    assert len(meant) > 10
    assert all(colour not in ("", "rgba(0, 0, 0, 0)", "transparent") for colour in meant)


def page_width(executable: str, path: Path, window: int = 1280) -> int:
    """The page's laid-out width in a ``window``-px-wide headless Chromium (read through a probe copy)."""
    probe = path.with_name(f"{path.stem}-probe.html")
    probe.write_text(path.read_text().replace(
        "</body>", "<script>document.title = 'W' + document.documentElement.scrollWidth</script></body>"))  # fmt: skip
    command = [executable, "--headless", "--no-sandbox", "--disable-gpu", f"--window-size={window},900",
               "--dump-dom", probe.as_uri()]  # fmt: skip
    dom = subprocess.run(command, capture_output=True, text=True, timeout=120).stdout
    return int(dom.split("<title>W", 1)[1].split("<", 1)[0])


def test_a_comparison_of_every_method_fits_1280_pixels(tmp_path):
    """The faithfulness and agreement table of ten methods is wider than the window: it scrolls inside itself."""
    executable = browser()
    methods = [*inseq_mixing.METHODS, "saliency", "input_x_gradient"]
    wide = inseq_mixing.compare(load_tiny("marian", "alti"), methods, SOURCE, TARGET, fractions=(0.5,),
                                random_draws=1)  # fmt: skip
    path = write_report(wide, tmp_path / "wide.html")
    assert page_width(executable, path) <= 1280


def test_an_evaluation_report_has_no_empty_section():
    """One method: no paired test, so no "Paired tests" heading; no kept example (blank-out measures the model): no
    "Examples" heading. Two methods: the paired test is there."""
    from inseq_mixing.evaluation.metrics import mean_statistic
    from inseq_mixing.evaluation.scores import Evaluation, MethodResult
    from inseq_mixing.views.eval_report import render_evaluation_report

    def evaluation(methods: list[str]) -> Evaluation:
        result = Evaluation("faithfulness", draws=20)
        for shift, method in enumerate(methods):
            values = [0.1 + shift, 0.3 + shift, 0.2]
            result.results[method] = MethodResult(
                {
                    name: mean_statistic(values)
                    for name in (
                        "comprehensiveness_prob",
                        "sufficiency_prob",
                        "comprehensiveness_logit",
                        "sufficiency_logit",
                    )
                }
            )
            result.examples[method] = []
        return result

    page = render_evaluation_report(evaluation(["alti"]))
    assert "<h2>Metrics</h2>" in page and "Paired tests" not in page and "<h2>Examples</h2>" not in page
    page = render_evaluation_report(evaluation(["alti", "decompx"]))
    assert "<h2>Paired tests</h2>" in page and 'id="pairs"' in page
