"""What the summaries and reports show: the per-output column filled in compare reports, the rounding floor beside
the worst error/bound (terminal and HTML), and unavailable backends folded into one line."""

import re

import pytest

from xconv_conformance import cli, report, summary
from xconv_conformance import compare as xcompare
from xconv_conformance.bundle import load_bundle
from xconv_conformance.cases import load_corpus, select
from xconv_conformance.runner import Outcome, reference_of
from xconv_conformance.tolerance import rounding_floor

CASES = ["--cases", "dtype/2d-f16-contig", "--cases", "dtype/2d-bf16-contig", "--cases", "tiny/2d-f32",
         "--cases", "mask/m101-direct-bf16"]


@pytest.fixture(scope="module")
def bundle_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("reports") / "b.xcr")
    assert cli.main(["run", "--backend", "numpy", "--out", path, *CASES, "--no-progress"]) == 0
    return path


def _cells(html: str, header: str) -> list[str]:
    """The cells of column ``header`` in every table of ``html`` that has it."""
    out = []
    for table in re.findall(r"<table>.*?</table>", html, flags=re.S):
        heads = re.findall(r"<th>(.*?)</th>", table)
        if header not in heads:
            continue
        col = heads.index(header)
        for row in re.findall(r"<tr>(.*?)</tr>", table, flags=re.S)[1:]:
            cells = re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)
            out.append(cells[col])
    return out


def test_compare_report_fills_the_per_output_column(bundle_path, tmp_path, capsys):
    html = tmp_path / "cmp.html"
    assert cli.main(["compare", bundle_path, "--report", str(html)]) == 0
    cells = _cells(html.read_text(), "per output")
    assert len(cells) == 4 and all(cells), cells
    masked = next(c for c in cells if "grad_weight" not in c)      # mask/m101: no grad_weight
    assert "grad_input" in masked and "grad_bias" in masked
    runs = xcompare.report_runs(xcompare.compare_bundles([load_bundle(bundle_path)]))
    assert all(set(r["ratios"]) == {"grad_input", "grad_weight", "grad_bias"} for r in runs[0]["rows"]
               if r["id"] != "mask/m101-direct-bf16")


def test_the_rounding_floor_stands_beside_the_worst_error(bundle_path, tmp_path, capsys):
    case = select(load_corpus(), ["dtype/2d-f16-contig"])[0]
    ref = reference_of(case)
    floor = max(ref.floors)
    assert floor == max(rounding_floor(e, b, "float16") for e, b in zip(ref.exact, ref.bounds))
    assert 0.5 < floor < 1.0                                  # the final rounding alone comes close to the bound
    assert summary.with_floor(floor, floor) == f"{floor:.3g} (at the rounding limit)"
    assert summary.with_floor(0.31, 0.0012) == "0.31 (floor 0.0012)"
    html = tmp_path / "run.html"
    assert cli.main(["run", "--backend", "numpy", "--out", str(tmp_path / "x.xcr"), "--report", str(html),
                     *CASES, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "worst error/bound per dtype" in out and "float16 " in out and "(at the rounding limit)" in out
    text = html.read_text()
    assert "(at the rounding limit)" in text and "rounding floor" in text
    assert cli.main(["compare", bundle_path]) == 0
    assert "(at the rounding limit)" in capsys.readouterr().out


def test_unavailable_backends_fold_into_one_line():
    cases = select(load_corpus(), ["tiny/2d-f32", "tiny/1d-f32"])
    ran = [(c, Outcome(c.id, "numpy", "passed", ratio=0.1, floor=0.01)) for c in cases]
    results = {"numpy": ran}
    for name in ("gone-a", "gone-b", "gone-c"):
        results[name] = [(c, Outcome(c.id, name, "unavailable", f"{name} is not installed")) for c in cases]
    text = summary.summary_table(results, {})
    lines = text.splitlines()
    assert not any(li.startswith("gone-") for li in lines), text
    assert sum("gone-a" in li for li in lines) == 1
    assert "unavailable here (3 backend(s), 2 case(s) each not run): gone-a, gone-b, gone-c" in text
    assert "gone-a: unavailable: gone-a is not installed" in summary.details(results, verbose=True)
    assert "gone-a" not in summary.details(results, verbose=False)
    runs = [{"label": name, "rows": summary.rows([c for c, _ in pairs], [o for _, o in pairs])}
            for name, pairs in results.items()]
    table = report.summary_table(runs)
    assert table.count("<tr>") == 3 and "unavailable here (3): gone-a, gone-b, gone-c" in table
