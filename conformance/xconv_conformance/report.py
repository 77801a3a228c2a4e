"""A self-contained HTML report (inline SVG, no external resources, no plotting library)."""

from __future__ import annotations

import html
import math
from collections import Counter, defaultdict

import numpy as np

from . import status
from .tolerance import at_rounding_limit

LO, HI, STEP = -10.0, 2.0, 0.25          # histogram range of log10(error / bound)
_STATUS_COLOR = status.COLORS
_COUNTED = status.STATUSES
_FAILING = status.FAILING
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em;color:#222;max-width:1400px}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0}th,td{border:1px solid #ddd;padding:.25em .5em;text-align:left}
th{background:#f5f5f5}td.num{text-align:right;font-variant-numeric:tabular-nums}
.passed{color:#2e7d32}.failed{color:#c62828;font-weight:bold}.zero{color:#9e9e9e}.refused{color:#ef6c00}.unavailable{color:#757575}
.crashed{color:#6a1b9a;font-weight:bold}.timed_out{color:#ad1457;font-weight:bold}
.plots{display:flex;flex-wrap:wrap;gap:1em}.plot{border:1px solid #eee;padding:.3em}
.small{font-size:.85em;color:#555}code{background:#f5f5f5;padding:0 .2em}.emulated{color:#6a1b9a}
"""


def ran(record: dict | None) -> str:
    """What a case's call ran, from its trace record (bundles keep it per case): path, math, determinism."""
    if not record:
        return ""
    text = f"{record.get('backend')}: {record.get('path') or '-'} (math={record.get('math')}, " \
           f"deterministic={record.get('deterministic')})"
    if record.get("legalized"):
        text += "; legalized: " + ", ".join(record["legalized"])
    return text


def _esc(v) -> str:
    return html.escape(str(v), quote=True)


def _fmt_ratio(r) -> str:
    if r is None:
        return "-"
    if isinstance(r, str):
        return r
    if math.isinf(r):
        return "inf"
    return f"{r:.3g}"


def histogram_svg(samples: np.ndarray, title: str, width: int = 320, height: int = 150, floor=None) -> str:
    """Histogram of log10(error/bound) values; the bound (0) as a red line, bins beyond it in red; ``floor``
    (the worst ratio of the exactly rounded results, :func:`.tolerance.rounding_floor`) as a grey line."""
    edges = np.arange(LO, HI + STEP / 2, STEP)
    vals = np.clip(np.asarray(samples, dtype=np.float64), LO, HI - 1e-9) if len(samples) else np.zeros(0)
    counts, _ = np.histogram(vals, bins=edges)
    left, right, top, bottom = 34, 8, 18, 26
    pw, ph = width - left - right, height - top - bottom
    peak = math.log1p(counts.max()) if counts.size and counts.max() > 0 else 1.0
    bw = pw / len(counts)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
             f'<title>{_esc(title)}</title>',
             f'<text x="{left}" y="12" font-size="11">{_esc(title)} ({len(samples)} elements)</text>']
    for i, c in enumerate(counts):
        if c == 0:
            continue
        h = ph * math.log1p(c) / peak
        x = left + i * bw
        color = "#c62828" if edges[i] >= 0 else "#1565c0"
        parts.append(f'<rect x="{x:.1f}" y="{top + ph - h:.1f}" width="{max(bw - 0.5, 0.5):.1f}" height="{h:.1f}" '
                     f'fill="{color}"><title>10^[{edges[i]:g}, {edges[i + 1]:g}): {c}</title></rect>')
    zero = left + (0 - LO) / (HI - LO) * pw
    parts.append(f'<line x1="{zero:.1f}" y1="{top}" x2="{zero:.1f}" y2="{top + ph}" stroke="#c62828" '
                 'stroke-dasharray="3,2"/>')
    parts.append(f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#999"/>')
    if floor is not None and floor > 0 and math.isfinite(floor):
        fx = left + (min(max(math.log10(floor), LO), HI) - LO) / (HI - LO) * pw
        parts.append(f'<line x1="{fx:.1f}" y1="{top}" x2="{fx:.1f}" y2="{top + ph}" stroke="#616161" '
                     f'stroke-dasharray="1,2"><title>rounding floor {_fmt_ratio(floor)}: the exactly rounded '
                     'results reach this ratio</title></line>')
    for t in range(int(LO), int(HI) + 1, 2):
        x = left + (t - LO) / (HI - LO) * pw
        parts.append(f'<text x="{x:.1f}" y="{top + ph + 12}" font-size="9" text-anchor="middle">1e{t}</text>')
    caption = "red line = bound" + ("; grey = rounding floor" if floor else "")
    parts.append(f'<text x="{left + pw / 2:.1f}" y="{height - 2}" font-size="9" text-anchor="middle">'
                 f'error / bound (log scale; {caption})</text>')
    parts.append(f'<text x="4" y="{top + ph / 2:.1f}" font-size="9" transform="rotate(-90 8 {top + ph / 2:.1f})">'
                 'count (log)</text>')
    parts.append("</svg>")
    return "".join(parts)


def worst_cases_svg(rows: list[dict], title: str, width: int = 660) -> str:
    """One dot per case at log10(worst error/bound), one row per case group, coloured by status."""
    groups = sorted({r["group"] for r in rows})
    row_h, left, right, top = 16, 150, 10, 20
    height = top + row_h * max(len(groups), 1) + 30
    pw = width - left - right
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
             f'<title>{_esc(title)}</title>', f'<text x="4" y="13" font-size="11">{_esc(title)}</text>']
    zero = left + (0 - LO) / (HI - LO) * pw
    parts.append(f'<line x1="{zero:.1f}" y1="{top}" x2="{zero:.1f}" y2="{height - 28}" stroke="#c62828" '
                 'stroke-dasharray="3,2"/>')
    for gi, g in enumerate(groups):
        y = top + gi * row_h + row_h / 2
        parts.append(f'<text x="{left - 6}" y="{y + 3:.1f}" font-size="10" text-anchor="end">{_esc(g)}</text>')
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#f0f0f0"/>')
    for r in rows:
        ratio = r.get("ratio")
        if not isinstance(ratio, (int, float)) or ratio is None:
            continue
        lv = LO if ratio <= 0 else min(max(math.log10(ratio), LO), HI) if math.isfinite(ratio) else HI
        x = left + (lv - LO) / (HI - LO) * pw
        y = top + groups.index(r["group"]) * row_h + row_h / 2
        color = _STATUS_COLOR.get(r["status"], "#000")
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}" fill-opacity="0.7">'
                     f'<title>{_esc(r["id"])}: {_fmt_ratio(ratio)} ({_esc(r["status"])})</title></circle>')
    for t in range(int(LO), int(HI) + 1, 2):
        x = left + (t - LO) / (HI - LO) * pw
        parts.append(f'<text x="{x:.1f}" y="{height - 16}" font-size="9" text-anchor="middle">1e{t}</text>')
    parts.append(f'<text x="{left + pw / 2:.1f}" y="{height - 3}" font-size="9" text-anchor="middle">'
                 'worst error / bound of each case (red line = bound)</text>')
    parts.append("</svg>")
    return "".join(parts)


def _count_cell(status: str, n: int) -> str:
    """A count coloured as its status only when non-zero: "0 failed" is not a failure."""
    return f'<td class="num {status if n else "zero"}">{n}</td>'


def _with_floor(ratio, floor) -> str:
    if isinstance(ratio, (int, float)) and at_rounding_limit(ratio, floor):
        return f"{_fmt_ratio(ratio)} (at the rounding limit)"
    if isinstance(ratio, (int, float)) and isinstance(floor, (int, float)) and floor:
        return f"{_fmt_ratio(ratio)} (floor {_fmt_ratio(floor)})"
    return _fmt_ratio(ratio)


def _unavailable(run: dict) -> bool:
    return bool(run["rows"]) and all(r["status"] == "unavailable" for r in run["rows"])


def summary_table(runs: list[dict]) -> str:
    """One row per run that ran something (worst error/bound beside its rounding floor), one row folding the
    runs whose every case is unavailable."""
    out = ["<table><tr><th>backend</th><th>version / device</th><th>passed</th><th>failed</th><th>crashed</th>"
           "<th>timed out</th><th>refused</th><th>unavailable</th><th>worst error/bound (rounding floor)</th>"
           "<th>worst case</th></tr>"]
    gone = [run for run in runs if _unavailable(run)]
    for run in runs:
        if _unavailable(run):
            continue
        counts = Counter(r["status"] for r in run["rows"])
        ratios = [(r["ratio"], r["id"], r.get("floor")) for r in run["rows"]
                  if isinstance(r.get("ratio"), (int, float))]
        worst = max(ratios, key=lambda t: t[0]) if ratios else (None, "", None)
        fake = '<br><b class="emulated">EMULATED</b>' if run.get("emulation") else ""
        out.append(f'<tr><td>{_esc(run["label"])}{fake}</td><td class="small">{_esc(run.get("detail", ""))}</td>'
                   + "".join(_count_cell(s, counts.get(s, 0)) for s in _COUNTED)
                   + f'<td class="num">{_esc(_with_floor(worst[0], worst[2]))}</td><td>{_esc(worst[1])}</td></tr>')
    if gone:
        out.append(f'<tr><td colspan="10" class="unavailable">unavailable here ({len(gone)}): '
                   + _esc(", ".join(run["label"] for run in gone)) + " (reasons below)</td></tr>")
    out.append("</table>")
    return "".join(out)


def html_report(title: str, runs: list[dict], intro: str = "", extra_html: str = "") -> str:
    """The report page. ``runs``: [{"label", "detail", "rows": [{"id", "group", "dtype", "status", "ratio",
    "message", "samples": {output: log10 ratios}}]}]."""
    body = [f"<h1>{_esc(title)}</h1>"]
    if intro:
        body.append(f"<p class='small'>{intro}</p>")
    fakes = [run for run in runs if run.get("emulation")]
    if fakes:
        body.append("<p class='emulated'>Emulated results: " + "; ".join(
            f"{_esc(run['label'])} ran on {_esc(run['emulation'])}" for run in fakes)
            + ". They show the software path, not the vendor's hardware.</p>")
    body.append("<h2>Summary</h2>" + summary_table(runs))
    if extra_html:
        body.append(extra_html)
    body.append("<h2>Error / bound distribution per backend and dtype</h2><p class='small'>Every element of every "
                "unmasked gradient (sampled for large outputs, always keeping the largest ratios): "
                "log10(|got - exact| / bound). Passing results lie left of the red line; exact results "
                "are drawn at 1e-10. The grey line is the rounding floor: the worst ratio of the exactly "
                "rounded results, which the final rounding to float16/bfloat16 alone brings close to 1; "
                "results piled at it are at the rounding limit, not borderline.</p>")
    for run in runs:
        per_dtype, floors = defaultdict(list), defaultdict(float)
        for r in run["rows"]:
            for s in (r.get("samples") or {}).values():
                per_dtype[r["dtype"]].append(np.asarray(s, dtype=np.float64))
            if isinstance(r.get("floor"), (int, float)):
                floors[r["dtype"]] = max(floors[r["dtype"]], r["floor"])
        if not per_dtype:
            if not _unavailable(run):
                body.append(f"<p>{_esc(run['label'])}: no results to plot.</p>")
            continue
        body.append("<div class='plots'>")
        for dtype in ("float16", "bfloat16", "float32", "float64"):
            if dtype in per_dtype:
                body.append("<div class='plot'>" + histogram_svg(np.concatenate(per_dtype[dtype]),
                                                                 f"{run['label']} {dtype}",
                                                                 floor=floors.get(dtype)) + "</div>")
        body.append("</div>")
    body.append("<h2>Worst error / bound per case</h2>")
    for run in runs:
        if any(isinstance(r.get("ratio"), (int, float)) for r in run["rows"]):
            body.append("<div class='plot'>" + worst_cases_svg(run["rows"], run["label"]) + "</div>")
    body.append("<h2>Worst cases</h2>")
    for run in runs:
        rows = sorted((r for r in run["rows"] if isinstance(r.get("ratio"), (int, float))),
                      key=lambda r: -r["ratio"])[:25]
        body.append(f"<h3>{_esc(run['label'])}</h3><table><tr><th>case</th><th>dtype</th><th>status</th>"
                    "<th>worst error/bound (rounding floor)</th><th>per output</th><th>ran (path / engine)</th></tr>")
        for r in rows:
            per = ", ".join(f"{k} {_fmt_ratio(v)}" for k, v in (r.get("ratios") or {}).items())
            body.append(f"<tr><td><code>{_esc(r['id'])}</code></td><td>{_esc(r['dtype'])}</td>"
                        f"<td class='{_esc(r['status'])}'>{_esc(r['status'])}</td>"
                        f"<td class='num'>{_esc(_with_floor(r['ratio'], r.get('floor')))}</td>"
                        f"<td class='small'>{_esc(per)}</td>"
                        f"<td class='small'>{_esc(r.get('ran', ''))}</td></tr>")
        body.append("</table>")
    problems = [(run["label"], r) for run in runs for r in run["rows"] if r["status"] in _FAILING + ("refused",)]
    problems.sort(key=lambda item: item[1]["status"] == "refused")     # failures, crashes and hangs first
    body.append("<h2>Failures, crashes, time-outs and refusals</h2>")
    if not problems:
        body.append("<p>None.</p>")
    else:
        body.append("<table><tr><th>backend</th><th>case</th><th>status</th><th>message</th><th>ran</th></tr>")
        for label, r in problems[:500]:
            body.append(f"<tr><td>{_esc(label)}</td><td><code>{_esc(r['id'])}</code></td>"
                        f"<td class='{_esc(r['status'])}'>{_esc(r['status'].replace('_', ' '))}</td>"
                        f"<td class='small'>{_esc(r.get('message', ''))[:2000]}{_stderr_html(r)}</td>"
                        f"<td class='small'>{_esc(r.get('ran', ''))}</td></tr>")
        body.append("</table>")
        if len(problems) > 500:
            body.append(f"<p>... and {len(problems) - 500} more.</p>")
    unavailable = {(run["label"], r.get("message", "")) for run in runs for r in run["rows"]
                   if r["status"] == "unavailable"}
    if unavailable:
        body.append("<h2>Unavailable</h2><ul>" + "".join(f"<li>{_esc(lbl)}: {_esc(msg)}</li>"
                                                          for lbl, msg in sorted(unavailable)) + "</ul>")
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>" + "".join(body) + "</body></html>")


def _stderr_html(row: dict) -> str:
    """A crashed or timed-out case's stderr tail, folded."""
    text = (row.get("stderr") or "").strip()
    if not text:
        return ""
    return f"<details><summary>stderr</summary><pre>{_esc(text[-4000:])}</pre></details>"


def write_report(path: str, title: str, runs: list[dict], intro: str = "", extra_html: str = "") -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(html_report(title, runs, intro, extra_html))
