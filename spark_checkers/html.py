"""report.html: one self-contained file (inline CSS and SVG plots, no scripts, no network) for auditors."""

from __future__ import annotations

import io
import json
from typing import Any

import jinja2

from spark_checkers.reports import covers_words, declaration_rows, history_state, statement_of

COLOURS = {"pass": "#1a7f37", "fail": "#cf222e", "unknown": "#9a6700", "not_applicable": "#6e7781", "allowed": "#0969da"}


_ENVIRONMENT = jinja2.Environment(
    loader=jinja2.PackageLoader("spark_checkers", "templates"),
    autoescape=True,  # every value is escaped: witnesses and reasons carry broker-supplied text
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
)


def prepare() -> None:
    """Import the plotting library and compile the template: called in a thread while a check runs on the Spark
    server (the command waits then), so that writing report.html after it pays neither (``ordeal check``'s
    whole-command time; benchmarks/checkers.py).  A failure here is left to the real render to raise."""
    try:
        _ENVIRONMENT.get_template("report.html.j2")
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
    except Exception:  # noqa: BLE001, S110 - render_html meets the same error and reports it
        pass


def render_html(report: dict[str, Any]) -> str:
    sections = [item for item in report["invariants"] if item.get("witnesses") or item["verdict"] in ("fail", "unknown")]
    return _ENVIRONMENT.get_template("report.html.j2").render(
        report=_Lenient(report), history=_Lenient(report.get("history") or {}),
        env=_Lenient(report.get("environment") or {}), sections=[_Lenient(i) for i in sections],
        failing=[_Lenient(i) for i in report["invariants"] if i["verdict"] == "fail"],
        declaration=declaration_rows(report.get("guarantees")), statement_of=statement_of,
        covers_words=covers_words, history_state=history_state(report),
        guarantees_json=json.dumps(report.get("guarantees"), indent=2, sort_keys=True, default=str),
        colours=COLOURS, plots=_plots(report))


class _Lenient(dict):
    """A report mapping whose missing optional keys read as None in the template (reports from older
    checkers lack some); StrictUndefined still catches a misspelt name."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # __html__ and friends: not report keys
            raise AttributeError(name)
        value = self.get(name)
        if isinstance(value, dict) and not isinstance(value, _Lenient):
            return _Lenient(value)
        if isinstance(value, list):
            return [_Lenient(v) if isinstance(v, dict) else v for v in value]
        return value


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
