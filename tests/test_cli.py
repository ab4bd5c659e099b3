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
    data = write_jsonl(tmp_path / "data.jsonl", 60)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "inseq_mixing.cli", "attribute-dataset", str(data), "--model", str(model_dir),
               "--method", "value_zeroing", "--batch-size", "1", "--out", str(out)]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and len(list((out / "shards").glob("batch-*.json"))) < 2:
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-2000:]
    stored = len(load_run(out))
    assert 2 <= stored < 60, "the interrupt must land mid-run"
    assert f"interrupted: {stored} of 60 examples are stored in {out}" in err and "Traceback" not in err
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
