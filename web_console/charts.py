"""Figures over the last hour as small inline SVGs (no script, no external asset), each with
a text alternative: a queue's depth, its message rates, a node's bytes stored."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

from .monitor import COUNTERS, RatePoint

WIDTH = 600
HEIGHT = 120
PAD = 4
# One colour and label per rate line (the legend names them; the text alternative says all).
RATE_LINES = {
    "sent": ("#0969da", "sent"),
    "delivered": ("#8250df", "delivered"),
    "acked": ("#1a7f37", "acked"),
    "dead_lettered": ("#cf222e", "dead-lettered"),
}


def _axes(
    now: float, span_s: float, peak: float
) -> tuple[Callable[[float], float], Callable[[float], float]]:
    start = now - span_s

    def x(t: float) -> float:
        return PAD + (WIDTH - 2 * PAD) * max(0.0, min(1.0, (t - start) / span_s))

    def y(v: float) -> float:
        return HEIGHT - PAD - (HEIGHT - 2 * PAD) * v / peak

    return x, y


def _svg(summary: str, lines: str) -> str:
    return (
        f'<svg class="chart" role="img" aria-label="{escape(summary)}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="100%" height="{HEIGHT}" preserveAspectRatio="none">'
        f"<title>{escape(summary)}</title>{lines}</svg>"
    )


def line_chart(
    points: Sequence[tuple[float, int]],
    now: float,
    span_s: float = 3600.0,
    *,
    what: str = "Depth",
    show: Callable[[float], str] = lambda v: f"{v:g}",
) -> str:
    """An SVG line of ``(time, value)`` over ``[now - span_s, now]``, with a text alternative."""
    if not points:
        return '<p class="muted">No samples yet.</p>'
    peak = max(1, max(v for _, v in points))
    x, y = _axes(now, span_s, peak)
    path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
    if len(points) == 1:
        path = f"{x(now - span_s):.1f},{y(points[0][1]):.1f} {path}"
    summary = (
        f"{what} over the last hour: now {show(points[-1][1])}, peak {show(peak)}, {len(points)} samples."
    )
    line = f'<polyline fill="none" stroke="currentColor" stroke-width="2" points="{path}"/>'
    return _svg(summary, line) + f'<p class="muted">{escape(summary)}</p>'


def depth_chart(points: Sequence[tuple[float, int]], now: float, span_s: float = 3600.0) -> str:
    return line_chart(points, now, span_s, what="Depth")


def rates_chart(points: Sequence[RatePoint], now: float, span_s: float = 3600.0) -> str:
    """Sent, delivered, acked and dead-lettered per second, one line each, with a legend."""
    if not points:
        return '<p class="muted">No rates yet: they need two samples.</p>'
    peak = max(1.0, max(p.of(c) for p in points for c in COUNTERS))
    x, y = _axes(now, span_s, peak)
    lines = []
    legend = []
    for counter in COUNTERS:
        colour, label = RATE_LINES[counter]
        path = " ".join(f"{x(p.at):.1f},{y(p.of(counter)):.1f}" for p in points)
        if len(points) == 1:
            path = f"{x(now - span_s):.1f},{y(points[0].of(counter)):.1f} {path}"
        lines.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{path}" data-rate="{counter}"/>'
        )
        now_value = points[-1].of(counter)
        peak_value = max(p.of(counter) for p in points)
        legend.append(
            f'<li><span class="swatch" style="background:{colour}"></span>{label} '
            f'<span data-rate-now="{counter}">{now_value:.1f}</span>/s (peak {peak_value:.1f}/s)</li>'
        )
    last = points[-1]
    summary = (
        f"Messages per second over the last hour, {len(points)} intervals: now "
        + ", ".join(f"{RATE_LINES[c][1]} {last.of(c):.1f}" for c in COUNTERS)
        + f"; the chart's top is {peak:.1f}/s."
    )
    return _svg(summary, "".join(lines)) + f'<ul class="legend">{"".join(legend)}</ul>'
