"""The run's tables: one Parquet row per photo (OUT/predictions/<task>/) and per failure (OUT/failures/)."""

from __future__ import annotations

import pickle
import posixpath
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from ray.data import Datasink
from ray.data.block import Block, BlockAccessor

from sapiens2.batch.cluster.storage import Place

PREDICTIONS, FAILURES = "predictions", "failures"
RECORD = "record"  # the column that carries each finished row to the sink, packed
ROWS_PER_FILE = 1000  # rows gathered into one Parquet file (fewer when the run is smaller)
BASE_COLUMNS = pa.schema(
    [
        ("path", pa.string()),
        ("stem", pa.string()),  # the photo's output name under OUT, without suffix: people/astronaut
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("persons", pa.int32()),
        ("outputs", pa.list_(pa.string())),
        ("notes", pa.list_(pa.string())),
        ("model", pa.string()),
        ("nodes", pa.list_(pa.string())),
    ]
)
FAILURE_COLUMNS = pa.schema(
    [("path", pa.string()), ("task", pa.string()), ("stage", pa.string()), ("reason", pa.string())]
)
READ_STAGES = ("read", "decode")  # failures of the file itself, not of one task


def predictions_dir(out: Place, task: str) -> str:
    return out.join(PREDICTIONS, task)


def failures_dir(out: Place) -> str:
    return out.join(FAILURES)


def failure(path: str, task: str, stage: str, reason: str) -> dict[str, str]:
    return {"path": path, "task": task, "stage": stage, "reason": reason}


def packed(value: Any) -> bytes:
    """`value` as bytes, which Arrow carries untouched between stages: converted, a column of dicts would
    become one struct with every key of every row (a photo's record would gain a failure's `reason`), and
    objects such as a photo on its way would be refused, then pickled with a warning."""
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def unpacked(data: bytes) -> Any:
    """What `packed` made bytes of (written by this run's own stages)."""
    return pickle.loads(data)


def _array(values: Sequence[Any]) -> pa.Array:
    """A column of numpy arrays (any shape, one dtype) as nested lists, or of plain Python scalars."""
    first = next((value for value in values if value is not None), None)
    if not isinstance(first, np.ndarray):
        return pa.array(values)
    kind = pa.from_numpy_dtype(first.dtype)
    for _ in range(first.ndim):
        kind = pa.list_(kind)
    return pa.array([None if value is None else value.tolist() for value in values], type=kind)


def predictions_table(records: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Rows of photos as a table: the base columns, `seconds` per stage (a struct) and the task's columns."""
    columns = {field.name: pa.array([r[field.name] for r in records], field.type) for field in BASE_COLUMNS}
    stages = list(records[0]["seconds"])
    columns["seconds"] = pa.StructArray.from_arrays(
        [pa.array([r["seconds"].get(stage, 0.0) for r in records], pa.float64()) for stage in stages], stages
    )
    for name in records[0]["columns"]:
        columns[name] = _array([r["columns"][name] for r in records])
    return pa.table(columns)


def write_table(table: pa.Table, out: Place, folder: str, prefix: str) -> str:
    """Write one Parquet file into `folder` under a fresh name; locally under a hidden name first."""
    name = f"{prefix}-{uuid.uuid4().hex[:16]}.parquet"
    path = posixpath.join(folder, name)
    if not out.is_local:
        pq.write_table(table, path, filesystem=out.filesystem)
        return path
    out.filesystem.create_dir(folder, recursive=True)
    hidden = posixpath.join(folder, f".{name}.tmp")
    pq.write_table(table, hidden, filesystem=out.filesystem)
    out.filesystem.move(hidden, path)
    return path


def read_column(out: Place, folder: str, column: str) -> list[Any]:
    """One column of every Parquet file in `folder` (an empty list when there is none)."""
    info = out.filesystem.get_file_info(folder)
    if info.type != pafs.FileType.Directory:
        return []
    dataset = pads.dataset(folder, filesystem=out.filesystem, format="parquet")
    if column not in dataset.schema.names:  # no file (all removed by --overwrite)
        return []
    return dataset.to_table(columns=[column]).column(column).to_pylist()


def remove_files(out: Place, folder: str, prefix: str = "") -> None:
    """Delete the files of `folder` whose names start with `prefix`."""
    selector = pafs.FileSelector(folder, allow_not_found=True)
    for info in out.filesystem.get_file_info(selector):
        if info.type == pafs.FileType.File and posixpath.basename(info.path).startswith(prefix):
            out.filesystem.delete_file(info.path)


@dataclass
class Totals:
    """What the write tasks saw: photos, persons, files, failures and seconds per stage, summed."""

    photos: int = 0
    persons: int | None = None
    written: int = 0
    kept: int = 0
    failures: list[dict[str, str]] = field(default_factory=list)
    seconds: Counter = field(default_factory=Counter)
    nodes: Counter = field(default_factory=Counter)

    def add(self, other: Totals) -> None:
        self.photos += other.photos
        if other.persons is not None:
            self.persons = (self.persons or 0) + other.persons
        self.written += other.written
        self.kept += other.kept
        self.failures += other.failures
        self.seconds.update(other.seconds)
        self.nodes.update(other.nodes)


class TableSink(Datasink):
    """Writes each write task's rows as a Parquet file of predictions and one of failures, and sums them."""

    def __init__(self, out: Place, task: str, run_id: str) -> None:
        self.out, self.task, self.run_id = out, task, run_id
        self.totals = Totals()

    @property
    def min_rows_per_write(self) -> int:
        return ROWS_PER_FILE

    def write(self, blocks: Iterable[Block], ctx: Any) -> Totals:
        frames = [BlockAccessor.for_block(block).to_pandas() for block in blocks]
        records = [unpacked(record) for frame in frames for record in frame[RECORD]]
        photos = [record for record in records if "reason" not in record]
        failures = [record for record in records if "reason" in record]
        totals = Totals(failures=failures)
        if photos:
            folder = predictions_dir(self.out, self.task)
            write_table(predictions_table(photos), self.out, folder, self.run_id)
            totals.photos = len(photos)
            counts = [record["persons"] for record in photos if record["persons"] is not None]
            totals.persons = sum(counts) if counts else None
            totals.written = sum(record["written"] for record in photos)
            totals.kept = sum(len(record["outputs"]) - record["written"] for record in photos)
            for record in photos:
                totals.seconds.update(record["seconds"])
                totals.nodes.update(record["nodes"])
        if failures:
            table = pa.Table.from_pylist(failures, schema=FAILURE_COLUMNS)
            write_table(table, self.out, failures_dir(self.out), f"{self.task}-{self.run_id}")
        return totals

    def on_write_complete(self, write_result: Any) -> None:
        for totals in write_result.write_returns:
            self.totals.add(totals)
