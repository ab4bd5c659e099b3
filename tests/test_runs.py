"""Dataset runs: stored examples equal ``model.attribute``, resume after SIGKILL, manifest refusal, bad input, and the
two-process Accelerate run."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import inseq
import pandas as pd
import pytest
import torch

import inseq_mixing
from inseq_mixing.frontends import run_front_end
from inseq_mixing.runs import DatasetInputError, RunStoreError, attribute_dataset, load_run, read_examples
from inseq_mixing.testing import is_seq2seq, word_tokenizer

from .conftest import get_tiny

METHODS = ("value_zeroing", "alti", "alti_logit", "decompx", "attention_norm")
SOURCES = ["the cat sat on the mat", "hello world", "the dog", "she read many books in the library", "good morning"]
TARGETS = ["le chat assis sur le tapis", "hello world", "le chien", "elle a lus beaucoup de livres", "good morning"]


def rows_for(family: str, generate: tuple[int, ...] = ()) -> list[dict]:
    """Examples of different lengths; decoder-only targets are the prompt's continuation (the full text)."""
    rows = []
    for idx, (source, target) in enumerate(zip(SOURCES, TARGETS, strict=True)):
        if not is_seq2seq(family):
            source = " ".join(source.split()[: 1 + idx % 3])
            target = f"{source} {target}"
        rows.append({"id": f"ex{idx}", "source": source, "target": None if idx in generate else target})
    return rows


def load(family: str, method: str):
    return inseq.load_model(get_tiny(family), method, tokenizer=word_tokenizer(seq2seq=is_seq2seq(family)))


def assert_same_sequence(got, ref, atol: float = 1e-5) -> None:
    assert [t.token for t in got.source] == [t.token for t in ref.source]
    assert [t.token for t in got.target] == [t.token for t in ref.target]
    assert (got.attr_pos_start, got.attr_pos_end) == (ref.attr_pos_start, ref.attr_pos_end)
    for name in ("source_attributions", "target_attributions"):
        mine, theirs = getattr(got, name), getattr(ref, name)
        assert (mine is None) == (theirs is None), name
        if theirs is not None:
            assert mine.shape == theirs.shape, name
            assert torch.equal(mine.isnan(), theirs.isnan()), name
            torch.testing.assert_close(mine.nan_to_num(), theirs.nan_to_num(), atol=atol, rtol=1e-4)
    assert set(got.step_scores or {}) == set(ref.step_scores or {})
    for name, score in (ref.step_scores or {}).items():
        torch.testing.assert_close(got.step_scores[name], score, atol=atol, rtol=1e-4)
    assert set(got.sequence_scores or {}) == set(ref.sequence_scores or {})
    for name, score in (ref.sequence_scores or {}).items():
        torch.testing.assert_close(got.sequence_scores[name].nan_to_num(), score.nan_to_num(), atol=atol, rtol=1e-4)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("family", ["marian", "t5", "gpt2", "qwen2"])
def test_stored_examples_equal_model_attribute(family, method, tmp_path):
    """Every stored example equals ``model.attribute`` on it alone: padding across a batch changes nothing."""
    model = load(family, method)
    rows = rows_for(family)
    summary = attribute_dataset(
        model, method, rows, tmp_path / "run", batch_size=3, show_progress=False, id_column="id"
    )
    assert summary.attributed == len(rows)
    run = load_run(tmp_path / "run")
    assert len(run) == len(rows) and run.complete
    assert run.ids() == [row["id"] for row in rows]  # the data's order, whatever the batching
    for row in rows:
        ref = model.attribute(
            row["source"], row["target"], attribute_target=is_seq2seq(family), show_progress=False
        ).sequence_attributions[0]
        got = run[row["id"]]
        assert type(got) is type(ref)
        assert_same_sequence(got, ref, atol=1e-4 if method == "value_zeroing" else 1e-5)
        assert "<table" in got.show(display=False, return_html=True)


def test_decoder_only_batches_explain_only_the_generated_rows(tmp_path, monkeypatch):
    """A decoder-only batch is attributed from position 1 (prompts of different lengths), but each sentence's method
    request explains only from the position that predicts its first generated token: the prompt rows are skipped."""
    from inseq_mixing.declarations import Declaration

    requests, run = [], Declaration.run
    monkeypatch.setattr(Declaration, "run", lambda self, request, options: requests.append(request) or run(
        self, request, options))  # fmt: skip
    model = load("gpt2", "value_zeroing")
    rows = rows_for("gpt2")
    attribute_dataset(model, "value_zeroing", rows, tmp_path / "run", batch_size=len(rows), show_progress=False)
    (request,) = requests
    pairs = zip(request.positions, request.decoder_mask, strict=True)
    lengths = {int(real.sum()): explained for explained, real in pairs}
    for row in rows:  # the batch is sorted by length (one prompt length per text length here)
        prompt, length = (model.encode(row[key]).input_ids.shape[1] for key in ("source", "target"))
        explained = lengths.get(length, lengths.get(length - 1)).nonzero().flatten().tolist()
        assert explained[0] == prompt - 1  # the prompt rows are skipped
        assert set(range(prompt - 1, length - 1)) <= set(explained) <= set(range(prompt - 1, length))
    assert any(len(row["source"].split()) > 1 for row in rows)  # some rows had prompt rows to skip
    assert model.attribution_method.call.kept_from is None  # within the one call only (explaining_from)


@pytest.mark.parametrize("family", ["marian", "gpt2"])
def test_missing_targets_are_generated(family, tmp_path):
    model = load(family, "alti_logit")
    rows = rows_for(family, generate=(1, 3))
    attribute_dataset(model, "alti_logit", rows, tmp_path / "run", batch_size=5, show_progress=False, id_column="id")
    run = load_run(tmp_path / "run")
    for row in rows:
        got = run[row["id"]]
        if row["target"] is None:
            assert "".join(t.token for t in got.target)  # something was generated
        target = model.convert_tokens_to_string([t.token for t in got.target], skip_special_tokens=True)
        ref = model.attribute(row["source"], target, attribute_target=is_seq2seq(family), show_progress=False)
        assert_same_sequence(got, ref.sequence_attributions[0])


LENGTHS = ("the cat sat on the mat and the dog read many books in the library", "hello", "she read",
           "good morning see you soon please")  # fmt: skip


@pytest.mark.parametrize("family", ["marian", "t5", "gpt2", "llama"])
def test_generated_targets_are_each_examples_own_generation(family, tmp_path):
    """Without a target column, each stored example is what ``model.attribute(source)`` gives it alone: padding
    sources of 1 to 14 words into one batch changes no generation."""
    model = load(family, "alti_logit")
    rows = [{"id": f"g{idx}", "source": source} for idx, source in enumerate(LENGTHS)]
    attribute_dataset(model, "alti_logit", rows, tmp_path / "run", batch_size=4, show_progress=False, id_column="id")
    run = load_run(tmp_path / "run")
    for row in rows:
        ref = model.attribute(row["source"], attribute_target=is_seq2seq(family), show_progress=False)
        assert_same_sequence(run[row["id"]], ref.sequence_attributions[0])


def test_an_empty_prompt_is_attributed_as_model_attribute_does(tmp_path):
    """Inseq attributes an empty decoder-only prompt from the BOS token: the stored labels are not shifted."""
    model = load("gpt2", "alti_logit")
    rows = [
        {"id": "empty", "source": "", "target": "the cat sat on"},
        {"id": "prompt", "source": "the dog", "target": "the dog read many books"},
        {"id": "generated", "source": "", "target": None},
    ]
    attribute_dataset(model, "alti_logit", rows, tmp_path / "run", batch_size=3, show_progress=False, id_column="id")
    run = load_run(tmp_path / "run")
    for row in rows:
        ref = model.attribute(row["source"], row["target"], show_progress=False).sequence_attributions[0]
        assert_same_sequence(run[row["id"]], ref)
    assert [t.token for t in run["empty"].target] == ["<s>", "the", "cat", "sat", "on"]
    assert run["empty"].attr_pos_start == 1


@pytest.mark.parametrize("family", ["marian", "gpt2"])
def test_inseq_methods_run_through_inseqs_loop_into_the_same_store(family, tmp_path):
    """A dataset run of Integrated Gradients sits next to one of DecompX: same store, same load_run, each example as
    ``model.attribute`` gives it; its options are checked like the plugin's."""
    model = load(family, "integrated_gradients")
    rows = rows_for(family, generate=(1,))[:3]
    out = tmp_path / "run"
    attribute_dataset(model, "integrated_gradients", rows, out, batch_size=2, show_progress=False, id_column="id",
                      n_steps=4)  # fmt: skip
    run = load_run(out)
    assert run.manifest["method"] == "integrated_gradients" and len(run) == len(rows)
    for row in rows:
        got = run[row["id"]]
        target = model.convert_tokens_to_string([t.token for t in got.target], skip_special_tokens=True)
        ref = model.attribute(row["source"], row["target"] or target, attribute_target=is_seq2seq(family),
                              show_progress=False, n_steps=4).sequence_attributions[0]  # fmt: skip
        assert type(got) is type(ref) and got.source_attributions is not None or not is_seq2seq(family)
        assert_same_sequence(got, ref)
        assert "<table" in got.show(display=False, return_html=True)
    assert "embedding_dim" in run.to_pandas().columns
    with pytest.raises(ValueError, match="Unknown option"):
        attribute_dataset(model, "integrated_gradients", rows, tmp_path / "x", show_progress=False, n_stepz=4)


def test_to_pandas_has_one_row_per_score(tmp_path):
    model = load("marian", "value_zeroing")
    rows = rows_for("marian")[:2]
    attribute_dataset(model, "value_zeroing", rows, tmp_path / "run", show_progress=False, id_column="id",
                      per_layer=True)  # fmt: skip
    run = load_run(tmp_path / "run")
    frame = run.to_pandas()
    assert list(frame.columns) == [
        "id", "generated_index", "generated_token", "side", "context_index", "context_token", "layer", "score"
    ]  # fmt: skip
    expected = sum(
        int((~scores.isnan()).sum())
        for example_id in run.ids()
        for scores in (run[example_id].source_attributions, run[example_id].target_attributions)
    )
    assert len(frame) == expected
    first = run[rows[0]["id"]]
    cell = frame[(frame.id == rows[0]["id"]) & (frame.side == "source")].iloc[5]
    assert cell.score == pytest.approx(
        float(first.source_attributions[cell.context_index, cell.generated_index, cell.layer])
    )
    assert cell.context_token == first.source[cell.context_index].token
    assert cell.generated_token == first.target[first.attr_pos_start + cell.generated_index].token
    aggregated = first.aggregate()  # Inseq's aggregation works on a loaded example
    assert aggregated.source_attributions.ndim == 2


def test_finished_run_does_nothing_and_other_runs_are_refused(tmp_path):
    model = load("gpt2", "alti")
    rows = rows_for("gpt2")
    out = tmp_path / "run"
    attribute_dataset(model, "alti", rows, out, batch_size=2, show_progress=False, id_column="id")
    before = {path.name: path.stat().st_mtime_ns for path in (out / "shards").iterdir()}
    again = attribute_dataset(model, "alti", rows, out, batch_size=2, show_progress=False, id_column="id")
    assert again.attributed == 0 and again.skipped == len(rows)
    assert {path.name: path.stat().st_mtime_ns for path in (out / "shards").iterdir()} == before
    with pytest.raises(RunStoreError, match="method"):
        attribute_dataset(
            load("gpt2", "decompx"), "decompx", rows, out, batch_size=2, show_progress=False, id_column="id"
        )
    with pytest.raises(RunStoreError, match="options"):
        attribute_dataset(model, "alti", rows, out, batch_size=2, show_progress=False, per_layer=True, id_column="id")
    with pytest.raises(RunStoreError, match="data"):
        attribute_dataset(model, "alti", rows[:3], out, batch_size=2, show_progress=False, id_column="id")
    other = inseq.load_model(
        type(get_tiny("gpt2"))(get_tiny("gpt2").config).eval(), "alti", tokenizer=word_tokenizer(seq2seq=False)
    )  # same config, other weights
    with pytest.raises(RunStoreError, match="model"):
        attribute_dataset(other, "alti", rows, out, batch_size=2, show_progress=False, id_column="id")


def test_readers_and_bad_input(tmp_path):
    rows = rows_for("marian")
    pd.DataFrame(rows).to_csv(tmp_path / "data.csv", index=False)
    pd.DataFrame(rows).to_parquet(tmp_path / "data.parquet")
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(row) for row in rows))
    import datasets

    expected = read_examples(rows, id_column="id")
    for data in (
        tmp_path / "data.csv",
        tmp_path / "data.parquet",
        tmp_path / "data.jsonl",
        datasets.Dataset.from_list(rows),
    ):
        assert read_examples(data, id_column="id") == expected
    assert [example.target for example in expected].count(None) == 0
    assert read_examples(rows, target_column="nothing")[0].target is None  # no target column: generate
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "broken.jsonl").write_text('{"source": "a"}\n{"source": ')
    cases = {
        "no source column": (rows, {"source_column": "text"}),
        "empty": (tmp_path / "empty.jsonl", {}),
        "No such data file": (tmp_path / "missing.jsonl", {}),
        "line 2": (tmp_path / "broken.jsonl", {}),
        "share the id": ([{"source": "a", "id": 1}, {"source": "b", "id": 1}], {"id_column": "id"}),
        "Unknown data format": (tmp_path / "data.txt", {}),
    }
    (tmp_path / "data.txt").write_text("x")
    for message, (data, columns) in cases.items():
        with pytest.raises(DatasetInputError, match=message):
            read_examples(data, **columns)


def test_bad_calls_are_refused_before_any_work(tmp_path):
    model = load("gpt2", "alti")
    rows = rows_for("gpt2")
    with pytest.raises(ValueError, match="per_layer"):
        attribute_dataset(model, "alti", rows, tmp_path / "a", per_layr=True, show_progress=False)
    with pytest.raises(ValueError, match="choose one of"):
        attribute_dataset(model, "no_such_method", rows, tmp_path / "b", show_progress=False, id_column="id")
    with pytest.raises(DatasetInputError, match="must start with the prompt"):
        attribute_dataset(
            model, "alti", [{"source": "the cat", "target": "a dog"}], tmp_path / "c", show_progress=False
        )
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()


# ----- the command line: kill -9 and resume, bad input, two Accelerate processes -----


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny Marian saved with its tokenizer in a local folder, as a user's checkpoint would be."""
    folder = tmp_path_factory.mktemp("marian")
    get_tiny("marian").save_pretrained(folder)
    word_tokenizer(seq2seq=True).save_pretrained(folder)
    return folder


def write_jsonl(path: Path, count: int) -> Path:
    words = "the cat sat on the mat and the dog read many books".split()
    rows = [
        {
            "id": f"s{idx}",
            "source": " ".join(words[(idx + k) % len(words)] for k in range(1 + idx % 6)),
            "target": "le chat assis",
        }
        for idx in range(count)
    ]
    path.write_text("\n".join(json.dumps(row) for row in rows))
    return path


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "inseq_mixing.cli", "attribute-dataset", *args]


def stored_table(out: Path) -> pd.DataFrame:
    frame = load_run(out).to_pandas()
    keys = [key for key in ("id", "side", "generated_index", "context_index", "layer") if key in frame.columns]
    return frame.sort_values(keys).reset_index(drop=True)


def test_sigkill_then_resume_equals_an_uninterrupted_run(model_dir, tmp_path):
    data = write_jsonl(tmp_path / "data.jsonl", 60)
    args = [
        str(data),
        "--model",
        str(model_dir),
        "--method",
        "value_zeroing",
        "--batch-size",
        "1",
        "--id-column",
        "id",
    ]
    killed = tmp_path / "killed"
    process = subprocess.Popen(cli(*args, "--out", str(killed)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shards = killed / "shards"
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        if shards.is_dir() and len(list(shards.glob("batch-*.json"))) >= 3:  # an index is written after its shard
            break
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    partial = load_run(killed)  # a killed run leaves a valid store
    assert 3 <= len(partial) < 60, "the run must be killed half way"
    assert sorted(partial.ids()) == sorted(set(partial.ids()))
    resumed = subprocess.run(cli(*args, "--out", str(killed)), capture_output=True, text=True, check=True)
    assert f"{len(partial)} already stored" in resumed.stdout
    again = subprocess.run(cli(*args, "--out", str(killed)), capture_output=True, text=True, check=True)
    assert "nothing to do" in again.stdout
    whole = tmp_path / "whole"
    subprocess.run(cli(*args, "--out", str(whole)), capture_output=True, check=True)
    run = load_run(killed)
    assert len(run) == 60 and run.ids() == load_run(whole).ids()
    assert not list(shards.glob(".*"))  # no temporary file left behind by the finished runs
    pd.testing.assert_frame_equal(stored_table(killed), stored_table(whole), check_exact=True)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--source-column", "text"], "no source column"),
        (["--method", "foo"], "Unknown method"),
        (["--option", "rolout=true"], "Unknown option"),
        (["--model", "/nonexistent/model"], "Could not load model"),
    ],
)
def test_cli_user_errors_are_one_line_and_exit_2(model_dir, tmp_path, args, message):
    data = write_jsonl(tmp_path / "data.jsonl", 2)
    base = {"--model": str(model_dir), "--method": "alti", "--out": str(tmp_path / "out")}
    for key, value in zip(args[::2], args[1::2], strict=True):
        base[key] = value
    flat = [item for pair in base.items() for item in pair if not (pair[0] == "--option")]
    extra = ["--option", base["--option"]] if "--option" in base else []
    result = subprocess.run(cli(str(data), *flat, *extra), capture_output=True, text=True)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1


def test_cli_empty_and_unreadable_files(model_dir, tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "bad.csv").write_bytes(b"\xff\xfe\x00bad")
    for data in (tmp_path / "empty.jsonl", tmp_path / "bad.csv", tmp_path / "missing.parquet"):
        result = subprocess.run(
            cli(str(data), "--model", str(model_dir), "--method", "alti", "--out", str(tmp_path / "o")),
            capture_output=True,
            text=True,
        )
        assert result.returncode == 2 and result.stderr.startswith("error: ") and "Traceback" not in result.stderr


def free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def launcher_command(launcher: str) -> list[str]:
    """Two processes on this machine, meeting on a free local port."""
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                "--master_port", free_port()]  # fmt: skip
    # Accelerate's --cpu launcher starts one process; --multi_gpu starts torchrun's, which meet over gloo on a CPU.
    return [shutil.which("accelerate") or "accelerate", "launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_ip",
            "127.0.0.1", "--main_process_port", free_port()]  # fmt: skip


@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
def test_two_real_processes_write_one_store_equal_to_a_single_process_run(model_dir, tmp_path, launcher):
    """Two processes really ran (two ranks, two pids, each wrote shards) and their store equals one process's."""
    if launcher == "accelerate" and shutil.which("accelerate") is None:
        pytest.skip("accelerate's launcher is not installed")
    data = write_jsonl(tmp_path / "data.jsonl", 10)
    args = [str(data), "--model", str(model_dir), "--method", "alti_logit", "--batch-size", "2", "--id-column", "id"]
    launch = [*launcher_command(launcher), "-m", "inseq_mixing.cli", "attribute-dataset"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [*launch, *args, "--out", str(tmp_path / "two")]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    # a rank's own "error: ..." line first: the launcher's summary fills the end of stderr
    own_errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 0, "\n".join(own_errors) + "\n" + result.stderr[-2000:]
    assert "process 0 of 2" in result.stdout and "process 1 of 2" in result.stdout
    subprocess.run(cli(*args, "--out", str(tmp_path / "one")), capture_output=True, check=True, env=env)
    two, one = load_run(tmp_path / "two"), load_run(tmp_path / "one")
    writers = two.writers().values()
    assert {writer["rank"] for writer in writers} == {0, 1}, "both processes wrote shards"
    assert len({writer["pid"] for writer in writers}) == 2 and {writer["processes"] for writer in writers} == {2}
    assert two.processes == [2] and one.processes == [1]
    assert len(two) == 10 and two.ids() == one.ids()
    # same batches, so equal up to the order of float reductions in the threads of each process
    pd.testing.assert_frame_equal(stored_table(tmp_path / "two"), stored_table(tmp_path / "one"), rtol=1e-5, atol=1e-7)
    assert inseq_mixing.__version__ in json.dumps(two.manifest["versions"])


def test_a_dataset_runs_bar_says_what_it_does_and_moves_per_example_where_examples_go_one_by_one():
    """Inseq's own methods attribute a batch one example at a time: the bar moves after each (not once per batch),
    says when it generates targets, and the batch's count adds up when it is stored."""
    from inseq_mixing.runs import runner

    calls = []

    class Bar:
        def update(self, count):
            calls.append(count)

        def set_description(self, text):
            calls.append(text)

    model = load("marian", "saliency")
    examples = read_examples(rows_for("marian", generate=(1,))[:3], id_column="id")
    progress = runner._BatchProgress(Bar())
    rows = runner.attribute_batch(run_front_end(model), examples, {"attribute_target": True}, {}, progress)
    progress.done(len(rows))
    assert calls == ["generating 1 target(s)", "attributing", 1, 1, 1, 0, "attributing"]
