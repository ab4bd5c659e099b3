"""The run store: a folder holding a manifest and one Parquet shard per attributed batch, each with a small index.

Layout::

    OUT/manifest.json                  model fingerprint, method, options, data fingerprint, batching, versions, the
                                       processes of every session that wrote the run
    OUT/shards/batch-000012.parquet    one row per example of batch 12
    OUT/shards/batch-000012.json       the shard's index: its size in bytes, SHA-256, rows, ids, and the rank, process
                                       count, host and pid of the process that wrote it

A shard is written to a temporary name and renamed into place; its index is written (the same way) after the shard
is in place. A shard counts only when its index is there and its size and checksum match: a run killed at any moment
leaves a valid store (a shard without its index is a partial write), a truncated or corrupted shard is found and
reported, and a resumed run redoes exactly the batches without a valid shard. Other files in the shards folder are
ignored with a warning. Batches are numbered over the whole dataset, so processes of a multi-process run never write
the same shard.

A :class:`Run` reads a snapshot: the valid shards present when it was opened, each read by name and checked against
its index, so shards written while it is open (a run still going) never change what it returns.

A row keeps everything an Inseq ``FeatureAttributionSequenceOutput`` holds: the tokens and ids, the attribution
tensors (flattened, with their shapes; NaN marks causally impossible cells), step and sequence scores, the attributed
positions, and the number of extra dimensions (e.g. layers); and what the example was given: its source and target
texts (a speech model's source: the audio file) and a speech utterance's word intervals (``words``, JSON; shards
written before it have no such column and read as None).
"""

import functools
import hashlib
import json
import os
import re
import socket
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

MANIFEST = "manifest.json"
SHARDS = "shards"
#: Version of the store layout: 2 adds each shard's index (size, checksum, writer).
FORMAT = 2
#: A manifest being written (:func:`write_atomically`'s temporary name).
MANIFEST_WRITE = re.compile(r"^\.manifest\.json\.[0-9a-f]{32}\.tmp$")
SHARD_NAME = re.compile(r"^batch-(\d{6,})\.(parquet|json)$")
TEMPORARY_NAME = re.compile(r"^\.batch-(\d{6,})\.(parquet|json)\.[0-9a-f]{32}\.tmp$")

#: A tensor: its values in float32, or, for a float64 tensor (a float64 model's scores), in ``values64`` (null
#: otherwise; shards written before it have no such field and read as float32).
_TENSOR = pa.struct(
    [
        ("name", pa.string()),
        ("shape", pa.list_(pa.int64())),
        ("values", pa.list_(pa.float32())),
        ("values64", pa.list_(pa.float64())),
    ]
)
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
        ("words", pa.string()),
    ]
)


class RunStoreError(ValueError):
    """The store cannot be used as asked (a different run's store, or not a store). The message says what to do."""


def _tensor_entries(tensors: dict) -> list[dict]:
    entries = []
    for name, value in (tensors or {}).items():
        if value is None:
            continue
        values = value.detach().cpu().reshape(-1)
        wide = str(values.dtype) == "torch.float64"
        entries.append({"name": name, "shape": list(value.shape), "values": None if wide else values.float().tolist(),
                        "values64": values.tolist() if wide else None})  # fmt: skip
    return entries


def _arrays(entries: list[dict]) -> dict[str, np.ndarray]:
    """The stored tensors as NumPy arrays (float64 where they were, float32 otherwise): what the tables read, with
    neither torch nor Inseq imported."""
    arrays = {}
    for entry in entries:
        wide = entry.get("values64") is not None
        values = entry["values64"] if wide else entry["values"]
        arrays[entry["name"]] = np.asarray(values, dtype=np.float64 if wide else np.float32).reshape(entry["shape"])
    return arrays


def _tensors(entries: list[dict]) -> dict:
    import torch

    return {name: torch.from_numpy(array) for name, array in _arrays(entries).items()}


@functools.cache
def _sequence_classes() -> tuple[dict, tuple]:
    """Inseq's sequence classes by name, and the ones that carry a number of extra dimensions (the plugin's)."""
    from inseq.data.attribution import (
        CoarseFeatureAttributionSequenceOutput,
        FeatureAttributionSequenceOutput,
        GranularFeatureAttributionSequenceOutput,
    )

    from ..frontends.sequences import MixingSequenceOutput, SignedMixingSequenceOutput

    classes = (MixingSequenceOutput, SignedMixingSequenceOutput, FeatureAttributionSequenceOutput,
               GranularFeatureAttributionSequenceOutput, CoarseFeatureAttributionSequenceOutput)  # fmt: skip
    return {cls.__name__: cls for cls in classes}, (MixingSequenceOutput, SignedMixingSequenceOutput)


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
        "num_dimensions": getattr(sequence, "_num_dimensions", None) or 0,
        "attributions": _tensor_entries(attributions),
        "step_scores": _tensor_entries(sequence.step_scores),
        "sequence_scores": _tensor_entries(sequence.sequence_scores),
        "words": _words(example.words),
    }


def _words(words) -> str | None:
    """A row's word intervals (speech) or image paths (vision-language models) as JSON, or None."""
    if words is None:
        return None
    return json.dumps([word if isinstance(word, str) else list(word) for word in words])


def row_to_sequence(row: dict):
    """The Inseq sequence output stored in ``row`` (inverse of :func:`sequence_to_row`)."""
    from inseq.utils.typing import TokenWithId

    attributions = _tensors(row["attributions"])
    classes, multidimensional = _sequence_classes()
    cls = classes.get(row["sequence_class"], multidimensional[0])
    extra = {"_num_dimensions": row["num_dimensions"]} if issubclass(cls, multidimensional) else {}
    return cls(
        source=[TokenWithId(t, i) for t, i in zip(row["source_tokens"], row["source_ids"], strict=True)],
        target=[TokenWithId(t, i) for t, i in zip(row["target_tokens"], row["target_ids"], strict=True)],
        source_attributions=attributions.get("source"),
        target_attributions=attributions.get("target"),
        step_scores=_tensors(row["step_scores"]),
        sequence_scores=_tensors(row["sequence_scores"]),
        attr_pos_start=row["attr_pos_start"],
        attr_pos_end=row["attr_pos_end"],
        **extra,
    )


class RunStoreWarning(UserWarning):
    """Something in a store was skipped: a damaged or partial shard (redone on resume), or a stray file."""


def write_atomically(path: Path, write) -> None:
    """Call ``write(temporary_path)``, then rename the result to ``path``: readers see all of it or nothing."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def file_digest(data: bytes | Path) -> str:
    """SHA-256 (hex) of a file's bytes, or of ``data``."""
    if isinstance(data, bytes):
        return hashlib.sha256(data).hexdigest()
    digest = hashlib.sha256()
    with data.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class Writer:
    """Who writes shards: the process's rank among ``processes``, its host and pid (recorded in each shard's index)."""

    rank: int = 0
    processes: int = 1
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)


@dataclass
class ShardScan:
    """What a scan of the shards folder found.

    Attributes:
        valid: Batch number → the shard's index (size, checksum, rows, ids, writer), for shards that match it.
        damaged: Batch number → why its shard cannot be used (partial write, truncated, corrupted, unreadable index).
        stray: Files in the shards folder that are not shards (ignored).
    """

    valid: dict[int, dict] = field(default_factory=dict)
    damaged: dict[int, str] = field(default_factory=dict)
    stray: list[str] = field(default_factory=list)

    def warn(self, root: Path, resume_hint: str) -> None:
        """One warning per kind of problem, naming the files."""
        if self.damaged:
            listed = "; ".join(f"batch {batch}: {reason}" for batch, reason in sorted(self.damaged.items()))
            warnings.warn(f"{root}: {len(self.damaged)} shard(s) cannot be used ({listed}); {resume_hint}",
                          RunStoreWarning, stacklevel=3)  # fmt: skip
        if self.stray:
            warnings.warn(f"{root}: ignoring {len(self.stray)} file(s) that are not shards: {self.stray}",
                          RunStoreWarning, stacklevel=3)  # fmt: skip


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
        try:
            return json.loads(self.manifest_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise RunStoreError(
                f"{self.manifest_path} is not readable JSON ({error}): is this a run store?"
            ) from error

    def write_manifest(self, manifest: dict) -> None:
        text = json.dumps(manifest, indent=2, sort_keys=True)
        write_atomically(self.manifest_path, lambda path: path.write_text(text))

    def check(self, manifest: dict, identity_keys: tuple[str, ...]) -> dict | None:
        """Check that the folder is empty, new, or a store made by the same run (every process of a run calls this).

        Returns:
            The existing manifest, or None if there is no store yet.

        Raises:
            RunStoreError: The folder holds another run's store (its ``identity_keys`` differ), a store of an older
                format, or files that are not a store.
        """
        existing = self.read_manifest()
        if existing is None:
            # only what a store's own writes leave (another process of this run may be creating it right now)
            names = [path.name for path in self.root.iterdir()] if self.root.exists() else []
            if all(name in (SHARDS, MANIFEST) or MANIFEST_WRITE.match(name) for name in names):
                existing = self.read_manifest()  # written meanwhile by the main process of this run, or still none
                if existing is None:
                    return None
            else:
                raise RunStoreError(f"{self.root} exists and is not a run store: choose an empty or new folder.")
        if existing.get("format") != manifest.get("format"):
            raise RunStoreError(
                f"{self.root} was written by an earlier inseq-mixing (store format {existing.get('format')}, this "
                f"one writes format {manifest.get('format')}: checksummed shards). Load it with load_run, and use "
                "another --out folder for this run."
            )
        different = [key for key in identity_keys if existing.get(key) != manifest.get(key)]
        if different:
            details = "; ".join(
                f"{key}: store has {existing.get(key)!r}, this run {manifest.get(key)!r}" for key in different
            )
            raise RunStoreError(
                f"{self.root} holds a different run ({details}). Use another --out folder, or delete this one to "
                "start over."
            )
        return existing

    def open(self, manifest: dict, identity_keys: tuple[str, ...], processes: int = 1) -> None:
        """:meth:`check`, then create the store (or keep the existing one) and record this session's number of
        processes in the manifest's ``sessions`` (the main process of a run calls this once)."""
        existing = self.check(manifest, identity_keys)
        self.shards.mkdir(parents=True, exist_ok=True)
        base = existing or manifest
        self.write_manifest({**base, "sessions": [*base.get("sessions", []), {"processes": processes}]})

    def shard_path(self, batch: int) -> Path:
        return self.shards / f"batch-{batch:06d}.parquet"

    def index_path(self, batch: int) -> Path:
        return self.shards / f"batch-{batch:06d}.json"

    def scan(self, checksums: bool = True) -> ShardScan:
        """Check every shard against its index (``checksums=False``: size only; for stores of format 1, which have
        no index, every shard counts)."""
        scan = ShardScan()
        if not self.shards.is_dir():
            return scan
        batches = set()
        for path in sorted(self.shards.iterdir()):
            match = SHARD_NAME.match(path.name)
            if match and path.is_file():
                batches.add(int(match.group(1)))
            elif not TEMPORARY_NAME.match(path.name):  # temporary files of a killed write are not stray
                scan.stray.append(path.name)
        unindexed = (self.read_manifest() or {}).get("format", 1) < 2
        for batch in sorted(batches):
            if unindexed:
                if self.shard_path(batch).is_file():
                    scan.valid[batch] = {"bytes": self.shard_path(batch).stat().st_size, "sha256": None}
                continue
            index, reason = self._check(batch, checksums)
            if reason is None:
                scan.valid[batch] = index
            else:
                scan.damaged[batch] = reason
        return scan

    def _check(self, batch: int, checksums: bool) -> tuple[dict | None, str | None]:
        shard, index_path = self.shard_path(batch), self.index_path(batch)
        if not shard.is_file():
            return None, "its index has no shard (an interrupted write)"
        if not index_path.is_file():
            return None, "the shard has no index (an interrupted write)"
        try:
            index = json.loads(index_path.read_text())
            size, digest = int(index["bytes"]), str(index["sha256"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return None, "its index is unreadable"
        actual = shard.stat().st_size
        if actual != size:
            return None, f"{actual} bytes where its index says {size} (truncated or overwritten)"
        if checksums and file_digest(shard) != digest:
            return None, "its checksum does not match its index (corrupted)"
        return index, None

    def write_shard(self, batch: int, rows: list[dict], writer: Writer | None = None) -> None:
        """Write batch ``batch``'s shard, then its index (size, checksum, rows, ids, writer); an old shard or index of
        the batch (a damaged one being redone) is replaced, and temporary files left by a killed write removed."""
        writer = writer or Writer()
        for stale in self.shards.glob(f".batch-{batch:06d}.*.tmp"):
            stale.unlink(missing_ok=True)
        self.index_path(batch).unlink(missing_ok=True)
        table = pa.Table.from_pylist(rows, schema=SCHEMA)
        table = table.replace_schema_metadata({"inseq_mixing.rank": str(writer.rank),
                                               "inseq_mixing.processes": str(writer.processes)})  # fmt: skip
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        data = sink.getvalue().to_pybytes()
        write_atomically(self.shard_path(batch), lambda path: path.write_bytes(data))
        index = {
            "batch": batch,
            "bytes": len(data),
            "sha256": file_digest(data),
            "rows": len(rows),
            "ids": [row["id"] for row in rows],
            "rank": writer.rank,
            "processes": writer.processes,
            "host": writer.host,
            "pid": writer.pid,
        }
        write_atomically(self.index_path(batch), lambda path: path.write_text(json.dumps(index)))

    def read_shard(self, batch: int, index: dict, columns: list[str] | None = None, verify: bool = True) -> pa.Table:
        """Batch ``batch``'s shard, read by name and checked against ``index`` (taken when the run was opened;
        ``verify=False`` right after :meth:`scan` checked it).

        Raises:
            RunStoreError: The shard changed or was damaged since.
        """
        if not verify:
            return pq.read_table(self.shard_path(batch), columns=columns)
        data = self.shard_path(batch).read_bytes() if self.shard_path(batch).is_file() else b""
        if len(data) != index["bytes"] or (index["sha256"] is not None and file_digest(data) != index["sha256"]):
            raise RunStoreError(
                f"{self.shard_path(batch)} changed or was damaged after the run was opened: load_run it again."
            )
        return pq.read_table(pa.BufferReader(data), columns=columns)


class Run:
    """A stored run, loaded with :func:`load_run`: a snapshot of the valid shards present when it was opened.

    ``len(run)``, ``run.ids()`` (in the data's order), ``run[example_id]`` (an Inseq sequence output whose ``show()``
    and ``aggregate()`` work), ``iter(run)`` over the sequence outputs, :meth:`to_inseq` (one
    ``FeatureAttributionOutput``) and :meth:`to_pandas` (one row per score). ``run.damaged`` names the shards left out
    (redo them by resuming the run), ``run.processes`` the number of processes of each session that wrote it.
    """

    def __init__(self, root: str | Path):
        self.store = RunStore(root)
        self.manifest = self.store.read_manifest()
        if self.manifest is None:
            raise RunStoreError(f"{root} is not a run store (no {MANIFEST}); run attribute_dataset first.")
        scan = self.store.scan()
        scan.warn(self.store.root, "their examples are left out; resume the run with the same command to redo them")
        self.damaged = dict(scan.damaged)
        self._shards = scan.valid
        located = []  # (data index, id, batch, row in shard)
        for batch, index in self._shards.items():
            table = self.store.read_shard(batch, index, ["index", "id"], verify=False)  # scan() just checked it
            for row, (position, example_id) in enumerate(
                zip(table["index"].to_pylist(), table["id"].to_pylist(), strict=True)
            ):
                located.append((position, example_id, batch, row))
        located.sort()
        self._where = {example_id: (batch, row) for _, example_id, batch, row in located}
        self._cache: dict[int, list[dict]] = {}

    def _shard_rows(self, batch: int) -> list[dict]:
        if batch not in self._cache:
            self._cache[batch] = self.store.read_shard(batch, self._shards[batch]).to_pylist()
        return self._cache[batch]

    def _row(self, example_id: str) -> dict:
        batch, row = self._where[example_id]
        return self._shard_rows(batch)[row]

    def _all_rows(self) -> Iterator[dict]:
        return (self._row(example_id) for example_id in self._where)

    def __len__(self) -> int:
        return len(self._where)

    def ids(self) -> list[str]:
        """The ids of the stored examples, in the order of the data."""
        return list(self._where)

    @property
    def complete(self) -> bool:
        """Whether every example of the data is stored (and no shard is damaged)."""
        return len(self) == self.manifest["examples"]

    @property
    def processes(self) -> list[int]:
        """The number of processes of each session (first run, then each resume) that wrote this run."""
        return [session["processes"] for session in self.manifest.get("sessions", [])]

    def writers(self) -> dict[int, dict]:
        """Batch number → the process that wrote its shard (``rank``, ``processes``, ``host``, ``pid``)."""
        keys = ("rank", "processes", "host", "pid")
        return {batch: {key: index.get(key) for key in keys} for batch, index in self._shards.items()}

    def __repr__(self) -> str:
        damaged = f", {len(self.damaged)} damaged shard(s) left out" if self.damaged else ""
        return (
            f"Run({str(self.store.root)!r}: {self.manifest['method']} on "
            f"{self.manifest['model']['name'] or self.manifest['model']['class']}, "
            f"{len(self)} of {self.manifest['examples']} examples stored{damaged})"
        )

    def __contains__(self, example_id) -> bool:
        return str(example_id) in self._where

    def _key(self, example_id) -> str:
        key = str(example_id)
        if key not in self._where:
            raise KeyError(f"No example {example_id!r} in this run ({len(self)} examples; see run.ids()).")
        return key

    def __getitem__(self, example_id):
        return row_to_sequence(self._row(self._key(example_id)))

    def __iter__(self) -> Iterator:
        return (row_to_sequence(row) for row in self._all_rows())

    def inputs(self, example_id) -> dict:
        """What example ``example_id`` was given: ``source_text`` (a speech model's: its audio file), ``target_text``
        (the given target, or what the model produced) and ``words`` (a speech utterance's word intervals, or
        None)."""
        row = self._row(self._key(example_id))
        words = row.get("words")
        return {"source_text": row["source_text"], "target_text": row["target_text"],
                "words": None if words is None else json.loads(words)}  # fmt: skip

    def to_inseq(self):
        """All stored examples as one Inseq ``FeatureAttributionOutput``, in the data's order: ``show()``,
        ``aggregate()``, ``save()`` and the rest of Inseq work on it as on ``model.attribute``'s output."""
        from inseq.data import FeatureAttributionOutput

        info = {"attribution_method": self.manifest["method"], "model_name": self.manifest["model"]["name"]}
        return FeatureAttributionOutput(sequence_attributions=list(self), info=info)

    def to_pandas(self):
        """One row per (example, generated token, context token[, layer]) score.

        Columns: ``id``, ``generated_index`` (0-based among attributed tokens), ``generated_token``, ``side``
        (``source`` or ``target``), ``context_index``, ``context_token``, ``layer`` (per-layer methods only) and
        ``score``; Inseq's gradient methods have ``embedding_dim`` instead of ``layer``. Causally impossible cells
        (NaN) are left out. The per-token step scores (the explained ``logit``, the ``unattributed_*`` terms that
        complete it, ...) are in :meth:`step_scores_frame`.
        """
        import pandas as pd

        frames = [frame for row in self._all_rows() for frame in _score_frames(row)]
        if not frames:
            return pd.DataFrame(
                columns=["id", "generated_index", "generated_token", "side", "context_index", "context_token", "score"]
            )
        return pd.concat(frames, ignore_index=True)

    def step_scores_frame(self):
        """One row per (example, generated token): ``id``, ``generated_index``, ``generated_token`` and one column per
        step score (``logit`` or ``contrast_logits_diff``, each ``unattributed_*`` term, ...). With :meth:`to_pandas`,
        a logit method's completeness can be checked from the tables: per generated token, the sum of its scores plus
        its ``unattributed_*`` columns is its ``logit``."""
        import pandas as pd

        frames = []
        for row in self._all_rows():
            steps = _arrays(row["step_scores"])
            generated = row["target_tokens"][row["attr_pos_start"] : row["attr_pos_end"]]
            count = max([len(generated), *(len(value) for value in steps.values())])
            frame = {"id": [row["id"]] * count, "generated_index": list(range(count)), "generated_token": generated}
            frame.update({name: value if value.ndim == 1 else list(value) for name, value in steps.items()})
            frames.append(pd.DataFrame(frame))
        columns = ["id", "generated_index", "generated_token"]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


@dataclass
class _Side:
    name: str
    tokens: list[str]


def _score_frames(row: dict) -> Iterator:
    import pandas as pd

    attributions = _arrays(row["attributions"])
    generated = row["target_tokens"][row["attr_pos_start"] : row["attr_pos_end"]]
    sides = (_Side("source", row["source_tokens"]), _Side("target", row["target_tokens"]))
    for side in sides:
        values = attributions.get(side.name)
        if values is None:
            continue
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
        granular = row["sequence_class"].startswith("Granular")  # Inseq's gradient methods: per embedding dimension
        for axis in range(2, values.ndim):
            frame[("embedding_dim" if granular else "layer") if axis == 2 else f"dim_{axis}"] = cells[axis]
        frame["score"] = flat
        yield pd.DataFrame(frame)


def is_run_folder(value) -> bool:
    """Whether ``value`` names a folder holding a run store (its manifest), rather than a model or a data file."""
    return isinstance(value, str | Path) and (Path(value) / MANIFEST).is_file()


def load_run(out: str | Path) -> Run:
    """Open the run stored in ``out`` by :func:`~inseq_mixing.attribute_dataset`."""
    return Run(out)
