"""The measurement dataset: schema, atomic append, resume, and a checked loader.

A dataset is a folder of Parquet parts. Each append writes one part to a temporary name and
renames it into place, so a killed run leaves whole parts only; re-running the same command
skips what the parts already hold. The tuner writes it, the models read it: this module is
the contract between them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import fields
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..artifacts import write_atomic
from ..errors import ArtifactError
from ..space.config import KernelConfig
from ..space.problem import GemmProblem, GroupedProblem, ProblemError

# 2: grouped (MoE expert) GEMMs: experts, gemm and the rows' split among the experts; the
# dense columns batch, a_major and b_major are null on their rows. A part of version 1 reads
# as version 2 with those columns null.
# 3: parts store the STORED_F32 columns as float32 and the timestamp as integer milliseconds
# (a third fewer bytes: seven digits are far below the timing noise); ``load`` reads every
# version back in the schema's types.
SCHEMA_VERSION = 3
ADDED_IN = {2: ("experts", "gemm", "expert_counts"), 3: ()}
STORED_F32 = ("compile_s", "time_ms", "time_ms_p20", "time_ms_p80", "rel_err")

PROBLEM_COLUMNS = ("arch", "m", "n", "k", "batch", "dtype", "out_dtype", "a_major", "b_major")
CONFIG_COLUMNS = tuple(f.name for f in fields(KernelConfig))

SCHEMA = pa.schema([
    ("schema_version", pa.int16()),
    ("run_id", pa.string()),
    ("timestamp", pa.float64()),
    # environment
    ("device_name", pa.string()),
    ("sm_count", pa.int32()),
    ("driver", pa.string()),
    ("cuda", pa.string()),
    ("torch_version", pa.string()),
    ("cutlass_dsl_version", pa.string()),
    ("quack_version", pa.string()),
    # problem
    ("problem_key", pa.string()),
    ("suite", pa.string()),
    ("arch", pa.string()),
    ("m", pa.int64()), ("n", pa.int64()), ("k", pa.int64()), ("batch", pa.int32()),
    ("dtype", pa.string()), ("out_dtype", pa.string()),
    ("a_major", pa.string()), ("b_major", pa.string()),
    ("experts", pa.int32()), ("gemm", pa.string()),
    # what ran: backend "quack" with a config, or "cublas" (torch.mm) with null config columns
    ("backend", pa.string()),
    ("config_key", pa.string()),
    ("tile_m", pa.int32()), ("tile_n", pa.int32()), ("pingpong", pa.bool_()),
    ("cluster_m", pa.int32()), ("cluster_n", pa.int32()), ("swap_ab", pa.bool_()),
    ("max_swizzle_size", pa.int32()), ("split_k", pa.int32()),
    ("is_dynamic_persistent", pa.bool_()),
    # outcome
    ("status", pa.string()),  # ok | compile_error | runtime_error | wrong_result | timeout | crash
    ("error", pa.string()),
    ("compile_s", pa.float64()),
    ("time_ms", pa.float64()),       # median
    ("time_ms_p20", pa.float64()),
    ("time_ms_p80", pa.float64()),
    ("n_reps", pa.int32()),
    ("rel_err", pa.float64()),
    ("expert_counts", pa.string()),  # grouped: the JSON list of rows (or K) per expert
])


class DatasetError(ArtifactError):
    """A dataset folder or part that cannot be read as a cutetune dataset."""


def problem_of(row) -> GemmProblem | GroupedProblem:
    """The problem a dataset row measured (sizes come back from Parquet as ints); DatasetError
    naming it where this cutetune's rules reject it (measured before a rule said so)."""
    try:
        if row.get("experts") is not None:
            return GroupedProblem(int(row["experts"]), int(row["m"]), int(row["n"]),
                                  int(row["k"]), gemm=row["gemm"], dtype=row["dtype"],
                                  out_dtype=row["out_dtype"], arch=row["arch"])
        return GemmProblem(**{c: (int(row[c]) if c in ("m", "n", "k", "batch") else row[c])
                              for c in PROBLEM_COLUMNS})
    except ProblemError as e:
        named = row.get("problem_key") or {c: row.get(c) for c in PROBLEM_COLUMNS}
        raise DatasetError(f"dataset rows of {named} measure a problem this cutetune rejects "
                           f"({e}); drop them from the dataset") from None


# What makes a measurement unique in a dataset: problem, backend, config and, for a grouped
# problem, how its rows split among the experts (``routing_text``; null for a dense one).
KEY_COLUMNS = ("problem_key", "backend", "config_key", "expert_counts")


def routing_text(counts) -> str | None:
    """The ``expert_counts`` value of a grouped problem's split (None: a dense problem)."""
    return None if counts is None else json.dumps([int(c) for c in counts])


def measurement_key(problem_key: str, backend: str, config_key: str = "",
                    routing: str | None = None) -> tuple:
    """A row's KEY_COLUMNS values (``done_keys`` holds these): "" for the baseline's config,
    ``routing_text`` of a grouped problem's split."""
    return (problem_key, backend, config_key, routing)


def row_key(row: dict) -> tuple:
    """``measurement_key`` of a row, as measured (a dense row may lack expert_counts until
    ``append`` writes it) or loaded."""
    return measurement_key(row["problem_key"], row["backend"], row["config_key"],
                           row.get("expert_counts"))


def problem_identity(problem_key: str, routing: str | None) -> str:
    """What a measured problem is: its key and, for a grouped one, its routing (the same
    shape under two routings is two problems: its configs ran on other work). Identities
    sort as (key, routing) pairs do."""
    return problem_key if routing is None else f"{problem_key}\x01{routing}"


def append(path: str | os.PathLike, rows: list[dict]) -> Path | None:
    """Append ``rows`` as one new part, atomically (write a temporary file, then rename)."""
    if not rows:
        return None
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DatasetError(f"cannot create dataset folder {folder}: {e}") from e
    full = [{**{f.name: None for f in SCHEMA}, "schema_version": SCHEMA_VERSION, **r} for r in rows]
    table = pa.Table.from_pylist(full, schema=SCHEMA)
    return _write_part(folder, len(list(folder.glob("part-*.parquet"))), table)


DIGEST_CHARS = 16  # of the sha256 of a part's bytes, in its name


def _write_part(folder: Path, index: int, table: pa.Table, level: int = 3) -> Path:
    """Write a part atomically (``cutetune.artifacts.write_atomic``): serialized in memory,
    so a full disk is an OutputError naming the part, and no temporary file stays. Its name
    ends in its bytes' digest, which ``load`` checks: a damaged byte anywhere in it is
    refused, not read as another time. Stored as version 3 has it (see SCHEMA_VERSION), the
    floats byte-split and the timestamps delta-coded before zstd at ``level``."""
    for name in STORED_F32:
        table = table.set_column(table.schema.get_field_index(name), name,
                                 table.column(name).cast(pa.float32()))
    when = table.column("timestamp")  # a non-finite one (another tool's) is stored as null
    ms = pc.round(pc.multiply(pc.if_else(pc.is_finite(when), when, None), 1000.0))
    table = table.set_column(table.schema.get_field_index("timestamp"), "timestamp",
                             ms.cast(pa.int64()))
    table = table.set_column(table.schema.get_field_index("schema_version"), "schema_version",
                             pa.array([SCHEMA_VERSION] * len(table), pa.int16()))
    coded = {**{n: "BYTE_STREAM_SPLIT" for n in STORED_F32}, "timestamp": "DELTA_BINARY_PACKED"}
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", compression_level=level,
                   use_dictionary=[n for n in table.column_names if n not in coded],
                   column_encoding=coded)
    raw = sink.getvalue().to_pybytes()
    digest = hashlib.sha256(raw).hexdigest()[:DIGEST_CHARS]
    return write_atomic(folder / f"part-{index:06d}-{digest}.parquet", raw, "dataset part")


def _checked_source(part: Path) -> Path | pa.Buffer:
    """What to read ``part`` from: a part named with its digest must still have it, and is
    then read from the bytes checked (read once); parts written before digests, named by a
    random id of 8 characters, are not checked until ``compact`` rewrites them."""
    named = part.stem.rsplit("-", 1)[-1]
    if not re.fullmatch(f"[0-9a-f]{{{DIGEST_CHARS}}}", named):
        return part
    raw = part.read_bytes()
    if hashlib.sha256(raw).hexdigest()[:DIGEST_CHARS] != named:
        raise DatasetError(f"corrupt dataset part {part}: its bytes no longer match the "
                           f"digest in its name (a damaged file); move it away and run the "
                           f"same collect again, which measures its rows anew")
    return pa.py_buffer(raw)


def parts(path: str | os.PathLike) -> list[Path]:
    folder = Path(path)
    if not folder.exists():
        return []
    if not folder.is_dir():
        raise DatasetError(f"{folder} is not a dataset folder")
    return sorted(folder.glob("part-*.parquet"))


def load(path: str | os.PathLike, columns: list[str] | None = None) -> pa.Table:
    """Read every part of a dataset, checking schema version and columns."""
    files = parts(path)
    if not files:
        raise DatasetError(f"no dataset parts (part-*.parquet) under {path}")
    tables = []
    for f in files:
        source = _checked_source(f)
        try:  # the asked columns the part has, and its version (an older one lacks some)
            held = pq.read_schema(source).names
            asked = None if columns is None else [
                c for c in dict.fromkeys([*columns, "schema_version"]) if c in held]
            t = pq.read_table(source, columns=asked)
        except Exception as e:  # pyarrow raises several types for damaged files
            raise DatasetError(f"corrupt dataset part {f}: {e}") from e
        versions = (set(t.column("schema_version").to_pylist())
                    if "schema_version" in t.column_names else {SCHEMA_VERSION})
        if versions - set(range(1, SCHEMA_VERSION + 1)):
            raise DatasetError(f"dataset part {f} has schema version {sorted(versions)}; "
                               f"this cutetune reads versions 1 to {SCHEMA_VERSION}")
        t = _migrated(t, min(versions), columns)
        missing = set(columns or SCHEMA.names) - set(t.column_names)
        if missing:
            raise DatasetError(f"dataset part {f} lacks columns {sorted(missing)}")
        if columns is not None:
            t = t.select([n for n in t.column_names if n in columns])
        tables.append(_checked(f, t, min(versions)))
    table = pa.concat_tables(tables)
    if columns is None or set(KEY_COLUMNS) <= set(columns):
        # A compaction killed between its rename and its deletes leaves rows twice: keep one.
        keys = zip(*(table.column(c).to_pylist() for c in KEY_COLUMNS))  # row_key's order
        seen, keep = set(), []
        for i, key in enumerate(keys):
            if key not in seen:
                seen.add(key)
                keep.append(i)
        if len(keep) < len(table):
            table = table.take(keep)
    return table


def _migrated(t: pa.Table, version: int, columns: list[str] | None) -> pa.Table:
    """A part of an older schema version with the columns added since (of ``columns``, where
    given) as nulls."""
    for v in range(version + 1, SCHEMA_VERSION + 1):
        for name in ADDED_IN[v]:
            if name not in t.column_names and (columns is None or name in columns):
                t = t.append_column(SCHEMA.field(name), pa.nulls(len(t), SCHEMA.field(name).type))
    return t.select([n for n in SCHEMA.names if n in t.column_names])  # the schema's order


def _checked(f: Path, t: pa.Table, version: int) -> pa.Table:
    """Part ``f``'s table in the schema's types, the time of its ok rows a positive number of
    ms where given (null: not measured). A column of another type (that does not cast) or a
    NaN, infinite, negative or zero time is named here, with the file and column, not later
    deep inside XGBoost or numpy."""
    columns = []
    for name in t.column_names:
        if name not in SCHEMA.names:
            raise DatasetError(f"dataset part {f} has a column {name!r} that is not in the "
                               f"schema of version {SCHEMA_VERSION}")
        want, column = SCHEMA.field(name).type, t.column(name)
        if name == "timestamp" and version >= 3 and pa.types.is_integer(column.type):  # ms
            column = pc.divide(column.cast(pa.float64()), 1000.0)
        try:
            columns.append(column.cast(want))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            raise DatasetError(f"dataset part {f}: column {name} has type "
                               f"{column.type}, not {want}: {e}") from None
    t = pa.table(columns, schema=pa.schema([SCHEMA.field(n) for n in t.column_names]))
    if {"status", "time_ms"} <= set(t.column_names):
        ok = pc.fill_null(pc.equal(t.column("status"), "ok"), False)
        time_ms = t.column("time_ms")
        good = pc.fill_null(pc.and_(pc.greater(time_ms, 0.0), pc.is_finite(time_ms)), True)
        bad = pc.and_(ok, pc.invert(good))
        n = pc.sum(bad).as_py()
        if n:
            i = pc.index(bad, True).as_py()
            raise DatasetError(f"dataset part {f}: column time_ms of ok row {i} is "
                               f"{time_ms[i].as_py()!r} ({n} ok row{'s' * (n > 1)} with a NaN, "
                               f"infinite, zero or negative time); an ok measurement's time is "
                               f"a positive number of ms")
    return t


def compact(path: str | os.PathLike) -> Path:
    """Rewrite every part of a dataset as one part of the current version (fewer files, better
    compression)."""
    old = parts(path)
    table = load(path)
    folder = Path(path)
    path = _write_part(folder, 0, table, level=19)
    for f in old:
        if f != path:  # a compacted dataset compacts to its own bytes, under its own name
            f.unlink()
    return path


def device_names(path: str | os.PathLike) -> set[str]:
    """The GPUs whose measurements the dataset holds."""
    if not parts(path):
        return set()
    return set(load(path, columns=["device_name"]).column("device_name").drop_null().to_pylist())


def check_device(rows, held: set[str], path: str | os.PathLike) -> None:
    """Refuse ``rows`` of another GPU than ``held``, the dataset's (``device_names``): a model
    learns one device's times, and one foreign row makes the dataset unloadable for training."""
    new = {r["device_name"] for r in rows if r.get("device_name")} - held
    if held and new:
        raise ValueError(f"{path} holds measurements of {', '.join(sorted(held))}, and these "
                         f"are of {', '.join(sorted(new))}: collect into another dataset folder")


def done_keys(path: str | os.PathLike) -> set[tuple]:
    """Keys already measured (any status), so a resumed run skips them."""
    if not parts(path):
        return set()
    return {row_key(r) for r in load(path, columns=list(KEY_COLUMNS)).to_pylist()}
