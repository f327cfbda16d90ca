"""cutetune.artifacts: the one atomic write, the writability checks made before the work, and
the checksum every JSON artifact carries."""

from __future__ import annotations

import errno
import os

import pytest

import cutetune.artifacts as artifacts
from cutetune.artifacts import (check_writable, check_writable_dir, read_artifact, replacing,
                                sealed_json, write_atomic)
from cutetune.errors import ArtifactError, OutputError


def read(path):
    return read_artifact(path, "f", "v", 1, "thing", "make another")


def test_sealed_json_round_trips_and_any_changed_byte_is_refused(tmp_path):
    d = {"format": "f", "v": 1, "nested": {"checksum": "not ours", "x": [1.5, None]}}
    path = tmp_path / "a.json"
    path.write_bytes(sealed_json(d, indent=1))
    got, raw = read(path)
    assert {k: v for k, v in got.items() if k != "checksum"} == d and raw == path.read_bytes()
    for pos in range(len(raw)):
        bad = bytearray(raw)
        bad[pos] ^= 0x01
        path.write_bytes(bytes(bad))
        with pytest.raises(ArtifactError, match=str(path)):
            read(path)


def test_an_artifact_written_gzipped_reads_as_its_json(tmp_path):
    """``write_artifact`` gzips a path ending in .gz (reproducibly: the same bytes each time),
    ``read_artifact`` reads it back as the JSON it holds; a damaged gzip is named."""
    d = {"format": "f", "v": 1, "x": list(range(50))}
    data = sealed_json(d)
    path = artifacts.write_artifact(tmp_path / "a.json.gz", data, "thing")
    raw = path.read_bytes()
    assert raw[:2] == b"\x1f\x8b" and len(raw) < len(data)
    assert read(path) == (read(artifacts.write_artifact(tmp_path / "a.json", data))[0], data)
    assert artifacts.write_artifact(tmp_path / "a.json.gz", data).read_bytes() == raw
    path.write_bytes(raw[:-8])
    with pytest.raises(ArtifactError, match=f"corrupt thing {path}: not readable gzip"):
        read(path)


@pytest.mark.parametrize("content, match", [
    (b"{", "corrupt thing .*: not readable JSON"),
    (b'{"format": "g", "v": 1}', "is not a cutetune thing"),
    (b'{"format": "f", "v": 0}', "format version 0; this cutetune reads version 1 "
                                 r"\(make another\)"),
    (b'{"format": "f", "v": 1}', r"has no checksum \(make another\)"),
    (b'{"format": "f", "v": 1, "checksum": "' + b"0" * 64 + b'"}', "checksum does not match"),
])
def test_read_artifact_names_the_file_and_the_problem(tmp_path, content, match):
    path = tmp_path / "a.json"
    path.write_bytes(content)
    with pytest.raises(ArtifactError, match=match) as e:
        read(path)
    assert str(path) in str(e.value)


def test_read_artifact_on_a_directory_or_nothing(tmp_path):
    with pytest.raises(ArtifactError, match="is a directory; give the file"):
        read(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"does not exist \(make another\)"):
        read(tmp_path / "none.json")


def test_a_full_disk_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    path.write_text("old")

    def full(file, mode="r", *a, **kw):
        open(file, mode).close()  # the temporary file exists when the write fails
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))

    monkeypatch.setattr(artifacts, "open", full, raising=False)
    with pytest.raises(OutputError, match=f"no space left on the device writing report {path}"):
        write_atomic(path, "new", "report")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["out.json"]


def test_replacing_removes_its_temporary_whatever_fails(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with replacing(tmp_path / "x") as tmp:
            tmp.write_text("part")
            raise KeyboardInterrupt
    with pytest.raises(OutputError, match="is a directory"):
        write_atomic(tmp_path, "x")
    assert os.listdir(tmp_path) == []


def test_writability_is_checked_before_the_work(tmp_path, read_only_dir):
    (tmp_path / "file").write_text("")
    assert check_writable(tmp_path / "new" / "m.json") == tmp_path / "new" / "m.json"
    with pytest.raises(OutputError, match=f"model {tmp_path} is a directory"):
        check_writable(tmp_path, "model")
    with pytest.raises(OutputError, match=f"cannot write model {tmp_path}/file/m.json"):
        check_writable(tmp_path / "file" / "m.json", "model")
    with pytest.raises(OutputError, match=f"report folder {tmp_path}/file is a file"):
        check_writable_dir(tmp_path / "file", "report folder")
    with pytest.raises(OutputError, match=f"cannot write report folder {read_only_dir}/r: "):
        check_writable_dir(f"{read_only_dir}/r", "report folder")
    assert sorted(os.listdir(tmp_path)) == ["file", "new"]
    assert os.listdir(tmp_path / "new") == []
