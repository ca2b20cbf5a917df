"""A queue's depth over the last hour as a small inline SVG (no script, no external asset)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH = 600
HEIGHT = 120
PAD = 4


def depth_chart(points: Sequence[tuple[float, int]], now: float, span_s: float = 3600.0) -> str:
    """An SVG line of ``(time, depth)`` over ``[now - span_s, now]``, with a text alternative."""
    if not points:
        return '<p class="muted">No samples yet.</p>'
    peak = max(1, max(d for _, d in points))
    start = now - span_s

    def x(t: float) -> float:
        return PAD + (WIDTH - 2 * PAD) * max(0.0, min(1.0, (t - start) / span_s))

    def y(d: int) -> float:
        return HEIGHT - PAD - (HEIGHT - 2 * PAD) * d / peak

    path = " ".join(f"{x(t):.1f},{y(d):.1f}" for t, d in points)
    if len(points) == 1:
        path = f"{x(start):.1f},{y(points[0][1]):.1f} {path}"
    summary = f"Depth over the last hour: now {points[-1][1]}, peak {peak}, {len(points)} samples."
    return (
        f'<svg class="chart" role="img" aria-label="{escape(summary)}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="100%" height="{HEIGHT}" preserveAspectRatio="none">'
        f"<title>{escape(summary)}</title>"
        f'<polyline fill="none" stroke="currentColor" stroke-width="2" points="{path}"/></svg>'
        f'<p class="muted">{escape(summary)}</p>'
    )
