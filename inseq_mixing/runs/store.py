"""The run store: a folder holding a manifest and one Parquet shard per attributed batch.

Layout::

    OUT/manifest.json          model fingerprint, method, options, data fingerprint, batching, package versions
    OUT/shards/batch-000012.parquet   one row per example of batch 12

A shard is written to a temporary name and renamed into place, so a shard is either complete or absent: a run killed
at any moment leaves a valid store, and a resumed run redoes exactly the batches that have no shard. Batches are
numbered over the whole dataset, so processes of a multi-process run never write the same shard.

A row keeps everything an Inseq ``FeatureAttributionSequenceOutput`` holds: the tokens and ids, the attribution
tensors (flattened, with their shapes; NaN marks causally impossible cells), step and sequence scores, the attributed
positions, and the number of extra dimensions (e.g. layers).
"""

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from inseq.data import FeatureAttributionOutput
from inseq.utils.typing import TokenWithId

from ..attr.base import MixingSequenceOutput, SignedMixingSequenceOutput

MANIFEST = "manifest.json"
SHARDS = "shards"
SEQUENCE_CLASSES = {cls.__name__: cls for cls in (MixingSequenceOutput, SignedMixingSequenceOutput)}

_TENSOR = pa.struct([("name", pa.string()), ("shape", pa.list_(pa.int64())), ("values", pa.list_(pa.float32()))])
SCHEMA = pa.schema(
    [
        ("index", pa.int64()),
        ("id", pa.string()),
        ("source_text", pa.string()),
        ("target_text", pa.string()),
        ("source_tokens", pa.list_(pa.string())),
        ("source_ids", pa.list_(pa.int64())),
        ("target_tokens", pa.list_(pa.string())),
        ("target_ids", pa.list_(pa.int64())),
        ("attr_pos_start", pa.int64()),
        ("attr_pos_end", pa.int64()),
        ("sequence_class", pa.string()),
        ("num_dimensions", pa.int64()),
        ("attributions", pa.list_(_TENSOR)),
        ("step_scores", pa.list_(_TENSOR)),
        ("sequence_scores", pa.list_(_TENSOR)),
    ]
)


class RunStoreError(ValueError):
    """The store cannot be used as asked (a different run's store, or not a store). The message says what to do."""


def _tensor_entries(tensors: dict) -> list[dict]:
    return [
        {"name": name, "shape": list(value.shape), "values": value.detach().float().cpu().reshape(-1).tolist()}
        for name, value in (tensors or {}).items()
        if value is not None
    ]


def _tensors(entries: list[dict]) -> dict[str, torch.Tensor]:
    return {
        entry["name"]: torch.tensor(entry["values"], dtype=torch.float32).reshape(entry["shape"]) for entry in entries
    }


def sequence_to_row(sequence, example, source_text: str, target_text: str) -> dict:
    """One stored row from an Inseq sequence output of ``example`` (a :class:`~.data.Example`)."""
    attributions = {"source": sequence.source_attributions, "target": sequence.target_attributions}
    return {
        "index": example.index,
        "id": example.id,
        "source_text": source_text,
        "target_text": target_text,
        "source_tokens": [token.token for token in sequence.source or []],
        "source_ids": [token.id for token in sequence.source or []],
        "target_tokens": [token.token for token in sequence.target],
        "target_ids": [token.id for token in sequence.target],
        "attr_pos_start": sequence.attr_pos_start,
        "attr_pos_end": sequence.attr_pos_end,
        "sequence_class": type(sequence).__name__,
        "num_dimensions": sequence._num_dimensions or 0,
        "attributions": _tensor_entries(attributions),
        "step_scores": _tensor_entries(sequence.step_scores),
        "sequence_scores": _tensor_entries(sequence.sequence_scores),
    }


def row_to_sequence(row: dict):
    """The Inseq sequence output stored in ``row`` (inverse of :func:`sequence_to_row`)."""
    attributions = _tensors(row["attributions"])
    cls = SEQUENCE_CLASSES.get(row["sequence_class"], MixingSequenceOutput)
    return cls(
        source=[TokenWithId(t, i) for t, i in zip(row["source_tokens"], row["source_ids"], strict=True)],
        target=[TokenWithId(t, i) for t, i in zip(row["target_tokens"], row["target_ids"], strict=True)],
        source_attributions=attributions.get("source"),
        target_attributions=attributions.get("target"),
        step_scores=_tensors(row["step_scores"]),
        sequence_scores=_tensors(row["sequence_scores"]),
        attr_pos_start=row["attr_pos_start"],
        attr_pos_end=row["attr_pos_end"],
        _num_dimensions=row["num_dimensions"],
    )


def write_atomically(path: Path, write) -> None:
    """Call ``write(temporary_path)``, then rename the result to ``path``: readers see all of it or nothing."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


class RunStore:
    """Reading and writing a run folder (see the module docstring)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.shards = self.root / SHARDS

    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST

    def read_manifest(self) -> dict | None:
        if not self.manifest_path.is_file():
            return None
        return json.loads(self.manifest_path.read_text())

    def open(self, manifest: dict, identity_keys: tuple[str, ...]) -> None:
        """Create the store with ``manifest``, or check that an existing one was made by the same run.

        Raises:
            RunStoreError: The folder holds another run's store (its ``identity_keys`` differ), or files that are not
                a store.
        """
        existing = self.read_manifest()
        if existing is None:
            if self.root.exists() and any(p.name != SHARDS for p in self.root.iterdir()):
                raise RunStoreError(f"{self.root} exists and is not a run store: choose an empty or new folder.")
            self.shards.mkdir(parents=True, exist_ok=True)
            text = json.dumps(manifest, indent=2, sort_keys=True)
            write_atomically(self.manifest_path, lambda path: path.write_text(text))
            return
        different = [key for key in identity_keys if existing.get(key) != manifest.get(key)]
        if different:
            details = "; ".join(
                f"{key}: store has {existing.get(key)!r}, this run {manifest.get(key)!r}" for key in different
            )
            raise RunStoreError(
                f"{self.root} holds a different run ({details}). Use another --out folder, or delete this one to "
                "start over."
            )
        self.shards.mkdir(parents=True, exist_ok=True)

    def shard_path(self, batch: int) -> Path:
        return self.shards / f"batch-{batch:06d}.parquet"

    def done_batches(self) -> set[int]:
        """Numbers of the batches whose shard is in place."""
        if not self.shards.is_dir():
            return set()
        return {int(path.stem.split("-")[1]) for path in self.shards.glob("batch-*.parquet")}

    def write_shard(self, batch: int, rows: list[dict]) -> None:
        table = pa.Table.from_pylist(rows, schema=SCHEMA)
        write_atomically(self.shard_path(batch), lambda path: pq.write_table(table, path))

    def read_table(self, columns: list[str] | None = None) -> pa.Table:
        paths = sorted(self.shards.glob("batch-*.parquet")) if self.shards.is_dir() else []
        if not paths:
            return SCHEMA.empty_table() if columns is None else SCHEMA.empty_table().select(columns)
        tables = [pq.read_table(path, columns=columns) for path in paths]
        table = pa.concat_tables(tables)
        order = np.argsort(np.asarray(table.column("index")), kind="stable") if "index" in table.column_names else None
        return table.take(order) if order is not None else table


class Run:
    """A stored run, loaded with :func:`load_run`.

    ``len(run)``, ``run.ids()`` (in the data's order), ``run[example_id]`` (an Inseq sequence output whose ``show()``
    and ``aggregate()`` work), ``iter(run)`` over the sequence outputs, :meth:`to_inseq` (one
    ``FeatureAttributionOutput``) and :meth:`to_pandas` (one row per score).
    """

    def __init__(self, root: str | Path):
        self.store = RunStore(root)
        self.manifest = self.store.read_manifest()
        if self.manifest is None:
            raise RunStoreError(f"{root} is not a run store (no {MANIFEST}); run attribute_dataset first.")
        self._index = {
            example_id: position
            for position, example_id in enumerate(self.store.read_table(["index", "id"])["id"].to_pylist())
        }
        self._rows: list[dict] | None = None

    def _all_rows(self) -> list[dict]:
        if self._rows is None:
            self._rows = self.store.read_table().to_pylist()
        return self._rows

    def __len__(self) -> int:
        return len(self._index)

    def ids(self) -> list[str]:
        """The ids of the stored examples, in the order of the data."""
        return list(self._index)

    @property
    def complete(self) -> bool:
        """Whether every example of the data is stored."""
        return len(self) == self.manifest["examples"]

    def __contains__(self, example_id) -> bool:
        return str(example_id) in self._index

    def __getitem__(self, example_id):
        key = str(example_id)
        if key not in self._index:
            raise KeyError(f"No example {example_id!r} in this run ({len(self)} examples; see run.ids()).")
        return row_to_sequence(self._all_rows()[self._index[key]])

    def __iter__(self) -> Iterator:
        return (row_to_sequence(row) for row in self._all_rows())

    def to_inseq(self) -> FeatureAttributionOutput:
        """All stored examples as one Inseq output, in the data's order."""
        info = {"attribution_method": self.manifest["method"], "model_name": self.manifest["model"]["name"]}
        return FeatureAttributionOutput(sequence_attributions=list(self), info=info)

    def to_pandas(self):
        """One row per (example, generated token, context token[, layer]) score.

        Columns: ``id``, ``generated_index`` (0-based among attributed tokens), ``generated_token``, ``side``
        (``source`` or ``target``), ``context_index``, ``context_token``, ``layer`` (per-layer methods only) and
        ``score``. Causally impossible cells (NaN) are left out.
        """
        import pandas as pd

        frames = [frame for row in self._all_rows() for frame in _score_frames(row)]
        if not frames:
            return pd.DataFrame(
                columns=["id", "generated_index", "generated_token", "side", "context_index", "context_token", "score"]
            )
        return pd.concat(frames, ignore_index=True)


@dataclass
class _Side:
    name: str
    tokens: list[str]


def _score_frames(row: dict) -> Iterator:
    import pandas as pd

    attributions = _tensors(row["attributions"])
    generated = row["target_tokens"][row["attr_pos_start"] : row["attr_pos_end"]]
    sides = (_Side("source", row["source_tokens"]), _Side("target", row["target_tokens"]))
    for side in sides:
        scores = attributions.get(side.name)
        if scores is None:
            continue
        values = scores.numpy()
        cells = np.indices(values.shape).reshape(values.ndim, -1)
        flat = values.reshape(-1)
        keep = ~np.isnan(flat)
        cells, flat = cells[:, keep], flat[keep]
        frame = {
            "id": row["id"],
            "generated_index": cells[1],
            "generated_token": np.asarray(generated, dtype=object)[cells[1]],
            "side": side.name,
            "context_index": cells[0],
            "context_token": np.asarray(side.tokens, dtype=object)[cells[0]],
        }
        for axis in range(2, values.ndim):
            frame["layer" if axis == 2 else f"dim_{axis}"] = cells[axis]
        frame["score"] = flat
        yield pd.DataFrame(frame)


def load_run(out: str | Path) -> Run:
    """Open the run stored in ``out`` by :func:`~inseq_mixing.attribute_dataset`."""
    return Run(out)
