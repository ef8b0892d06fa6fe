"""Plots as inline SVG: a horizontal bar chart and a histogram, drawn here (no plotting library, no script).

Labels are escaped like every other text of the report; numbers are formatted by the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape as _html_escape

from common.text import printable


def escape(value: str) -> str:
    """``value`` as HTML text with its control and bidi characters shown as escapes (as ``html.esc``)."""
    return _html_escape(printable(value), quote=True)


_FONT = 'font-family="system-ui, sans-serif" font-size="12"'


def bar_chart(rows: Sequence[tuple[str, float, str]], width: int = 640, bar_height: int = 18, title: str = "") -> str:
    """Horizontal bars for ``(label, value in [0, 1], annotation)`` rows, one per line.

    Args:
        rows: label, the bar's length as a share of the full width, and the text written after it.
        width: total width in pixels.
        bar_height: height of one bar.
        title: the plot's accessible name.
    """
    label_width, note_width = 220, 150
    plot = max(40, width - label_width - note_width)
    height = len(rows) * (bar_height + 6) + 6
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{escape(title)}" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" {_FONT}>'
    ]
    for i, (label, value, note) in enumerate(rows):
        y = 6 + i * (bar_height + 6)
        share = min(1.0, max(0.0, value))
        parts.append(
            f'<text x="{label_width - 8}" y="{y + bar_height - 5}" text-anchor="end">{escape(label)}</text>'
            f'<rect x="{label_width}" y="{y}" width="{plot}" height="{bar_height}" fill="#eef1f5"/>'
            f'<rect class="bar" x="{label_width}" y="{y}" width="{share * plot:.1f}" height="{bar_height}" '
            f'fill="#3b7dd8"><title>{escape(label)}: {escape(note)}</title></rect>'
            f'<text x="{label_width + plot + 8}" y="{y + bar_height - 5}">{escape(note)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def histogram(
    counts: Sequence[int],
    low: float,
    high: float,
    x_label: str,
    tick: str = "{:.2f}",
    width: int = 640,
    height: int = 200,
    title: str = "",
) -> str:
    """Columns of ``counts`` over equal bins spanning ``[low, high]``.

    Args:
        counts: sessions per bin, lowest bin first.
        low: left edge of the first bin.
        high: right edge of the last bin.
        x_label: what the horizontal axis measures.
        tick: format of the axis' edge values.
        width: total width in pixels.
        height: total height in pixels.
        title: the plot's accessible name.
    """
    left, bottom, top = 48, 36, 10
    plot_w, plot_h = width - left - 10, height - bottom - top
    peak = max(counts) if counts else 0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{escape(title)}" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" {_FONT}>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#888"/>',
        f'<text x="{left - 6}" y="{top + 10}" text-anchor="end">{peak}</text>',
        f'<text x="{left - 6}" y="{top + plot_h}" text-anchor="end">0</text>',
    ]
    n = max(1, len(counts))
    column = plot_w / n
    step = (high - low) / n
    for i, count in enumerate(counts):
        h = plot_h * count / peak if peak else 0.0
        x = left + i * column
        edge_low, edge_high = low + i * step, low + (i + 1) * step
        parts.append(
            f'<rect class="bin" x="{x + 1:.1f}" y="{top + plot_h - h:.1f}" width="{max(column - 2, 1):.1f}" '
            f'height="{h:.1f}" fill="#3b7dd8"><title>{escape(tick.format(edge_low))}–'
            f"{escape(tick.format(edge_high))}: {count}</title></rect>"
        )
    parts += [
        f'<text x="{left}" y="{top + plot_h + 16}">{escape(tick.format(low))}</text>',
        f'<text x="{left + plot_w}" y="{top + plot_h + 16}" text-anchor="end">{escape(tick.format(high))}</text>',
        f'<text x="{left + plot_w / 2:.0f}" y="{height - 4}" text-anchor="middle">{escape(x_label)}</text>',
        "</svg>",
    ]
    return "".join(parts)
