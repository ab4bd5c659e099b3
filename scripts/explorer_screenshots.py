"""Make the README's explorer screenshots (``docs/explorer_*.png``) from the code, offline: the explorer page of a
generation output (the embedded demo translation model), an encoder output (a tiny BERT-style masked LM with random
weights), a speech output (a tiny wav2vec 2.0 CTC model with random weights on a synthetic tone) and a vision output
(a tiny ViT classifier with random weights, 196 patches, on matplotlib's sample photo), each loaded in headless
Chromium (Playwright, with Debian's ``chromium``) at 1,280 px, the layer slider moved to the last layer, a column and
a row clicked.

    python scripts/explorer_screenshots.py [--out docs]
"""

import argparse
import shutil
import tempfile
from pathlib import Path

from matplotlib import cbook
from playwright.sync_api import sync_playwright

import inseq_mixing
from inseq_mixing.testing import (
    encoder_tokenizer,
    image_processor,
    speech_processor,
    synthetic_audio,
    tiny_encoder,
    tiny_speech,
    tiny_vision,
)
from inseq_mixing.views.explorer import explore, explore_model


def pages(folder: Path) -> dict[str, tuple[Path, int, int]]:
    """Each view's page, with the column and row to click."""
    made = {}
    path = folder / "generation.html"
    explore_model("demo", "the dogs near the cat find the old house", path=path,
                  title="Explorer: the demo translation model (alti per head, value_zeroing, alti_logit)")  # fmt: skip
    made["generation"] = (path, 1, 2)
    model, tokenizer = tiny_encoder("bert", "masked_lm"), encoder_tokenizer()
    path = folder / "encoder.html"
    explore_model(model, "the cat [MASK] on the old mat", path=path, tokenizer=tokenizer,
                  methods={"alti": {"per_layer": True}, "attention_flow": {"per_layer": True}, "decompx": {}},
                  title="Explorer: a masked LM (tiny BERT, random weights)")  # fmt: skip
    made["encoder"] = (path, 0, 3)
    model, processor = tiny_speech("wav2vec2"), speech_processor("wav2vec2")
    audio = synthetic_audio(2.0)
    front = inseq_mixing.load_model(model, "alti", processor=processor)
    graphs = {"threshold": 0.012, "heads": False}  # 100 frames: each head's part is small, a token's heads summed
    outputs = [front.attribute(audio, show_progress=False, per_layer=True, contribution_graphs=graphs),
               inseq_mixing.load_model(front, "value_zeroing").attribute(audio, show_progress=False)]  # fmt: skip
    path = folder / "speech.html"
    explore(outputs, path, audio=[audio], title="Explorer: wav2vec 2.0 CTC (tiny, random weights) on a synthetic tone")
    made["speech"] = (path, 0, 1)
    image = str(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))  # a real photo in matplotlib
    path = folder / "vision.html"
    explore_model(tiny_vision("vit", image_size=56, patch_size=4), image, path=path, processor=image_processor(56),
                  methods={"alti": {"per_layer": True}, "alti_logit": {}},
                  title="Explorer: a ViT classifier (tiny, random weights; 196 patches) on a photo")  # fmt: skip
    made["vision"] = (path, 0, 5)
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        for name, (path, column, row) in pages(Path(folder)).items():
            page.goto(path.as_uri())
            page.focus("#layer")
            page.keyboard.press("End")
            page.click(f"#panels .panel >> nth=0 >> th.col[data-col='{column}']")
            page.click(f"#panels .panel >> nth=0 >> th.unit[data-unit='{row}']")
            shot = out / f"explorer_{name}.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"{shot}: page {page.evaluate('document.documentElement.scrollWidth')} px wide")
        browser.close()


if __name__ == "__main__":
    main()
