"""What the package's own front ends hand back besides the numbers: Inseq's output whose ``show()`` names its columns
(not "Generated tokens") and still saves and loads as Inseq's, a progress bar that counts inputs and says what it is
doing, and one layout for every per-layer figure."""

import html

import inseq
import torch

import inseq_mixing
from inseq_mixing.frontends.output import INSEQ_CAPTION
from inseq_mixing.testing import encoder_tokenizer, image_processor, synthetic_image, tiny_encoder, tiny_vision


def test_show_names_the_explained_entries_and_save_writes_inseqs_own_output(tmp_path):
    classifier = inseq_mixing.load_model(tiny_encoder("bert", "sequence_classification"), "alti_logit",
                                         tokenizer=encoder_tokenizer())  # fmt: skip
    images = inseq_mixing.load_model(tiny_vision("vit"), "alti", processor=image_processor())
    for out in (classifier.attribute("the cat sat", show_progress=False),
                images.attribute(synthetic_image(32), show_progress=False)):  # fmt: skip
        page = out.show(display=False, return_html=True)
        assert INSEQ_CAPTION not in page
        assert html.escape(out.info["explained"]) in page  # what info["explained"] says, in the caption or the page
        if out.images is None:  # a text's heatmap captioned; an image's overlays instead (tests/test_vision.py)
            assert "→ : explained, " in page
        else:
            assert "data:image/png;base64," in page
        out.save(tmp_path / "out.json", overwrite=True)
        loaded = inseq.FeatureAttributionOutput.load(tmp_path / "out.json")
        assert type(loaded) is inseq.FeatureAttributionOutput
        torch.testing.assert_close(loaded.sequence_attributions[0].source_attributions,
                                   out.sequence_attributions[0].source_attributions)  # fmt: skip


def test_the_progress_bar_counts_inputs_and_says_what_it_is_doing(capsys):
    images = inseq_mixing.load_model(tiny_vision("vit"), "alti", processor=image_processor())
    images.attribute([synthetic_image(32, seed=seed) for seed in range(3)], batch_size=2)
    bar = capsys.readouterr().err
    assert "3/3" in bar and "image" in bar and "forward pass" in bar and "alti on 2 image(s)" in bar


def test_every_per_layer_figure_has_one_layout():
    """Token heatmaps and maps over an image: four panels a row, layer i titled ``layer i`` from 0 in reading order,
    the panels left over switched off."""
    from inseq_mixing.views.figures import layer_figure, plt
    from inseq_mixing.views.images import layer_image_grid

    out = inseq_mixing.load_model(tiny_vision("vit", layers=5), "value_zeroing", processor=image_processor())
    sequence = out.attribute(synthetic_image(32), show_progress=False, per_layer=True).sequence_attributions[0]
    tokens = [token.token for token in sequence.source]
    figures = [layer_figure(sequence.source_attributions, tokens, ["[CLS]"]),
               layer_image_grid(sequence, synthetic_image(32))]  # fmt: skip
    for figure in figures:
        panels = [axis for axis in figure.axes if axis.get_title().startswith("layer")]
        assert [axis.get_title() for axis in panels] == [f"layer {index}" for index in range(5)]
        rows = [round(axis.get_position().y0, 3) for axis in panels]
        assert len(set(rows[:4])) == 1 and rows[4] < rows[0]  # four a row, the fifth below
        columns = [round(axis.get_position().x0, 3) for axis in panels]
        assert columns[4] == columns[0]
        plt.close(figure)
