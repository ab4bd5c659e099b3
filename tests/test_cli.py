"""The command line as a user meets it: the demo model offline in every command, Ctrl-C in a dataset run, broken
pipes, output files never silently replaced; and a stored run's repr and step-score table."""

import json
import os
import signal
import subprocess
import sys
import time

import inseq
import pytest

import inseq_mixing
from inseq_mixing.cli import main
from inseq_mixing.demo import demo_examples
from inseq_mixing.runs import attribute_dataset, load_run
from inseq_mixing.testing import tiny_model, word_tokenizer

from .test_runs import model_dir, write_jsonl  # noqa: F401  (a saved tiny Marian and its data)

SOURCE = " ".join(demo_examples(1)[0].source)


def test_every_command_takes_the_demo_model_offline(tmp_path, capsys):
    code = main(["compare", SOURCE, "--model", "demo", "--methods", "alti_logit", "--out", str(tmp_path / "c.html"),
                 "--random-draws", "1"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps({"source": " ".join(e.source)}) for e in demo_examples(3)))
    code = main(["attribute-dataset", str(data), "--model", "demo", "--method", "alti_logit", "--out",
                 str(tmp_path / "run")])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert len(load_run(tmp_path / "run")) == 3
    assert load_run(tmp_path / "run").manifest["model"]["name"] == "demo"  # not the packaged model's install path
    code = main(["attribute-dataset", str(data), "--model", "demo", "--method", "nope", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and "nope" in err and "Traceback" not in err


def test_an_existing_output_is_only_replaced_when_asked(tmp_path, capsys):
    out = tmp_path / "report.html"
    out.write_text("keep me")
    args = ["compare", SOURCE, "--model", "demo", "--methods", "alti", "--random-draws", "1", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert out.read_text() == "keep me" and (tmp_path / "report-1.html").is_file()
    assert "writing" in printed and "report-1.html" in printed and "--overwrite" in printed
    assert main([*args, "--overwrite"]) == 0 and out.read_text() != "keep me"


def test_ctrl_c_in_a_dataset_run_says_what_is_stored_and_how_to_resume(model_dir, tmp_path):  # noqa: F811
    rows = 60
    data = write_jsonl(tmp_path / "data.jsonl", rows)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "inseq_mixing.cli", "attribute-dataset", str(data), "--model", str(model_dir),
               "--method", "value_zeroing", "--batch-size", "1", "--out", str(out)]  # fmt: skip
    # Ctrl-C's default action in the child, whatever this process inherited (a shell starts background jobs with
    # SIGINT ignored, and a Python started so never raises KeyboardInterrupt)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    deadline = time.time() + 120
    while time.time() < deadline and len(list((out / "shards").glob("batch-*.json"))) < 2:
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-2000:]
    stored = len(load_run(out))
    assert 2 <= stored < rows, "the interrupt must land mid-run"
    assert f"interrupted: {stored} of {rows} examples are stored in {out}" in err and "Traceback" not in err
    resume = err.strip().splitlines()[-1].strip()
    assert resume.startswith("inseq-mixing attribute-dataset")
    resumed = subprocess.run([sys.executable, "-m", "inseq_mixing.cli", *resume.split()[1:]], capture_output=True,
                             text=True, timeout=600)  # fmt: skip
    assert resumed.returncode == 0 and f"{stored} already stored" in resumed.stdout
    assert load_run(out).complete


def test_a_closed_pipe_ends_quietly():
    """The reader is gone before the command writes (``| true``), so every write meets a closed pipe."""
    command = f"{sys.executable} -m inseq_mixing.cli methods | true"
    result = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr


def test_a_run_says_what_it_holds_and_its_step_scores_complete_the_logit(tmp_path):
    model = inseq.load_model(tiny_model("gpt2"), "alti_logit", tokenizer=word_tokenizer(seq2seq=False))
    rows = [
        {"id": "a", "source": "the cat", "target": "the cat sat on"},
        {"id": "b", "source": "a", "target": "a dog"},
    ]
    attribute_dataset(model, "alti_logit", rows, tmp_path / "run", show_progress=False, id_column="id")
    run = load_run(tmp_path / "run")
    assert "alti_logit" in repr(run) and "2 of 2 examples stored" in repr(run)
    steps = run.step_scores_frame()
    assert len(steps) == sum(len(run[i].step_scores["logit"]) for i in run.ids())
    scores = run.to_pandas().groupby(["id", "generated_index"]).score.sum().reset_index()
    joined = scores.merge(steps, on=["id", "generated_index"])
    completed = joined.score + joined.filter(like="unattributed_").sum(axis=1)
    assert (completed - joined.logit).abs().max() < 1e-4


def test_the_demo_model_loads_offline_and_the_output_says_what_it_explains(tmp_path):
    """``inseq_mixing.load_demo_model(method)`` needs no network; ``info["attributed_fn"]`` names what the scores
    explain (Inseq would write its probability function), and a saved output keeps it."""
    import inseq_mixing

    source = " ".join(demo_examples(1)[0].source)
    expected = {"alti_logit": "logit", "value_zeroing": "value_zeroing map"}
    for method, explained in expected.items():
        out = inseq_mixing.load_demo_model(method).attribute(source, attribute_target=True, show_progress=False)
        assert out.info["attributed_fn"].startswith(explained)
    model = inseq_mixing.load_demo_model("decompx")
    target = "".join(t.token for t in out.sequence_attributions[0].target[1:3]).replace("▁", " ").strip()
    contrast = model.attribute(source, target, attribute_target=True, show_progress=False, contrast_targets=target)
    assert contrast.info["attributed_fn"] == "contrast_logits_diff"
    contrast.save(tmp_path / "out.json")
    assert inseq.FeatureAttributionOutput.load(tmp_path / "out.json").info["attributed_fn"] == "contrast_logits_diff"


def test_attribute_dataset_takes_inseqs_own_methods(model_dir, tmp_path):  # noqa: F811
    data = write_jsonl(tmp_path / "data.jsonl", 3)
    command = [sys.executable, "-m", "inseq_mixing.cli", "attribute-dataset", str(data), "--model", str(model_dir),
               "--method", "integrated_gradients", "--option", "n_steps=3", "--out", str(tmp_path / "ig")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    run = load_run(tmp_path / "ig")
    assert len(run) == 3 and run.manifest["options"]["n_steps"] == 3


def test_a_prompt_whose_generation_would_outrun_the_positions_is_refused_before_any_work(tmp_path, capsys):
    import transformers

    config = transformers.GPT2Config(vocab_size=80, n_embd=16, n_layer=1, n_head=2, n_positions=24, bos_token_id=3,
                                     eos_token_id=1, pad_token_id=0)  # fmt: skip
    folder = tmp_path / "short-gpt2"
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    word_tokenizer(seq2seq=False).save_pretrained(folder)
    prompt = "the cat sat on the mat and the dog"  # 9 tokens, and up to 20 generated: past 24 positions
    model = inseq.load_model(str(folder), "alti_logit")
    with pytest.raises(ValueError, match=r"Row 0 \(id '0'\): the prompt has 9 tokens.*position embeddings for 24"):
        attribute_dataset(model, "alti_logit", [{"source": prompt}], tmp_path / "run", show_progress=False)
    assert not (tmp_path / "run").exists()
    attribute_dataset(model, "alti_logit", [{"source": prompt, "target": f"{prompt} sat"}], tmp_path / "ok",
                      show_progress=False)  # fmt: skip
    capsys.readouterr()  # (what saving and loading printed)
    code = main(["compare", prompt, "--model", str(folder), "--methods", "alti", "--out", str(tmp_path / "r.html")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "Give --target" in err[0]


LIGHT_CHECK = "import sys; {code}; print(sorted(m for m in ('torch', 'transformers', 'inseq') if m in sys.modules))"


@pytest.mark.parametrize(
    "code",
    [
        "import inseq_mixing",
        "from inseq_mixing.cli import main; main(['methods'])",
        "from inseq_mixing.cli import main; main(['methods', '--options'])",
        "from inseq_mixing.cli import build_parser; build_parser().format_help()",
    ],
)
def test_the_package_and_the_listing_commands_import_no_torch(code):
    """``--help`` and ``methods`` answer without torch, transformers or Inseq (which take seconds to import)."""
    out = subprocess.run([sys.executable, "-c", LIGHT_CHECK.format(code=code)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(
    "imports",
    [
        "import inseq_mixing; import inseq",
        "import inseq; import inseq_mixing",
        "import inseq_mixing.frontends.inseq_adapter; import inseq",
        "import inseq_mixing.frontends.inseq_adapter.builtin; import inseq",
        "import inseq_mixing.frontends.patches; import inseq",  # the patches module starts no Inseq import itself
        "import inseq_mixing; from inseq.attr import FeatureAttribution",
    ],
)
def test_importing_the_plugin_registers_its_methods_whichever_comes_first(imports):
    code = (f"{imports}; import inseq, inseq_mixing; names = inseq.list_feature_attribution_methods(); "
            "print(all(n in names for n in inseq_mixing.METHODS), names.count('value_zeroing'), "
            "'inseq_value_zeroing' in names)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "1", "True"]


def test_the_listing_names_every_method_inseq_has(capsys):
    from inseq_mixing.cli import INSEQ_METHODS

    assert main(["methods"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert set(listed) == set(inseq.list_feature_attribution_methods())
    assert set(INSEQ_METHODS) == set(inseq.list_feature_attribution_methods()) - set(inseq_mixing.METHODS)


def test_attribute_mirrors_inseq_attribute_with_the_plugin_methods(tmp_path, capsys):
    saved, page = tmp_path / "out.json", tmp_path / "out.html"
    code = main(["attribute", "-m", "demo", "-a", "alti_logit", "-i", SOURCE, "--save_path", str(saved), "--viz_path",
                 str(page), "--hide_attributions", "--step_scores", "probability"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    out = inseq.FeatureAttributionOutput.load(str(saved))
    assert out.info["attribution_method"] == "alti_logit" and page.read_text().count("<table") >= 1
    assert {"logit", "probability"} <= set(out.sequence_attributions[0].step_scores)
    assert main(["attribute", "-m", "demo", "-a", "alti_logitx", "-i", SOURCE]) == 2
    assert "import inseq_mixing" in capsys.readouterr().err


@pytest.mark.parametrize("family", ["marian", "gpt2"])
@pytest.mark.parametrize("method", ["alti_logit", "value_zeroing"])
def test_requested_step_scores_are_the_models_own(family, method):
    """``step_scores=["probability", "entropy"]`` (refused by Inseq for final-step methods) gives, per generated
    token, the model's probability of it and the entropy of its prediction, from an independent forward pass; the
    method's own step scores stay."""
    import torch

    seq2seq = family == "marian"
    tokenizer = word_tokenizer(seq2seq=seq2seq)
    model = inseq.load_model(tiny_model(family, vocab=len(tokenizer)), method, tokenizer=tokenizer)
    source, target = "the dog sees a cat", "le chien voit un chat"
    generated = target if seq2seq else f"{source} {target}"
    out = model.attribute(source, generated, step_scores=["probability", "entropy"], show_progress=False)
    scores = out.sequence_attributions[0].step_scores
    if seq2seq:
        labels = tokenizer(text_target=target, return_tensors="pt").input_ids
        prefix = torch.cat([torch.tensor([[model.model.config.decoder_start_token_id]]), labels[:, :-1]], 1)
        logits = model.model(**tokenizer(source, return_tensors="pt"), decoder_input_ids=prefix).logits[0]
    else:  # a non-empty prompt is not given a BOS
        ids = torch.tensor([tokenizer(generated).input_ids])
        logits, labels = model.model(ids).logits[0, -len(target.split()) - 1 : -1], ids[:, -len(target.split()) :]
    log_probs = logits.log_softmax(-1)
    assert torch.allclose(scores["probability"], log_probs.exp()[range(labels.shape[1]), labels[0]], atol=1e-5)
    assert torch.allclose(scores["entropy"], -(log_probs.exp() * log_probs).sum(-1), atol=1e-4)
    if method == "alti_logit":
        assert torch.allclose(scores["logit"], logits[range(labels.shape[1]), labels[0]], atol=1e-4)
        assert {"unattributed_ffn", "unattributed_logit_bias"} <= set(scores)
    foil = target.replace("chien", "chat")  # contrastive scores come from Inseq's own pass, with their arguments
    out = model.attribute(source, generated, step_scores=["contrast_prob_diff"], contrast_targets=foil if seq2seq else
                          f"{source} {foil}", show_progress=False)  # fmt: skip
    alone = model.attribute(source, generated, method="dummy", step_scores=["contrast_prob_diff"],
                            contrast_targets=foil if seq2seq else f"{source} {foil}", show_progress=False)  # fmt: skip
    difference = out.sequence_attributions[0].step_scores["contrast_prob_diff"]
    assert torch.equal(difference, alone.sequence_attributions[0].step_scores["contrast_prob_diff"])
    assert difference.abs().sum() > 0


def test_a_speech_folder_without_its_processor_is_named_and_takes_one_apart(tmp_path, capsys):
    """A speech model saved without its feature extractor: one line saying what the folder needs and the
    alternative; ``--processor`` gives it one from another folder."""
    import soundfile

    from inseq_mixing.testing import SAMPLING_RATE, speech_processor, synthetic_audio, tiny_speech

    bare, processor_dir = tmp_path / "weights", tmp_path / "processor"
    tiny_speech("hubert").save_pretrained(bare)
    processor = speech_processor("hubert")
    processor.feature_extractor.save_pretrained(processor_dir)
    processor.tokenizer.save_pretrained(processor_dir)
    soundfile.write(tmp_path / "a.wav", synthetic_audio(0.5), SAMPLING_RATE)
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"audio": str(tmp_path / "a.wav")}))
    args = ["attribute-dataset", str(data), "--model", str(bare), "--method", "alti", "--out", str(tmp_path / "run")]
    assert main(args) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no feature extractor (preprocessor_config.json)" in errors[0]
    assert "--processor" in errors[0] and "huggingface.co" not in errors[0]
    assert main([*args, "--processor", str(processor_dir)]) == 0
    assert len(load_run(tmp_path / "run")) == 1


def test_the_version_and_p_values_read_as_expected(capsys):
    from inseq_mixing.views.tables import p_value_text

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"inseq-mixing {inseq_mixing.__version__}"
    assert p_value_text(1 / 1001) == "p < 0.001" and p_value_text(0.25) == "p = 0.25"
    assert p_value_text(0.0004, bare=True) == "< 0.001" and p_value_text(0.031, bare=True) == "0.031"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["evaluate", "--run", "no-such-run"], "no-such-run is not a run store"),
        (["evaluate", "no-such.jsonl", "--model", "demo", "--protocol", "cue"], "No such data file: no-such.jsonl"),
        (["attribute-dataset", "no-such.jsonl", "--model", "demo", "--method", "alti", "--out", "x"],
         "No such data file: no-such.jsonl"),
        (["attribute-dataset", "data.txt", "--model", "demo", "--method", "alti", "--out", "x"],
         "Unknown data format '.txt'"),
    ],
)  # fmt: skip
def test_a_mistyped_path_is_answered_before_torch_or_inseq_is_imported(args, message, tmp_path):
    """In a fresh process: exit 2, one line naming the path, and neither torch nor Inseq imported (tens of seconds on
    a loaded machine)."""
    (tmp_path / "data.txt").write_text("{}")
    script = ("import sys; from inseq_mixing.cli import main; code = main(sys.argv[1:]); "
              "print(code, sorted(name for name in ('torch', 'inseq') if name in sys.modules))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)  # fmt: skip
    assert done.stdout.strip() == "2 []", done.stderr[-2000:]
    assert done.stderr.strip().startswith("error: ") and message in done.stderr


def saved_tiny_llava(tmp_path):
    """A tiny LLaVA and its processor saved in a folder, and an image file: their paths."""
    from PIL import Image

    from inseq_mixing.testing import synthetic_image, tiny_vlm, tiny_vlm_processor

    folder = tmp_path / "tiny-llava"
    tiny_vlm("llava").save_pretrained(folder)
    tiny_vlm_processor("llava").save_pretrained(folder)
    image = tmp_path / "cat.png"
    Image.fromarray(synthetic_image(40, seed=1)).save(image)
    return folder, image


def test_compare_a_vlm_from_its_folder_with_its_image_and_refuse_an_image_for_a_text_model(tmp_path, capsys):
    """``inseq-mixing compare PROMPT --model VLM_FOLDER --image IMG --target ANSWER``: the saved tiny LLaVA and its
    processor loaded from the folder, every method on the answer, the report written (its image tokens labelled);
    ``--image`` for a text model, and a missing image, each refused in one line (exit 2)."""
    folder, image = saved_tiny_llava(tmp_path)
    report = tmp_path / "r.html"
    code = main(["compare", "the <image> cat", "--model", str(folder), "--image", str(image), "--target", "sat on",
                 "--methods", "alti_logit", "input_x_gradient", "--out", str(report)])  # fmt: skip
    assert code == 0 and "img1 r0c0" in report.read_text()
    capsys.readouterr()
    code = main(["compare", "the <image> cat", "--model", str(folder), "--image", str(tmp_path / "no.png"),
                 "--target", "sat on", "--methods", "alti_logit", "--out", str(tmp_path / "r2.html")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no image file" in err[0]
    code = main(["compare", "the cat", "--model", "demo", "--image", str(image), "--target", "le chat",
                 "--methods", "alti_logit", "--out", str(tmp_path / "r3.html")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "are for vision-language models" in err[0]


def test_every_protocols_column_has_an_evaluate_flag():
    """Each column role a registered protocol reads (the vision-language ones' ``images`` and ``prompt`` among them)
    has its ``--ROLE-column`` flag in ``inseq-mixing evaluate``."""
    from inseq_mixing.cli import EVALUATE_COLUMNS
    from inseq_mixing.evaluation.protocols import PROTOCOLS

    roles = {role for protocol in PROTOCOLS.values() for role in protocol.columns}
    assert roles <= set(EVALUATE_COLUMNS), sorted(roles - set(EVALUATE_COLUMNS))


def test_evaluate_a_vlm_from_the_command_line_with_both_of_its_protocols(tmp_path, capsys):
    """``inseq-mixing evaluate ROWS --model VLM_FOLDER --protocol faithfulness|pointing``: the rows' images, prompts,
    answers (and boxes) read from their columns, every method scored, the metrics written as JSON."""
    folder, image = saved_tiny_llava(tmp_path)
    rows = tmp_path / "rows.jsonl"
    pairs = (("the <image> cat", "sat on"), ("a <image> dog", "the mat"))
    rows.write_text("".join(json.dumps({"images": str(image), "prompt": prompt, "answer": answer,
                                        "box": [0, 0, 20, 20]}) + "\n" for prompt, answer in pairs))  # fmt: skip
    for protocol, metric in (("faithfulness", "deletion_auc"), ("pointing", "pointing_game")):
        metrics = tmp_path / f"{protocol}.json"
        code = main(["evaluate", str(rows), "--model", str(folder), "--protocol", protocol, "--methods", "alti_logit",
                     "attn_lrp", "--out", str(tmp_path / f"{protocol}.html"), "--json", str(metrics)]
                    + (["--steps", "4"] if protocol == "faithfulness" else []))  # fmt: skip
        assert code == 0, capsys.readouterr().err[-2000:]
        assert metric in metrics.read_text() and "attn_lrp" in metrics.read_text()
