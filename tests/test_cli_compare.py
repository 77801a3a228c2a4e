"""xconv conformance compare: how many cases were compared in every bundle; zero counts are not failures."""

from __future__ import annotations

import re

from xconv_conformance import cli


def test_compare_counts_cases_in_all_and_in_some_bundles(tmp_path, capsys):
    small, large = str(tmp_path / "small.xcr"), str(tmp_path / "large.xcr")
    assert cli.main(["run", "--backend", "numpy", "--out", small, "--cases", "tiny/1d-f32", "--no-progress"]) == 0
    assert cli.main(["run", "--backend", "numpy-exact", "--out", large, "--cases", "tiny/1d-f32", "--cases",
                     "tiny/2d-f64", "--cases", "tiny/3d-f64", "--no-progress"]) == 0
    capsys.readouterr()
    report = tmp_path / "cmp.html"
    assert cli.main(["compare", small, large, "--report", str(report)]) == 0
    text = capsys.readouterr().out
    assert ("1 case(s) compared in all 2 bundles, 2 more present in only some of them (compared where present): "
            "all agree within the error bounds") in text
    html = report.read_text()
    assert "1 case(s) compared in all 2 bundles, 2 more present in only some of them" in html
    # the summary rows: zero counts carry the neutral class, never "failed"
    cells = re.findall(r'<td class="num ([a-z]+)">(\d+)</td>', html)
    assert cells and all((cls == "zero") == (n == "0") for cls, n in cells)
    assert ("zero", "0") in cells and not any(cls == "failed" for cls, _ in cells)


def test_compare_of_one_bundle_says_checked(tmp_path, capsys):
    one = str(tmp_path / "one.xcr")
    assert cli.main(["run", "--backend", "numpy", "--out", one, "--cases", "tiny/1d-f64", "--no-progress"]) == 0
    capsys.readouterr()
    assert cli.main(["compare", one]) == 0
    assert "1 case(s) checked in the bundle: all agree" in capsys.readouterr().out
