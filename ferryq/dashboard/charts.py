"""The overview's charts as inline SVG, drawn on the server: no script, no library.

Only numbers and fixed words go into the markup (times are formatted here), and every
text is escaped all the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from markupsafe import Markup, escape

from ferryq.dashboard.views import seconds
from ferryq.ops.views import Activity, Bucket

WIDTH, HEIGHT = 720, 180
LEFT, RIGHT, TOP, BOTTOM = 48, 8, 10, 22
SERIES = (  # (field of Bucket, label, CSS class): stacked bottom to top
    ("succeeded", "succeeded", "c-ok"),
    ("failed", "failed attempts (retried)", "c-fail"),
    ("dead", "dead", "c-dead"),
    ("other", "cancelled or expired", "c-other"),
)


def throughput(activity: Activity) -> Markup:
    """Stacked bars: jobs finished per minute, and attempts that failed."""
    buckets = activity.buckets
    peak = max((b.finished + b.failed for b in buckets), default=0)
    top = _nice(peak)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / len(buckets)
    parts = [_frame("Jobs finished per minute, last hour"), *_y_axis(top, _count)]
    for i, bucket in enumerate(buckets):
        x = LEFT + i * step
        y: float = TOP + plot_h
        tip = [_clock(bucket.start)]
        for name, label, css in SERIES:
            value: int = getattr(bucket, name)
            if not value:
                continue
            height = plot_h * value / top
            y -= height
            width = max(step - 2, 1)
            parts.append(
                f'<rect class="{css}" x="{x + 1:.1f}" y="{y:.1f}" '
                f'width="{width:.1f}" height="{height:.1f}"/>'
            )
            tip.append(f"{value} {label}")
        if len(tip) > 1:
            title = escape(", ".join(tip))
            parts.append(
                f'<rect class="hit" x="{x:.1f}" y="{TOP}" width="{step:.1f}" '
                f'height="{plot_h}"><title>{title}</title></rect>'
            )
    parts += _x_axis(activity)
    parts.append("</svg>")
    return Markup("".join(parts))


def lag(activity: Activity) -> Markup:
    """Queue wait (claimed minus due) per minute: the median and the 95th percentile."""
    buckets = activity.buckets
    p50 = [b.wait(0.5) for b in buckets]
    p95 = [b.wait(0.95) for b in buckets]
    peak = max((v for v in p95 if v is not None), default=0.0)
    top = _nice(peak) if peak >= 1 else _nice_fraction(peak)
    parts = [_frame("Queue wait per minute (claimed minus due), last hour"),
             *_y_axis(top, seconds)]  # fmt: skip
    for values, css in ((p95, "l-p95"), (p50, "l-p50")):
        parts += _line(values, buckets, top, css)
    parts += _x_axis(activity)
    parts.append("</svg>")
    return Markup("".join(parts))


def _frame(label: str) -> str:
    return (f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
            f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">')  # fmt: skip


def _y_axis(top: float, fmt: Callable[[float], str]) -> list[str]:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    out = []
    for fraction in (0.0, 0.5, 1.0):
        y = TOP + plot_h * (1 - fraction)
        text = fmt(top * fraction)
        out.append(
            f'<line class="grid" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>'
        )
        out.append(f'<text class="axis" x="{LEFT - 6}" y="{y + 4:.1f}" '
                   f'text-anchor="end">{escape(text)}</text>')  # fmt: skip
    return out


def _x_axis(activity: Activity) -> list[str]:
    plot_w = WIDTH - LEFT - RIGHT
    y = HEIGHT - 6
    out = []
    for fraction, anchor in ((0.0, "start"), (0.5, "middle"), (1.0, "end")):
        ts = activity.since + (activity.now - activity.since) * fraction
        x = LEFT + plot_w * fraction
        out.append(f'<text class="axis" x="{x:.1f}" y="{y}" text-anchor="{anchor}">'
                   f"{escape(_clock(ts))}</text>")  # fmt: skip
    if not activity.complete:
        x = LEFT + plot_w * (activity.covers_from - activity.since) / (
            activity.now - activity.since
        )
        out.append(
            f'<line class="cut" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{HEIGHT - BOTTOM}">'
            "<title>sampled from here on</title></line>"
        )
    return out


def _line(
    values: Sequence[float | None], buckets: Sequence[Bucket], top: float, css: str
) -> list[str]:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / len(buckets)
    out: list[str] = []
    run: list[str] = []
    for i, value in enumerate([*values, None]):
        if value is None:
            if len(run) > 1:
                out.append(f'<polyline class="{css}" points="{" ".join(run)}"/>')
            elif len(run) == 1:
                cx, cy = run[0].split(",")
                out.append(f'<circle class="{css}" cx="{cx}" cy="{cy}" r="3"/>')
            run = []
            continue
        x = LEFT + (i + 0.5) * step
        y = TOP + plot_h * (1 - min(value / top, 1.0))
        run.append(f"{x:.1f},{y:.1f}")
    return out


def _count(value: float) -> str:
    return f"{value:g}"


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M")


def _nice(peak: float) -> float:
    """The smallest of 1, 2, 5 times 10^k at or above ``peak`` (at least 1)."""
    if peak <= 1:
        return 1.0
    exponent = 10 ** math.floor(math.log10(peak))
    for factor in (1, 2, 5, 10):
        if factor * exponent >= peak:
            return float(factor * exponent)
    return float(10 * exponent)


def _nice_fraction(peak: float) -> float:
    for top in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0):
        if peak <= top:
            return top
    return 1.0
