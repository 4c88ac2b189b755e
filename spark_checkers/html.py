"""report.html: one self-contained file (inline CSS and SVG plots, no scripts, no network) for auditors."""

from __future__ import annotations

import html
import io
from typing import Any

COLOURS = {"pass": "#1a7f37", "fail": "#cf222e", "unknown": "#9a6700", "not_applicable": "#6e7781", "allowed": "#0969da"}


def _esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _secs(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def render_html(report: dict[str, Any]) -> str:
    rows = []
    for item in report["invariants"]:
        colour = COLOURS.get(item["verdict"], "#000")
        note = item.get("reason") or ""
        if item.get("allowed"):
            note = "allowed: " + note
        rows.append(f"<tr><td><a href='#{_esc(item['id'])}'>{_esc(item['id'])}</a></td><td>{_esc(item['title'])}</td>"
                    f"<td style='color:{colour};font-weight:bold'>{_esc(item['verdict'])}</td>"
                    f"<td class='n'>{item['count']}</td><td>{_esc(note)}</td></tr>")
    sections = []
    for item in report["invariants"]:
        if not item.get("witnesses") and item["verdict"] != "unknown":
            continue
        shown = len(item.get("witnesses", []))
        bullets = "".join(f"<li>{_esc(w['text'])}</li>" for w in item.get("witnesses", []))
        extra = ""
        if item.get("details", {}).get("positions"):
            extra = "<p>gaps by position (of the lost messages shown): " + ", ".join(
                f"{_esc(k)}: {v}" for k, v in item["details"]["positions"].items()) + "</p>"
        sections.append(f"<section id='{_esc(item['id'])}'><h3>{_esc(item['id'])} — {_esc(item['verdict'])}</h3>"
                        f"<p>{_esc(item.get('reason') or '')}</p><p>{item['count']} in total; the smallest "
                        f"{shown} shown.</p>{extra}<ol>{bullets}</ol></section>")
    faults = "".join(
        f"<tr><td>{_esc(f['fault_id'])}</td><td>{_esc(f['kind'])}</td><td>{_esc(f['node'])}</td>"
        f"<td class='n'>{f['t_start_s']:.3f}</td><td class='n'>{_secs(f['t_heal_s'])}"
        f"</td><td>{_esc(f['bit'])}</td><td>{_esc(f.get('error') or '')}</td></tr>" for f in report.get("faults", []))
    counts = "".join(f"<tr><td>{_esc(k)}</td><td class='n'>{v}</td></tr>" for k, v in sorted(report.get("counts", {}).items()))
    env = report.get("environment", {})
    history = report.get("history", {})
    overall = report["verdict"]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Ordeal report — {_esc(overall)}</title>
<style>
body{{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#1f2328}}
table{{border-collapse:collapse;margin:1em 0}} td,th{{border:1px solid #d0d7de;padding:4px 8px;vertical-align:top}}
th{{background:#f6f8fa}} td.n{{text-align:right;font-variant-numeric:tabular-nums}}
h1 span{{color:{COLOURS.get(overall, '#000')}}} section{{margin:1.5em 0}} li{{margin:.4em 0}}
.plots svg{{max-width:100%;height:auto}} small{{color:#57606a}}
</style></head><body>
<h1>Ordeal invariant report: <span>{_esc(overall)}</span> (exit {report['exit_code']})</h1>
<p><small>run {_esc(report['run_dir'])} · checker {_esc(report['checker_version'])} · history sha256
{_esc(history.get('hash_sha256', ''))[:16]}… · Spark {_esc(env.get('spark_master'))} · checked in
{_esc(env.get('check_seconds'))} s</small></p>
{''.join(f"<p><b>Note:</b> {_esc(n)}</p>" for n in report.get("notes", []))}
<h2>What the target promises</h2><pre>{_esc((report.get('guarantees') or {}).get('promises'))}</pre>
<h2>Verdicts</h2>
<table><tr><th>invariant</th><th>meaning</th><th>verdict</th><th>count</th><th>note</th></tr>{''.join(rows)}</table>
<h2>Witnesses</h2>{''.join(sections) or '<p>No violations.</p>'}
<h2>Traffic over time</h2><div class="plots">{_plots(report)}</div>
<h2>Faults</h2><table><tr><th>id</th><th>kind</th><th>node</th><th>start s</th><th>heal s</th><th>bit</th><th>error</th></tr>
{faults}</table>
<h2>Counts</h2><table>{counts}</table>
<h2>Guarantees declared</h2><pre>{_esc(report.get('guarantees'))}</pre>
</body></html>
"""


def _plots(report: dict[str, Any]) -> str:
    series = report.get("series") or {}
    if not series or not any(series.get(k) for k in ("acked_per_s", "delivered_per_s", "owed_unseen")):
        return "<p>No traffic recorded.</p>"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return "<p>matplotlib is not installed: no plots.</p>"
    plt.rcParams["svg.fonttype"] = "none"
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    panels = [
        (axes[0], [("acked_per_s", "publishes acked / s"), ("delivered_per_s", "first deliveries / s")], "msg/s"),
        (axes[1], [("latency_p50_ms", "latency p50"), ("latency_p99_ms", "latency p99")], "ms"),
        (axes[2], [("owed_unseen", "owed but not yet seen")], "messages"),
    ]
    for ax, lines, unit in panels:
        for key, label in lines:
            points = series.get(key) or []
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], label=label, drawstyle="steps-post")
        for fault in report.get("faults", []):
            end = fault["t_heal_s"] if fault["t_heal_s"] is not None else fault["t_start_s"] + series.get("bucket_s", 1)
            ax.axvspan(fault["t_start_s"], end, color="#cf222e", alpha=0.15)
        ax.set_ylabel(unit)
        ax.legend(loc="upper right", fontsize=8)
    axes[2].set_xlabel("seconds since run start (fault periods shaded)")
    fig.tight_layout()
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    plt.close(fig)
    svg = buffer.getvalue()
    return svg[svg.find("<svg"):]
