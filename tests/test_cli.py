"""`cutetune space ...`: outputs and the user-error paths (exit 2, one line, no traceback)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from cutetune.cli import main
from cutetune.space import enumerate_configs
from cutetune.commands.space import space_counts
from cutetune.space.enumerate import AXES
from cutetune.space.problem import GemmProblem


def run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_show_text_lists_axes_and_rules_with_reasons(capsys):
    rc, out, _ = run(capsys, "space", "show", "--arch", "sm100")
    assert rc == 0
    assert "arch sm100" in out and "tile_n" in out and "512" in out
    assert "sm100_tile_m:" in out and "2-CTA" in out  # the rule's reason, from its docstring
    assert "sm90_tile_m" not in out  # only the arch's own rules


def test_show_json_with_problem_and_limit(capsys):
    rc, out, _ = run(capsys, "space", "show", "--arch", "sm90", "--m", "128", "--n", "4096",
                     "--k", "256", "--limit", "3", "--json")
    assert rc == 0
    d = json.loads(out)
    p = GemmProblem(128, 4096, 256)
    assert d["problem"] == p.to_dict()
    assert d["valid_configs"] == len(enumerate_configs("sm90", p)) < len(enumerate_configs("sm90"))
    assert [c["config_key"] for c in d["configs"]] == [
        c.short() for c in enumerate_configs("sm90", p)[:3]]
    assert d["axes"]["tile_m"] == list(AXES["sm90"]["tile_m"])
    assert {"split_k_has_k_tiles", "sm90_tile_n"} <= {r["name"] for r in d["rules"]}


def test_show_limit_0_lists_all(capsys):
    rc, out, _ = run(capsys, "space", "show", "--m", "64", "--n", "64", "--k", "128",
                     "--limit", "0", "--json")
    d = json.loads(out)
    assert rc == 0 and len(d["configs"]) == d["valid_configs"] > 20


def test_show_table_for_problem(capsys):
    rc, out, _ = run(capsys, "space", "show", "--m", "4096", "--n", "4096", "--k", "4096",
                     "--dtype", "fp16", "--a-major", "m", "--limit", "2")
    assert rc == 0
    # 2400 less the swapped cooperative 192 x >128 tiles (an M-major A becomes the kernel's
    # N-major B: sm90_tile_192_wide_needs_k_major_b)
    assert "2364 valid configs for sm90:fp16->fp16:mk:b1:m4096:n4096:k4096 (first 2)" in out
    table = out.split("(first 2):\n")[1].splitlines()
    assert table[0].split()[:3] == ["config_key", "tile_m", "tile_n"] and len(table) == 3


def test_count_json_matches_enumeration(capsys):
    rc, out, _ = run(capsys, "space", "count", "--json")
    assert rc == 0
    d = {c["arch"]: c for c in json.loads(out)}
    assert d["sm90"]["valid_configs"] == 2400 and d["sm90"]["valid_kernels"] == 1200
    assert d["sm100"]["valid_configs"] == 1944 and d["sm100"]["valid_kernels"] == 972
    assert d["sm100"] == space_counts("sm100")
    assert all(v["rejects_alone"] > 0 for c in d.values() for v in c["rules"].values())


def test_count_text_one_arch(capsys):
    rc, out, _ = run(capsys, "space", "count", "--arch", "sm100")
    assert rc == 0
    assert out.startswith("sm100: 1944 valid configs, 972 distinct compiled kernels")
    assert "sm90" not in out


@pytest.mark.parametrize("argv, words", [
    (["space", "show", "--arch", "sm80"], ["unknown arch 'sm80'", "sm90"]),
    (["space", "count", "--arch", "h100"], ["unknown arch 'h100'"]),
    (["space", "check", "--arch", "sm80"], ["unknown arch 'sm80'"]),
    (["space", "show", "--m", "128", "--n", "128"], ["--k"]),
    (["space", "show", "--m", "0", "--n", "128", "--k", "128"], ["m must be a positive"]),
    (["space", "show", "--m", "128", "--n", "128", "--k", "100"], ["K=100", "multiple of 8"]),
    (["space", "show", "--m", "128", "--n", "100", "--k", "128"], ["N=100"]),
    (["space", "show", "--m", "128", "--n", "128", "--k", "128", "--dtype", "int8"],
     ["unsupported dtype 'int8'"]),
    (["space", "show", "--m", "64", "--n", "64", "--k", "64", "--b-major", "m"], ["b_major"]),
    (["space", "show", "--limit", "-1"], ["--limit"]),
    (["space", "check", "--sample", "0"], ["--sample must be >= 1"]),
    (["space", "check", "--workers", "0"], ["--workers must be >= 1"]),
    (["space", "check", "--rejected", "-1"], ["--rejected"]),
    (["space", "check", "--out", "/nonexistent/dir/x.json"], ["/nonexistent/dir"]),
    # outputs are checked before the compiles, not after them
    (["space", "check", "--out", "/"], ["--out report / is a directory; give a file path"]),
])
def test_user_errors_exit_2_with_one_line(capsys, argv, words):
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cutetune space: error: "), err
    for w in words:
        assert w in lines[0]


def test_check_out_on_a_read_only_filesystem(capsys, read_only_dir):
    out_file = f"{read_only_dir}/cutetune-report.json"
    rc, out, err = run(capsys, "space", "check", "--out", out_file)
    assert rc == 2 and out == ""
    assert err.startswith(f"cutetune space: error: cannot write --out report {out_file}: ")
    assert len(err.splitlines()) == 1


def test_help_texts(capsys):
    for argv in (["space", "--help"], ["space", "check", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0
    out = capsys.readouterr().out
    assert "show" in out and "count" in out and "--rejected" in out and "sm_90a" in out


def test_entry_point_runs_without_traceback():
    """The real process: a user mistake prints one line and exits 2."""
    r = subprocess.run([sys.executable, "-m", "cutetune", "space", "show", "--arch", "sm80"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == ("cutetune space: error: unknown arch 'sm80'; "
                                "supported: sm90, sm100")


@pytest.mark.compile
def test_check_writes_report(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc, text, err = run(capsys, "space", "check", "--arch", "sm100", "--sample", "2",
                        "--seed", "1", "--rejected", "1", "--workers", "1", "--out", str(out))
    assert rc == 0, err
    report = json.loads(out.read_text())
    assert report["arch"] == "sm100" and report["sample"] == 2
    assert report["summary"]["failed"] == 0 and len(report["results"]) == 2
    assert report["rejected"]["tried"] == 1
    assert "compiled 2 of 972 valid kernels for sm_100a: 2 ok, 0 failed" in text
    assert err.count("\n") == 2  # one progress line per valid config


# ---------------------------------------------------------------- grouped GEMMs
def test_show_grouped_json_for_a_problem(capsys):
    from cutetune.space.enumerate import GROUPED_AXES
    from cutetune.space.problem import GroupedProblem

    rc, out, _ = run(capsys, "space", "show", "--gemm", "wgrad", "--experts", "128", "--m",
                     "1536", "--n", "2048", "--k", "65536", "--limit", "2", "--json")
    assert rc == 0
    d = json.loads(out)
    p = GroupedProblem(128, 1536, 2048, 65536, gemm="wgrad")
    assert d["problem"] == p.to_dict() and d["family"] == "varlen_k"
    assert d["valid_configs"] == len(enumerate_configs("sm90", p)) == 1248
    assert [c["config_key"] for c in d["configs"]] == [
        c.short() for c in enumerate_configs("sm90", p)[:2]]
    assert d["axes"]["tile_n"] == list(GROUPED_AXES["sm90"]["tile_n"])
    names = {r["name"] for r in d["rules"]}
    assert {"grouped_no_split_k", "sm90_tile_n", "sm90_tile_192_wide_needs_k_major_b"} <= names
    assert "varlen_m_no_swap_ab" not in names and "sm90_static_scheduler" not in names


def test_show_grouped_text_names_the_family(capsys):
    rc, out, _ = run(capsys, "space", "show", "--arch", "sm100", "--gemm", "fwd")
    assert rc == 0
    assert out.startswith("arch sm100, grouped GEMM fwd (varlen_m)")
    assert "varlen_m_no_swap_ab:" in out and "config_supports" in out


def test_count_includes_the_grouped_gemms(capsys):
    rc, out, _ = run(capsys, "space", "count", "--arch", "sm90", "--json")
    assert rc == 0
    d = json.loads(out)
    assert (d["valid_configs"], d["valid_kernels"]) == (2400, 1200)  # dense, as before
    g = d["grouped"]
    assert [g[x]["valid_kernels"] for x in ("fwd", "dgrad", "wgrad")] == [336, 312, 624]
    assert g["fwd"]["rules"]["varlen_m_no_swap_ab"]["rejects_alone"] > 0
    assert g["fwd"]["rules"]["sm90_tile_192_wide_needs_k_major_b"]["rejects"] == 0
    assert g["dgrad"]["rules"]["sm90_tile_192_wide_needs_k_major_b"]["rejects_alone"] > 0
    assert "varlen_m_no_swap_ab" not in g["wgrad"]["rules"]
    rc, out, _ = run(capsys, "space", "count", "--arch", "sm100")
    assert "sm100 grouped dgrad (varlen_m): 240 valid configs, 120 distinct" in out
    assert "sm100 grouped wgrad (varlen_k): 480 valid configs, 240 distinct" in out


def test_check_grouped_passes_the_gemm(capsys, monkeypatch, tmp_path):
    """`space check --gemm` checks that GEMM's kernels (the compiles are the runner's: see
    test_compile_check); an --out ending in .gz is written gzipped."""
    import cutetune.tuner.measure.space_check as space_check

    seen = {}

    def fake_run_check(arch, **kwargs):
        seen.update(arch=arch, **kwargs)
        return {"summary": {"count": 0, "ok": 0, "failed": 0, "configs_per_minute": None},
                "valid_kernels": 672, "dsl_arch": "sm_90a", "workers": 1, "failures": []}

    monkeypatch.setattr(space_check, "run_check", fake_run_check)
    rc, out, _ = run(capsys, "space", "check", "--gemm", "wgrad", "--sample", "1", "--quiet",
                     "--out", str(tmp_path / "r.json.gz"))
    assert rc == 0 and seen["arch"] == "sm90" and seen["gemm"] == "wgrad"
    assert out.startswith("sm90 grouped wgrad: compiled 0 of 672 valid kernels")
    report = json.loads(gzip.decompress((tmp_path / "r.json.gz").read_bytes()))
    assert report["valid_kernels"] == 672


@pytest.mark.parametrize("argv, words", [
    (["space", "show", "--gemm", "bwd"], ["unknown grouped GEMM 'bwd'", "fwd, dgrad, wgrad"]),
    (["space", "check", "--gemm", "bwd"], ["unknown grouped GEMM 'bwd'"]),
    (["space", "show", "--experts", "8", "--m", "64", "--n", "64", "--k", "64"],
     ["--experts is for a grouped problem", "--gemm"]),
    (["space", "show", "--gemm", "fwd", "--m", "64", "--n", "64", "--k", "64"],
     ["missing --experts"]),
    (["space", "show", "--gemm", "fwd", "--experts", "8", "--m", "64", "--n", "64", "--k", "64",
      "--b-major", "n"], ["--b-major", "dense problems only"]),
    (["space", "show", "--gemm", "fwd", "--experts", "0", "--m", "64", "--n", "64", "--k", "64"],
     ["experts must be a positive integer"]),
])
def test_grouped_user_errors_exit_2_with_one_line(capsys, argv, words):
    test_user_errors_exit_2_with_one_line(capsys, argv, words)


def test_the_command_line_is_built_without_torch_quack_or_xgboost(run_script):
    """`cutetune --help` (every subcommand's parser) imports none of the heavy stack."""
    got = run_script("import json, sys\nimport cutetune.cli as cli\ncli.build_parser()\n"
                     "print(json.dumps([m for m in ('torch', 'quack', 'cutlass', 'xgboost', "
                     "'sklearn') if m in sys.modules]))\n")
    assert got == []
