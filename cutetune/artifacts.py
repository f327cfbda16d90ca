"""Files cutetune writes and reads back: atomic writes, writability checks made before the work,
the package versions recorded with results, and the format, version and checksum of artifacts
(the cost model, the heuristics file)."""

from __future__ import annotations

import errno
import gzip
import hashlib
import json
import os
import platform
import re
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from .errors import ArtifactError, OutputError

CHECKSUM = "checksum"  # the artifact field holding the sha256 of the rest of its content


def _output_error(path: Path, e: OSError, what: str) -> OutputError:
    if e.errno == errno.ENOSPC:
        return OutputError(f"no space left on the device writing {what} {path}; nothing of it "
                           "was written (results written before are kept)")
    if isinstance(e, IsADirectoryError) or path.is_dir():
        return OutputError(f"{what} {path} is a directory; give a file path")
    return OutputError(f"cannot write {what} {path}: {e.strerror or e}")


def _probe(folder: Path, what: str, target: Path) -> None:
    """Make ``folder`` and write and remove an empty file in it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".cutetune-probe.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise _output_error(target, e, what) from None


def check_writable(path: str | os.PathLike, what: str = "output") -> Path:
    """Fail now, before any work, if ``path`` cannot be written as a file: a directory, a
    read-only place, a parent that cannot be made. Leaves nothing behind but the parent."""
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{what} {p} is a directory; give a file path")
    _probe(p.parent, what, p)
    if p.exists() and not os.access(p, os.W_OK):
        raise OutputError(f"cannot write {what} {p}: it is read-only")
    return p


def check_writable_dir(path: str | os.PathLike, what: str = "output folder") -> Path:
    """``check_writable`` for a folder that will receive files: not a file, can be made, and
    can be written in."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputError(f"{what} {p} is a file; give a folder")
    _probe(p, what, p)
    return p


@contextmanager
def replacing(path: str | os.PathLike, what: str = "file") -> Iterator[Path]:
    """The one way cutetune writes a file: yields a temporary path in the same folder for the
    caller to write, then renames it to ``path``, so a reader sees the old file or the new
    one, never a part. Whatever fails, the temporary file is removed; an OSError becomes an
    OutputError naming ``path`` (a full disk says so)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        yield tmp
        os.replace(tmp, p)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise _output_error(p, e, what) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike, data: bytes | str, what: str = "file") -> Path:
    """Write ``data`` to ``path`` atomically (``replacing``)."""
    with replacing(path, what) as tmp:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
    return Path(path)


def write_artifact(path: str | os.PathLike, data: bytes | str, what: str = "file") -> Path:
    """``write_atomic``, gzipped (reproducibly) where ``path`` ends in .gz: the JSON files
    cutetune writes are mostly repetition, and ``read_artifact`` reads either."""
    raw = data.encode() if isinstance(data, str) else data
    gz = Path(path).suffix == ".gz"
    return write_atomic(path, gzip.compress(raw, 9, mtime=0) if gz else raw, what)


def package_versions(names: Iterable[str]) -> dict[str, str | None]:
    """Installed version of each distribution, None where it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def environment() -> dict:
    """Versions and device facts stored with every measurement (needs a CUDA device)."""
    import subprocess

    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    versions = package_versions(("nvidia-cutlass-dsl", "quack-kernels"))
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                                 "--format=csv,noheader"], capture_output=True, text=True,
                                timeout=10).stdout.strip().split("\n")[0]
    except Exception:  # noqa: BLE001  (a fact recorded, not needed)
        driver = "unknown"
    return {
        "device_name": props.name, "sm_count": props.multi_processor_count, "driver": driver,
        "cuda": torch.version.cuda or "", "torch_version": torch.__version__,
        "cutlass_dsl_version": versions["nvidia-cutlass-dsl"] or "unknown",
        "quack_version": versions["quack-kernels"] or "unknown",
        "l2_bytes": getattr(props, "L2_cache_size", 50 * 2**20), "host": platform.node(),
    }


# ------------------------------------------------------------------ artifacts
# The checksum of a JSON artifact is the sha256 of the file's own bytes with the checksum's
# value written as 64 zeros: every byte is covered (a flip anywhere is refused, before any
# parser of the content, XGBoost's included, sees it), and checking costs a hash, not a
# re-serialization of the content (the heuristics file is read at compile time).
_ZEROS = "0" * 64
_FIELD = re.compile(rb'"' + CHECKSUM.encode() + rb'"\s*:\s*"([0-9a-f]{64})"')


def _field(raw: bytes, value: bytes) -> tuple[int, int] | None:
    """Where in ``raw`` the checksum field holding ``value`` has its value; None unless there
    is exactly one such field."""
    spans = [m.span(1) for m in _FIELD.finditer(raw) if m.group(1) == value]
    return spans[0] if len(spans) == 1 else None


def sealed_json(d: dict, **dumps_kw) -> bytes:
    """``d`` as JSON (``json.dumps`` keywords) with its checksum field set."""
    raw = json.dumps({**d, CHECKSUM: _ZEROS}, **dumps_kw).encode()
    span = _field(raw, _ZEROS.encode())
    if span is None:  # another checksum field of zeros inside the content
        raise ArtifactError(f"cannot seal content holding a {CHECKSUM!r} field of 64 zeros")
    return raw[:span[0]] + hashlib.sha256(raw).hexdigest().encode() + raw[span[1]:]


def read_artifact(path: str | os.PathLike, fmt: str, version_field: str,
                  version: int | tuple[int, ...],
                  what: str, hint: str, error: type[ArtifactError] = ArtifactError
                  ) -> tuple[dict, bytes]:
    """Read a JSON artifact and check it before anything uses its content: the file is a
    readable file, JSON, of format ``fmt`` at ``version`` (or one of a tuple of them), and its
    checksum matches; gzipped where ``path`` ends in .gz. Errors (``error``, FileNotFoundError
    for a missing file) name the file and say what to do (``hint``). Returns (content, the
    JSON's bytes)."""
    p = Path(path)
    if p.is_dir():
        raise error(f"{what} {p} is a directory; give the file")
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {p} does not exist ({hint})") from None
    except OSError as e:
        raise error(f"cannot read {what} {p}: {e.strerror or e}") from None
    if p.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
            raise error(f"corrupt {what} {p}: not readable gzip ({e}); {hint}") from None
    try:
        d = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"corrupt {what} {p}: not readable JSON ({e}); {hint}") from None
    if not isinstance(d, dict) or d.get("format") != fmt:
        raise error(f"{p} is not a cutetune {what} (format {fmt!r} expected)")
    readable = version if isinstance(version, tuple) else (version,)
    if d.get(version_field) not in readable:
        raise error(f"{what} {p} has format version {d.get(version_field)!r}; this cutetune "
                    f"reads version {' or '.join(map(str, readable))} ({hint})")
    value = d.get(CHECKSUM)
    if not isinstance(value, str):
        raise error(f"{what} {p} has no checksum ({hint})")
    span = _field(raw, value.encode())
    if span is None or hashlib.sha256(raw[:span[0]] + _ZEROS.encode() + raw[span[1]:]
                                      ).hexdigest() != value:
        raise error(f"corrupt {what} {p}: its checksum does not match its bytes ({hint})")
    return d, raw
