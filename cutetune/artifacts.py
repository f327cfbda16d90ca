"""Files cutetune writes and reads back: atomic writes, writability checks made before the work,
the package versions recorded with results, and the format, version and checksum of artifacts
(the cost model, the heuristics file)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import platform
import uuid
from pathlib import Path
from typing import Iterable

from .errors import ArtifactError, OutputError

CHECKSUM = "checksum"  # the artifact field holding the sha256 of the rest of its content


def _output_error(path: Path, e: OSError, what: str) -> OutputError:
    if e.errno == errno.ENOSPC:
        return OutputError(f"no space left on the device writing {what} {path}; nothing of it "
                           "was written (results written before are kept)")
    if isinstance(e, IsADirectoryError) or path.is_dir():
        return OutputError(f"{what} {path} is a directory; give a file path")
    return OutputError(f"cannot write {what} {path}: {e.strerror or e}")


def check_writable(path: str | os.PathLike, what: str = "output") -> Path:
    """Fail now, before any work, if ``path`` cannot be written as a file: a directory, a
    read-only place, a parent that cannot be made. Leaves nothing behind."""
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{what} {p} is a directory; give a file path")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        probe = p.with_name(f".{p.name}.{uuid.uuid4().hex[:8]}.probe")
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise _output_error(p, e, what) from None
    if p.exists() and not os.access(p, os.W_OK):
        raise OutputError(f"cannot write {what} {p}: it is read-only")
    return p


def write_atomic(path: str | os.PathLike, data: bytes | str, what: str = "file") -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename, so
    a reader sees the old file or the new one, never a part; the temporary file is removed
    whatever fails."""
    p = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(raw)
        os.replace(tmp, p)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise _output_error(p, e, what) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return p


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
def content_checksum(d: dict) -> str:
    """sha256 of a JSON artifact's content without its checksum field, in a canonical form:
    a change anywhere in the file that still parses changes a value, hence this."""
    body = {k: v for k, v in d.items() if k != CHECKSUM}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


def seal(d: dict) -> dict:
    """``d`` with its checksum field set."""
    return {**d, CHECKSUM: content_checksum(d)}


def read_artifact(path: str | os.PathLike, fmt: str, version_field: str, version: int,
                  what: str, hint: str) -> tuple[dict, bytes]:
    """Read a JSON artifact and check it before anything uses its content: the file is a
    readable file, JSON, of format ``fmt`` at ``version``, and its checksum matches. Errors
    name the file and say what to do (``hint``). Returns (content, the file's bytes)."""
    p = Path(path)
    if p.is_dir():
        raise ArtifactError(f"{what} {p} is a directory, not a file ({hint})")
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {p} does not exist ({hint})") from None
    except OSError as e:
        raise ArtifactError(f"cannot read {what} {p}: {e.strerror or e}") from None
    try:
        d = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ArtifactError(f"corrupt {what} {p}: not JSON ({e}); {hint}") from None
    if not isinstance(d, dict) or d.get("format") != fmt:
        raise ArtifactError(f"{p} is not a {what} (format {fmt!r} expected)")
    if d.get(version_field) != version:
        raise ArtifactError(f"{what} {p} has format version {d.get(version_field)!r}; this "
                            f"cutetune reads version {version} ({hint})")
    if CHECKSUM not in d:
        raise ArtifactError(f"{what} {p} has no checksum (written by an older cutetune; {hint})")
    if d[CHECKSUM] != content_checksum(d):
        raise ArtifactError(f"corrupt {what} {p}: its checksum does not match its content "
                            f"({hint})")
    return d, raw
