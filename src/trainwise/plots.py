"""Learning-curve plots: a cheap SVG written by trainwise itself, and a matplotlib PNG.

:func:`write_learning_curves_svg` is the cheap one: it builds the SVG text in pure Python (stdlib only, no
numpy, no matplotlib), so it takes a few milliseconds even for 1000 epochs and never pays for importing a
plotting library, laying out fonts or rasterising. :func:`plot_learning_curves` draws the same figure with
matplotlib and writes a PNG; in a fresh process the import, layout and ``savefig`` cost about 0.7 s, and
matplotlib is optional (without it, one line, :data:`PLOT_HINT`, says how to get it).

Both show the same content: training and validation loss per epoch, the ``monitor`` metric beside them (or
``val_accuracy`` when the monitor is a loss), and vertical lines at the best epoch and the overfitting onset.
Both write through :func:`~trainwise.files.atomic_write`: a failed write leaves the old file intact.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PLOT_HINT = "learning-curve plots need matplotlib: pip install 'trainwise[plot]'"

_LOSS_SERIES = (("train_loss", "training loss"), ("val_loss", "validation loss"))


def _monitor_panel(history: Sequence[dict[str, Any]], monitor: str | None) -> str | None:
    """The metric shown beside the loss panel, or None for no second panel.

    A monitor that is already on the loss panel (None, ``train_loss``, ``val_loss``) shows ``val_accuracy``
    instead when the history has it; any other monitor is shown when at least one record has it."""
    if monitor in (None, "train_loss", "val_loss"):
        monitor = "val_accuracy" if any("val_accuracy" in r for r in history) else None
    return monitor if monitor is not None and any(monitor in r for r in history) else None


def _finite(value: Any) -> bool:
    """A real, finite number (bools, None, strings, NaN and infinities are not)."""
    kind = type(value)
    if kind is float:  # the common cases, without the ABC check
        return math.isfinite(value)
    if kind is int:
        return True
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _epochs(history: Sequence[dict[str, Any]]) -> list[Any]:
    """Each record's epoch (its position, from 1, when a record has no usable ``epoch``)."""
    return [r["epoch"] if _finite(r.get("epoch")) else i for i, r in enumerate(history, 1)]


def _finite_points(history: Sequence[dict[str, Any]], key: str, epochs: Sequence[Any] | None = None
                   ) -> list[tuple[Any, float]]:
    """``(epoch, value)`` for each record whose ``key`` is a finite number; the others are skipped."""
    if epochs is None:
        epochs = _epochs(history)
    points = []
    for epoch, record in zip(epochs, history):
        value = record.get(key)
        if value is not None and _finite(value):
            points.append((epoch, float(value)))
    return points


def plot_learning_curves(
    history: Sequence[dict[str, Any]],
    path: str | os.PathLike[str],
    *,
    monitor: str | None = None,
    best_epoch: int | None = None,
    overfitting_epoch: int | None = None,
) -> Path:
    """Write a PNG of training and validation loss (and ``monitor``) per epoch, marking the best epoch and
    the overfitting onset. Raises ImportError with :data:`PLOT_HINT` when matplotlib is missing.

    About 0.7 s in a fresh process; :func:`write_learning_curves_svg` draws the same in a few milliseconds."""
    try:
        from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state
    except ImportError as exc:
        raise ImportError(PLOT_HINT) from exc

    epochs = _epochs(history)
    monitor = _monitor_panel(history, monitor)
    show_monitor = monitor is not None
    figure = Figure(figsize=(9 if show_monitor else 6, 4), dpi=100)
    axes = figure.subplots(1, 2 if show_monitor else 1, squeeze=False)[0]
    loss_axis = axes[0]
    for key, label in _LOSS_SERIES:
        points = _finite_points(history, key, epochs)
        if points:
            loss_axis.plot(*zip(*points, strict=True), marker="o", markersize=3, label=label)
    loss_axis.set_xlabel("epoch")
    loss_axis.set_ylabel("loss")
    loss_axis.set_title("loss")
    if show_monitor:
        points = _finite_points(history, monitor, epochs)
        axes[1].plot(*zip(*points, strict=True), marker="o", markersize=3, color="tab:green", label=monitor)
        axes[1].set_xlabel("epoch")
        axes[1].set_title(monitor)
    for axis in axes:
        if best_epoch is not None:
            axis.axvline(best_epoch, color="tab:green", linestyle="--", linewidth=1, label=f"best epoch {best_epoch}")
        if overfitting_epoch is not None:
            axis.axvline(
                overfitting_epoch, color="tab:red", linestyle=":", linewidth=1.5,
                label=f"overfitting from {overfitting_epoch}",
            )
        if epochs:
            axis.set_xlim(min(epochs) - 0.5, max(epochs) + 0.5)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    from trainwise.files import atomic_write

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(target, lambda file: figure.savefig(file, format="png"))


# --- SVG -------------------------------------------------------------------------------------------------

# matplotlib's tab10 colours, so that the SVG and the PNG look alike.
_BLUE, _ORANGE, _GREEN, _RED = "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"
_HEIGHT = 400
_TOP, _BOTTOM = 32, _HEIGHT - 46  # plot area's top and bottom edge in every panel
_RIGHT_MARGIN = 16
_MAX_MARKERS = 60  # more points than this: the line alone, markers would hide it
_CHAR_W = 6.0  # estimated width of one character at font-size 10 (sans-serif averages ~0.55 em)
_BIG = 1.7976931348623157e308
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")  # not allowed in XML 1.0


def _escape(text: str) -> str:
    """``xml.sax.saxutils.escape`` plus double quotes, without its import: it pulls in urllib.request, http and
    email, about 50 ms in a fresh process."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _text(value: Any, limit: int = 60) -> str:
    """``value`` as XML character data: escaped, characters XML forbids replaced, cut to ``limit`` chars."""
    text = _NOT_XML.sub("\ufffd", str(value))
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return _escape(text)


def _attr(value: Any) -> str:
    """``value`` as the inside of a double-quoted XML attribute."""
    text = _escape(_NOT_XML.sub("\ufffd", str(value)))
    return text.replace("\n", "&#10;").replace("\t", "&#9;").replace("\r", "&#13;")


def _nice_step(raw: float, steps: Sequence[float] = (1.0, 2.0, 5.0, 10.0)) -> float:
    """The smallest 1-2-5 step (times a power of ten) at least ``raw``."""
    exponent = math.floor(math.log10(raw))
    unit = 10.0**exponent
    if unit == 0.0 or not math.isfinite(unit):
        return raw
    fraction = raw / unit
    return next((s * unit for s in steps if s >= fraction * (1 - 1e-9)), 10.0 * unit)


def _labels(ticks: Sequence[float]) -> list[str]:
    """Compact tick labels (``.3g``), with more digits only where needed to tell neighbours apart."""
    labels: list[str] = []
    for precision in range(3, 18):
        labels = [f"{t:.{precision}g}" for t in ticks]
        if len(set(labels)) == len(labels):
            break
    return ["0" if label == "-0" else label for label in labels]


def _y_axis(values: Sequence[float]) -> tuple[float, float, list[float]]:
    """The y range (data plus 5% either side, never empty, never overflowing) and about 5 nice ticks."""
    if not values:
        low, high = 0.0, 1.0
    else:
        low, high = min(values), max(values)
        if high / 2 - low / 2 < 1e-300:  # one value (or all equal): give the axis a range around it
            center = low / 2 + high / 2
            pad = abs(center) * 0.05 if abs(center) >= 1e-300 else 0.05
            low, high = center - pad, center + pad
        else:
            margin = (high / 2 - low / 2) * 0.1  # 5% of the span, computed on halves: no overflow
            low, high = low - margin, high + margin
        low, high = max(low, -_BIG), min(high, _BIG)  # the margin may pass the largest float
    base = _nice_step((high / 2 - low / 2) * 0.4)  # about span / 5
    best: tuple[float, int, int] | None = None
    for step in (base / 2.5, base / 2, base, base * 2, base * 2.5):  # neighbouring 1-2-5 steps
        if not math.isfinite(step) or step <= 0:
            continue
        step = _nice_step(step)
        first, last = math.ceil(low / step), math.floor(high / step)
        if best is None or abs(last - first + 1 - 5) <= abs(best[2] - best[1] + 1 - 5):  # ties: the larger step
            best = (step, first, last)
    if best is None or best[2] - best[1] > 20:
        return low, high, [low, high]
    step, first, last = best
    return low, high, [k * step for k in range(first, last + 1)]


def _x_ticks(low: float, high: float, most: int) -> list[int]:
    """Integer epochs between ``low`` and ``high``, a 1-2-5 step apart, at most about ``most`` of them."""
    span = high - low
    step = max(1, int(_nice_step(max(span / max(most, 1), 1.0))))
    return list(range(math.ceil(low / step) * step, math.floor(high / step) * step + 1, step))


class _Panel:
    """One axes box of the SVG: maps epochs and values to pixels and writes its elements into ``out``."""

    def __init__(self, out: list[str], *, x0: float, width: float, title: str, ylabel: str | None,
                 x_range: tuple[float, float], values: Sequence[float]) -> None:
        self.out = out
        self.y_low, self.y_high, self.y_ticks = _y_axis(values)
        self.y_labels = _labels(self.y_ticks)
        label_width = max((len(s) for s in self.y_labels), default=1) * _CHAR_W
        self.left = x0 + (24 if ylabel else 8) + label_width + 8
        self.right = x0 + width - _RIGHT_MARGIN
        self.x_low, self.x_high = x_range
        self.x_scale = (self.right - self.left) / (self.x_high - self.x_low)
        self.y_half = self.y_high / 2
        self.y_scale = (_BOTTOM - _TOP) / (self.y_high / 2 - self.y_low / 2)
        self.x0, self.width, self.title, self.ylabel = x0, width, title, ylabel
        self.occupied: list[tuple[float, float]] = []  # pixels of the data, to place the legend

    def x(self, epoch: float) -> float:
        return self.left + (epoch - self.x_low) * self.x_scale

    def y(self, value: float) -> float:
        return _TOP + (self.y_half - value / 2) * self.y_scale

    def axes(self, x_ticks: Sequence[int]) -> None:
        """Title, grid, frame, ticks and their labels, axis titles."""
        out, left, right = self.out, self.left, self.right
        center = (left + right) / 2
        out.append(f'<text class="title" x="{center:.1f}" y="20" text-anchor="middle" font-size="13">'
                   f"{_text(self.title)}</text>\n")
        grid, marks, texts = [], [], []
        for tick in x_ticks:
            px = self.x(tick)
            grid.append(f"M{px:.1f} {_TOP}V{_BOTTOM}")
            marks.append(f"M{px:.1f} {_BOTTOM}v4")
            texts.append(f'<text x="{px:.1f}" y="{_BOTTOM + 15}" text-anchor="middle">{tick}</text>')
        for tick, label in zip(self.y_ticks, self.y_labels):
            py = self.y(tick)
            grid.append(f"M{left:.1f} {py:.1f}H{right:.1f}")
            marks.append(f"M{left:.1f} {py:.1f}h-4")
            texts.append(f'<text x="{left - 6:.1f}" y="{py + 3.5:.1f}" text-anchor="end">{_escape(label)}</text>')
        out.append(f'<path class="grid" d="{"".join(grid)}" stroke="#b0b0b0" stroke-opacity="0.4" '
                   'stroke-width="0.8" fill="none"/>\n')
        out.append(f'<rect class="frame" x="{left:.1f}" y="{_TOP}" width="{right - left:.1f}" '
                   f'height="{_BOTTOM - _TOP}" fill="none" stroke="#333" stroke-width="0.8"/>\n')
        out.append(f'<path class="tick-marks" d="{"".join(marks)}" stroke="#333" stroke-width="0.8"/>\n')
        out.append(f'<g class="tick-labels" font-size="10" fill="#333">{"".join(texts)}</g>\n')
        out.append(f'<text class="xlabel" x="{center:.1f}" y="{_HEIGHT - 10}" text-anchor="middle" '
                   'font-size="11">epoch</text>\n')
        if self.ylabel:
            mid = (_TOP + _BOTTOM) / 2
            out.append(f'<text class="ylabel" x="{self.x0 + 14:.1f}" y="{mid:.1f}" text-anchor="middle" '
                       f'font-size="11" transform="rotate(-90 {self.x0 + 14:.1f} {mid:.1f})">'
                       f"{_text(self.ylabel)}</text>\n")

    def series(self, key: str, points: Sequence[tuple[float, float]], color: str) -> None:
        """One line with small circle markers (markers only up to ``_MAX_MARKERS`` points)."""
        left, x_low, x_scale, y_half, y_scale = self.left, self.x_low, self.x_scale, self.y_half, self.y_scale
        pixels = [(left + (e - x_low) * x_scale, _TOP + (y_half - v / 2) * y_scale) for e, v in points]
        self.occupied.extend(pixels)
        coords = " ".join([f"{px:.1f},{py:.1f}" for px, py in pixels])
        self.out.append(f'<polyline class="series" data-key="{_attr(key)}" points="{coords}" fill="none" '
                        f'stroke="{color}" stroke-width="1.5" stroke-linejoin="round"/>\n')
        if pixels and len(pixels) <= _MAX_MARKERS:
            dots = "".join([f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.5"/>' for px, py in pixels])
            self.out.append(f'<g class="markers" data-key="{_attr(key)}" fill="{color}">{dots}</g>\n')

    def vline(self, epoch: float, css: str, label: str, color: str, dash: str, width: float) -> None:
        px = self.x(epoch)
        self.out.append(f'<line class="{css}" x1="{px:.1f}" y1="{_TOP}" x2="{px:.1f}" y2="{_BOTTOM}" '
                        f'stroke="{color}" stroke-width="{width}" stroke-dasharray="{dash}">'
                        f"<title>{_text(label)}</title></line>\n")

    def legend(self, entries: Sequence[tuple[str, str, str, bool]]) -> None:
        """``(label, colour, dash, marker)`` rows in the corner of the plot area with the least data."""
        if not entries:
            return
        row = 14
        width = 42 + max(min(len(label), 40) for label, *_ in entries) * _CHAR_W
        height = 8 + row * len(entries)
        inset = 6
        corners = [  # matplotlib's order of preference: upper right, upper left, lower left, lower right
            (self.right - inset - width, _TOP + inset), (self.left + inset, _TOP + inset),
            (self.left + inset, _BOTTOM - inset - height), (self.right - inset - width, _BOTTOM - inset - height),
        ]

        sample = self.occupied[:: max(1, len(self.occupied) // 300)]  # enough to judge, cheap for 1000 epochs

        def covered(corner: tuple[float, float]) -> int:
            cx, cy = corner
            return sum(1 for px, py in sample if cx <= px <= cx + width and cy <= py <= cy + height)

        lx, ly = min(corners, key=covered)
        parts = [f'<g class="legend" font-size="10"><rect x="{lx:.1f}" y="{ly:.1f}" width="{width:.1f}" '
                 f'height="{height}" rx="3" fill="white" fill-opacity="0.85" stroke="#ccc" stroke-width="0.8"/>']
        for i, (label, color, dash, marker) in enumerate(entries):
            cy = ly + 4 + row * i + row / 2
            dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
            parts.append(f'<line x1="{lx + 6:.1f}" y1="{cy:.1f}" x2="{lx + 28:.1f}" y2="{cy:.1f}" '
                         f'stroke="{color}" stroke-width="1.5"{dash_attr}/>')
            if marker:
                parts.append(f'<circle cx="{lx + 17:.1f}" cy="{cy:.1f}" r="2.5" fill="{color}"/>')
            parts.append(f'<text x="{lx + 34:.1f}" y="{cy + 3.5:.1f}">{_text(label, 40)}</text>')
        parts.append("</g>\n")
        self.out.append("".join(parts))


def write_learning_curves_svg(
    history: Sequence[dict[str, Any]],
    path: str | os.PathLike[str],
    *,
    monitor: str | None = None,
    best_epoch: int | None = None,
    overfitting_epoch: int | None = None,
) -> Path:
    """Write an SVG of training and validation loss (and ``monitor``) per epoch, marking the best epoch and
    the overfitting onset: the figure of :func:`plot_learning_curves`, in pure Python, in a few milliseconds.

    ``monitor`` follows the same rule as the PNG: a loss (or None) shows ``val_accuracy`` beside the loss
    panel when the history has it. Values that are missing, None, NaN or infinite are skipped (the line joins
    the epochs around them). The file is 900x400 with the second panel, 600x400 without, and is written
    atomically (UTF-8); an empty history gives a valid SVG that says "no epochs"."""
    svg = _render_svg(history, monitor=monitor, best_epoch=best_epoch, overfitting_epoch=overfitting_epoch)
    data = svg.encode("utf-8")
    from trainwise.files import atomic_write

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(target, lambda file: file.write(data))


def _render_svg(history: Sequence[dict[str, Any]], *, monitor: str | None, best_epoch: Any,
                overfitting_epoch: Any) -> str:
    monitor = _monitor_panel(history, monitor)
    width = 900 if monitor is not None else 600
    title = "learning curves: loss" + (f" and {monitor}" if monitor is not None else "")
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>\n',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{_HEIGHT}" '
        f'viewBox="0 0 {width} {_HEIGHT}" font-family="sans-serif">\n',
        f"<title>{_text(title, 200)}</title>\n",
        f'<rect width="{width}" height="{_HEIGHT}" fill="white"/>\n',
    ]
    if not history:
        out.append(f'<text class="empty" x="{width / 2:.0f}" y="{_HEIGHT / 2:.0f}" text-anchor="middle" '
                   'font-size="14" fill="#555">learning curves: no epochs</text>\n</svg>\n')
        return "".join(out)

    epochs = _epochs(history)
    lines = []  # (epoch, css class, label, colour, dash, width), drawn in every panel
    if _finite(best_epoch):
        lines.append((best_epoch, "best-epoch", f"best epoch {best_epoch}", _GREEN, "5,3", 1.0))
    if _finite(overfitting_epoch):
        lines.append((overfitting_epoch, "overfitting", f"overfitting from {overfitting_epoch}", _RED, "1.5,2.5",
                      1.5))
    marked = [e for e, *_ in lines]
    x_range = (min([*epochs, *marked]) - 0.5, max([*epochs, *marked]) + 0.5)

    loss_series = [(key, label, _finite_points(history, key, epochs), color)
                   for (key, label), color in zip(_LOSS_SERIES, (_BLUE, _ORANGE))]
    panels = [("loss", "loss", [s for s in loss_series if s[2]])]
    if monitor is not None:
        panels.append((monitor, None, [(monitor, monitor, _finite_points(history, monitor, epochs), _GREEN)]))
    panel_width = width / len(panels)
    for index, (panel_title, ylabel, series) in enumerate(panels):
        values = [v for *_, points, _color in series for _e, v in points]
        x0 = index * panel_width
        out.append(f'<g class="panel" data-key="{_attr(panel_title)}">\n')
        panel = _Panel(out, x0=x0, width=panel_width, title=panel_title, ylabel=ylabel, x_range=x_range,
                       values=values)
        most_ticks = max(2, int((panel.right - panel.left) // 40))
        panel.axes(_x_ticks(math.ceil(x_range[0]), math.floor(x_range[1]), most_ticks))
        for key, _label, points, color in series:
            panel.series(key, points, color)
        if not values:
            out.append(f'<text class="no-data" x="{(panel.left + panel.right) / 2:.1f}" '
                       f'y="{(_TOP + _BOTTOM) / 2:.1f}" text-anchor="middle" font-size="11" fill="#777">'
                       "no finite values</text>\n")
        for epoch, css, label, color, dash, line_width in lines:
            panel.vline(epoch, css, label, color, dash, line_width)
        panel.legend([(label, color, "", True) for _key, label, _points, color in series]
                     + [(label, color, dash, False) for _e, _css, label, color, dash, _w in lines])
        out.append("</g>\n")
    out.append("</svg>\n")
    return "".join(out)
