"""The run store never gives a silent wrong answer: snapshots, checksummed shards redone on resume, stray files,
whole-weight fingerprints, ids; and, drawn at random with Hypothesis, a run damaged or killed anywhere ends, once
resumed, equal to an uninterrupted one."""

import json
import warnings
from pathlib import Path

import inseq
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inseq_mixing.runs import DatasetInputError, RunStoreError, attribute_dataset, load_run, read_examples
from inseq_mixing.runs.store import RunStore, RunStoreWarning
from inseq_mixing.testing import WORDS, tiny_model, word_tokenizer

from .conftest import get_tiny

ENGLISH = WORDS[: WORDS.index("le")]


def make_rows(lengths: list[int], offset: int = 0) -> list[dict]:
    """Encoder–decoder rows of the given source lengths, with forced targets."""
    return [
        {
            "id": f"r{idx}",
            "source": " ".join(ENGLISH[(idx + offset + k) % len(ENGLISH)] for k in range(length)),
            "target": "le chat assis sur le tapis"[: 6 + 3 * (idx % 4)].strip(),
        }
        for idx, length in enumerate(lengths)
    ]


@pytest.fixture(scope="module")
def marian():
    return inseq.load_model(get_tiny("marian"), "alti_logit", tokenizer=word_tokenizer(seq2seq=True))


def run(model, rows, out: Path, batch_size: int = 2, **kwargs):
    return attribute_dataset(model, "alti_logit", rows, out, batch_size=batch_size, show_progress=False,
                             id_column="id", **kwargs)  # fmt: skip


def table(out: Path) -> pd.DataFrame:
    """Every stored score (and step score) of a run, in a fixed order."""
    stored = load_run(out)
    frame = stored.to_pandas().sort_values(["id", "side", "generated_index", "context_index"]).reset_index(drop=True)
    steps = {
        (example_id, name): stored[example_id].step_scores[name].tolist()
        for example_id in stored.ids()
        for name in stored[example_id].step_scores
    }
    return frame, steps


def test_a_run_opened_during_writes_reads_the_snapshot_it_opened(marian, tmp_path):
    """Shards written after a Run was opened (a run still going) never change what it returns for an id."""
    rows = make_rows([1, 7, 2, 6, 3, 5, 4, 8])
    out = tmp_path / "run"
    run(marian, rows, out, batch_size=2)
    whole = load_run(out)
    expected = {example_id: whole[example_id].source_attributions.clone() for example_id in whole.ids()}
    shards = sorted((out / "shards").glob("batch-*.parquet"))
    for shard in shards[:2]:  # the first batches (shortest examples, first in the data's order) are still to come
        shard.unlink()
    with pytest.warns(RunStoreWarning, match="no shard"):
        opened = load_run(out)
    assert len(opened) == len(rows) - 4
    run(marian, rows, out, batch_size=2)  # the missing shards are written while `opened` is open
    assert len(opened) == len(rows) - 4 and len(load_run(out)) == len(rows)
    for example_id in opened.ids():
        torch.testing.assert_close(opened[example_id].source_attributions, expected[example_id], equal_nan=True)
    assert [seq.source_attributions.shape for seq in opened] == [expected[i].shape for i in opened.ids()]


DAMAGES = {
    "truncated": (lambda shard, index: shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2]), "bytes"),
    "corrupted": (lambda shard, index: shard.write_bytes(_flip(shard.read_bytes())), "checksum"),
    "no index": (lambda shard, index: index.unlink(), "no index"),
    "no shard": (lambda shard, index: shard.unlink(), "no shard"),
    "unreadable index": (lambda shard, index: index.write_text("{not json"), "unreadable"),
}


def _flip(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_shard_is_reported_left_out_and_redone(marian, tmp_path, damage):
    rows = make_rows([3, 4, 5, 6, 2, 7])
    out, whole = tmp_path / "run", tmp_path / "whole"
    run(marian, rows, whole)
    run(marian, rows, out)
    store = RunStore(out)
    spoil, message = DAMAGES[damage]
    spoil(store.shard_path(1), store.index_path(1))
    with pytest.warns(RunStoreWarning, match=f"batch 1: .*{message}"):
        partial = load_run(out)  # the other examples still load
    assert len(partial) == len(rows) - 2 and not partial.complete and 1 in partial.damaged
    with pytest.warns(RunStoreWarning, match="redone"):
        summary = run(marian, rows, out)
    assert summary.attributed == 2 and 1 in summary.redone and "redid batch 1" in str(summary)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RunStoreWarning)  # nothing left to warn about
        assert load_run(out).complete
    pd.testing.assert_frame_equal(table(out)[0], table(whole)[0], check_exact=True)
    assert table(out)[1] == table(whole)[1]


def test_stray_files_are_ignored_with_a_warning(marian, tmp_path):
    rows = make_rows([3, 4, 5])
    out = tmp_path / "run"
    run(marian, rows, out)
    for name in ("notes.txt", "batch-7.parquet", ".DS_Store"):
        (out / "shards" / name).write_text("x")
    (out / "shards" / "old").mkdir()
    with pytest.warns(RunStoreWarning, match="not shards"):
        assert len(load_run(out)) == 3
    with pytest.warns(RunStoreWarning, match="not shards"):
        summary = run(marian, rows, out)
    assert summary.attributed == 0 and sorted(summary.stray) == [".DS_Store", "batch-7.parquet", "notes.txt", "old"]


def test_each_shard_index_names_its_writer_and_the_manifest_its_sessions(marian, tmp_path):
    rows = make_rows([3, 4, 5])
    out = tmp_path / "run"
    run(marian, rows, out)
    (out / "shards" / "batch-000001.json").unlink()
    with pytest.warns(RunStoreWarning):
        run(marian, rows, out)
    stored = load_run(out)
    assert stored.processes == [1, 1]  # two sessions of one process each
    index = json.loads((out / "shards" / "batch-000000.json").read_text())
    assert index["rank"] == 0 and index["processes"] == 1 and index["rows"] == 2 and len(index["ids"]) == 2
    assert set(stored.writers()) == {0, 1}


def test_changing_any_weight_changes_the_fingerprint(tmp_path):
    """A head ablated in the last layer (its value weights zeroed, past every parameter's first values) is a
    different model: resuming refuses instead of keeping the old scores."""
    tokenizer = word_tokenizer(seq2seq=True)
    model = tiny_model("marian", seed=0)
    rows = make_rows([3, 4, 5])
    out = tmp_path / "run"
    run(inseq.load_model(model, "alti_logit", tokenizer=tokenizer), rows, out)
    ablated = tiny_model("marian", seed=0)
    head = ablated.config.d_model // ablated.config.decoder_attention_heads
    with torch.no_grad():
        ablated.model.decoder.layers[-1].self_attn.v_proj.weight[-head:] = 0
    with pytest.raises(RunStoreError, match="model"):
        run(inseq.load_model(ablated, "alti_logit", tokenizer=tokenizer), rows, out)
    same = tiny_model("marian", seed=0)
    assert run(inseq.load_model(same, "alti_logit", tokenizer=tokenizer), rows, out).attributed == 0
    final_bias = tiny_model("marian", seed=0)  # a buffer, not a parameter
    final_bias.final_logits_bias[0, -1] += 1
    with pytest.raises(RunStoreError, match="model"):
        run(inseq.load_model(final_bias, "alti_logit", tokenizer=tokenizer), rows, out)


@pytest.mark.parametrize("value", [None, "", "  ", float("nan")])
def test_missing_ids_are_refused_naming_the_row(value):
    rows = [{"id": "a", "source": "x"}, {"id": value, "source": "y"}]
    with pytest.raises(DatasetInputError, match="Row 1 has no 'id' value"):
        read_examples(rows, id_column="id")


def test_an_older_store_is_loaded_but_not_resumed(marian, tmp_path):
    rows = make_rows([3, 4])
    out = tmp_path / "run"
    run(marian, rows, out)
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "format": 1}))
    for index in (out / "shards").glob("*.json"):
        index.unlink()
    assert len(load_run(out)) == 2  # format 1 has no shard index: every shard is read
    with pytest.raises(RunStoreError, match="earlier inseq-mixing"):
        run(marian, rows, out)


# ----- at random: damage or kill a run anywhere, resume, and compare with an uninterrupted run -----


class Killed(BaseException):
    """Stands for a kill: not an Exception, so nothing on the way catches it."""


def spoil(out: Path, action: str, batch: int) -> None:
    store = RunStore(out)
    shard, index = store.shard_path(batch), store.index_path(batch)
    if action == "stray":
        (out / "shards" / f"leftover-{batch}.tmp").write_text("x")
    elif shard.exists() and index.exists():
        DAMAGES[action][0](shard, index)


@settings(max_examples=8)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=7),
    batch_size=st.integers(1, 3),
    kill_after=st.integers(0, 4),
    torn_write=st.booleans(),
    damages=st.lists(st.tuples(st.sampled_from([*DAMAGES, "stray"]), st.integers(0, 6)), max_size=3),
)
def test_any_damage_or_kill_then_resume_equals_an_uninterrupted_run(
    marian, tmp_path_factory, lengths, batch_size, kill_after, torn_write, damages
):
    rows = make_rows(lengths, offset=len(lengths))
    folder = tmp_path_factory.mktemp("resume")
    whole, out = folder / "whole", folder / "out"
    run(marian, rows, whole, batch_size=batch_size)
    batches = -(-len(rows) // batch_size)

    write_shard, written = RunStore.write_shard, []

    def killed_write(self, batch, rows_, writer=None):
        if len(written) == kill_after:
            if torn_write:  # killed half-way through writing the shard: a temporary file is left behind
                (self.shards / f".batch-{batch:06d}.parquet.{'0' * 32}.tmp").write_bytes(b"PAR1")
            raise Killed
        written.append(batch)
        write_shard(self, batch, rows_, writer)

    RunStore.write_shard = killed_write
    try:
        run(marian, rows, out, batch_size=batch_size)
    except Killed:
        assert len(written) == kill_after < batches  # the kill landed mid-run
    else:
        assert kill_after >= batches
    finally:
        RunStore.write_shard = write_shard
    for action, batch in damages:
        spoil(out, action, batch % batches)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RunStoreWarning)
        run(marian, rows, out, batch_size=batch_size)
        resumed = load_run(out)
    assert resumed.complete and not resumed.damaged and resumed.ids() == load_run(whole).ids()
    pd.testing.assert_frame_equal(table(out)[0], table(whole)[0], check_exact=True)
    assert table(out)[1] == table(whole)[1]
    assert not list((out / "shards").glob(".batch-*.tmp")), "temporary files of redone batches are cleaned up"


def test_reading_a_runs_tables_imports_neither_torch_nor_inseq(marian, tmp_path):
    """``load_run(...).to_pandas()`` and ``step_scores_frame()`` in a fresh process: the same tables as here, and
    neither torch nor Inseq imported (they take tens of seconds to import on a loaded machine)."""
    import subprocess
    import sys

    run(marian, make_rows([3, 5, 4]), tmp_path / "run")
    script = (
        "import sys, inseq_mixing; run = inseq_mixing.load_run(sys.argv[1]); "
        "run.to_pandas().to_pickle(sys.argv[2]); run.step_scores_frame().to_pickle(sys.argv[3]); "
        "print(sorted(name for name in ('torch', 'inseq', 'transformers') if name in sys.modules))"
    )
    paths = [str(tmp_path / name) for name in ("scores.pkl", "steps.pkl")]
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "run"), *paths], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
    stored = load_run(tmp_path / "run")
    scores, steps = pd.read_pickle(paths[0]), pd.read_pickle(paths[1])
    assert len(scores) > 0 and "logit" in steps.columns
    pd.testing.assert_frame_equal(scores, stored.to_pandas())
    pd.testing.assert_frame_equal(steps, stored.step_scores_frame())
    first = stored.ids()[0]  # the tables hold the scores the Inseq sequence holds
    rows = steps[steps["id"] == first]
    assert rows["logit"].tolist() == pytest.approx(stored[first].step_scores["logit"].tolist())


def test_a_store_another_process_of_the_run_is_creating_is_not_taken_for_a_foreign_folder(tmp_path, monkeypatch):
    """Every process checks the folder while the main one creates the store: a manifest being written (its temporary
    file), or written between this process's two looks, is the run's own; any other file is refused."""
    store, manifest, keys = RunStore(tmp_path / "run"), {"format": 2, "model": "m"}, ("model",)
    store.root.mkdir()
    (store.root / f".manifest.json.{'a' * 32}.tmp").write_text("{")
    assert store.check(manifest, keys) is None
    store.write_manifest(manifest)
    reads = iter([None, manifest])  # not there at the first look, there at the second
    monkeypatch.setattr(store, "read_manifest", lambda: next(reads))
    assert store.check(manifest, keys) == manifest
    (store.root / "notes.txt").write_text("mine")
    monkeypatch.setattr(store, "read_manifest", lambda: None)
    with pytest.raises(RunStoreError, match="not a run store"):
        store.check(manifest, keys)
