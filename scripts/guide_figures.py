"""Make the guide's figures from the code, offline (``docs/figures/*.png``): Inseq's heatmap of the demo translation
model (``out.show()``'s HTML, rendered in headless Chromium at 1,280 px), value zeroing's per-layer panels on the same
sentence (``views.figures.layer_figure``), and ALTI-logit's patch scores over a real photo (matplotlib's sample of
Grace Hopper) for a tiny ViT classifier with random weights (``views.images.image_heatmap``). The explorer's
screenshots are ``scripts/explorer_screenshots.py``'s.

    python scripts/guide_figures.py [--out docs/figures]
"""

import argparse
import shutil
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

import inseq_mixing
from inseq_mixing.testing import tiny_vision, vision_processor
from inseq_mixing.views.figures import layer_figure
from inseq_mixing.views.images import image_heatmap

SENTENCE = "the dogs near the cat find the old house"


def heatmap_png(path: Path) -> None:
    out = inseq_mixing.load_demo_model("alti_logit").attribute(SENTENCE, attribute_target=True, show_progress=False)
    page = out.show(display=False, return_html=True)
    with tempfile.TemporaryDirectory() as folder, sync_playwright() as playwright:
        html = Path(folder) / "heatmap.html"
        html.write_text(f"<html><body style='font-family:sans-serif;margin:8px'>{page}</body></html>")
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1280, "height": 600})
        tab.goto(html.as_uri())
        tab.locator("table").first.screenshot(path=str(path))
        browser.close()


def layers_png(path: Path) -> None:
    out = inseq_mixing.load_demo_model("value_zeroing").attribute(SENTENCE, attribute_target=True, show_progress=False)
    sequence = out.sequence_attributions[0]
    figure = layer_figure(sequence.source_attributions, [t.token for t in sequence.source],
                          [t.token for t in sequence.target[sequence.attr_pos_start : sequence.attr_pos_end]],
                          title="value_zeroing, source tokens, one panel per layer")  # fmt: skip
    figure.savefig(path, dpi=90, bbox_inches="tight")


def overlay_png(path: Path) -> None:
    import matplotlib.cbook

    front = inseq_mixing.load_model(tiny_vision("vit"), "alti_logit", processor=vision_processor("vit"))
    image = matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)  # a real photo, in matplotlib
    out = front.attribute(image, show_progress=False)
    image_heatmap(out.sequence_attributions[0], image, path=path,
                  title="alti_logit over the patches (tiny ViT, random weights)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/figures")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    figures = {"heatmap": heatmap_png, "value_zeroing_layers": layers_png, "vision_overlay": overlay_png}
    for name, make in figures.items():
        make(out / f"{name}.png")
        print(out / f"{name}.png")


if __name__ == "__main__":
    main()
