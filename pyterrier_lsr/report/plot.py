"""The report plot: a measure against a cost, one numbered marker per system, a legend naming every number.

Points whose markers would cover each other (a PISA and a BMP row of one model often have the same nDCG and almost
the same postings) share one marker; its numbers are joined into one label set beside it (never stacked on the
marker), placed by :func:`place_labels` where it covers no marker and no other label, with a leader line to its
marker.
"""
from collections.abc import Sequence

import numpy as np
import pandas as pd

from ..core.extras import import_extra

MARKER_PT = 14  # marker diameter (points); markers whose centres are closer than this would cover each other
LABEL_PT = 7  # font size of the numbers
# a label box's size in font sizes: digits and commas are at most 0.62 em wide in matplotlib's default font, the box
# pads 0.2 em on each side; over-estimated a little so that boxes that do not overlap here do not overlap drawn
CHAR_EM, PAD_EM, HEIGHT_EM = 0.65, 0.45, 1.7
DIRECTIONS = ((1, 1), (-1, 1), (1, -1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1))
RINGS = 6  # distances tried per direction, each a marker radius further out

Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in pixels


def _clusters(pixels: np.ndarray, radius: float) -> list[list[int]]:
    """Indices of points grouped greedily: a point joins the first group whose first point is within ``radius``
    (pixels)."""
    groups: list[list[int]] = []
    for i, p in enumerate(pixels):
        if not np.isfinite(p).all():
            continue  # a NaN coordinate (e.g. BM25's encode_ms) is not drawn
        for g in groups:
            if np.hypot(*(pixels[g[0]] - p)) < radius:
                g.append(i)
                break
        else:
            groups.append([i])
    return groups


def _overlaps(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def label_size(text: str, points_to_pixels: float) -> tuple[float, float]:
    """Width and height (pixels) of the box of a label ``text`` at :data:`LABEL_PT`."""
    em = LABEL_PT * points_to_pixels
    return (len(text) * CHAR_EM + 2 * PAD_EM) * em, HEIGHT_EM * em


def place_labels(centres: Sequence[tuple[float, float]], labels: Sequence[str | None], diameter: float,
                 points_to_pixels: float, bounds: Box | None = None) -> list[tuple[float, float] | None]:
    """Where each marker's label goes: for a marker (centre in pixels) with a ``labels`` text, the offset (pixels)
    from its centre to the centre of its label box; ``None`` where the label is ``None`` (a single point's number
    sits inside its marker). The first of :data:`DIRECTIONS`, at growing distances, where the box covers no marker
    and no label placed before it wins, one inside ``bounds`` (the axes, in pixels) first; when there is none, the
    first candidate."""
    radius = diameter / 2
    taken: list[Box] = [(x - radius, y - radius, x + radius, y + radius) for x, y in centres]
    offsets: list[tuple[float, float] | None] = []
    for (x, y), text in zip(centres, labels):
        if text is None:
            offsets.append(None)
            continue
        width, height = label_size(text, points_to_pixels)
        candidates = [(dx * (radius + width / 2 + ring * radius), dy * (radius + height / 2 + ring * radius))
                      for ring in range(RINGS) for dx, dy in DIRECTIONS]

        def box(offset):
            cx, cy = x + offset[0], y + offset[1]
            return cx - width / 2, cy - height / 2, cx + width / 2, cy + height / 2

        def inside(b: Box) -> bool:
            return bounds is None or (b[0] >= bounds[0] and b[1] >= bounds[1] and b[2] <= bounds[2]
                                      and b[3] <= bounds[3])
        free = [c for c in candidates if not any(_overlaps(box(c), t) for t in taken)]
        offset = next((c for c in free if inside(box(c))), free[0] if free else candidates[0])
        taken.append(box(offset))
        offsets.append(offset)
    return offsets


def figure(table: pd.DataFrame, y: str, x: str, title: str = ''):
    """The report plot: ``y`` vs ``x``, one line per system group (the name before ``' @ '``), each point a numbered
    marker; the legend, outside the axes, names every number. Points that would cover each other share one marker
    whose numbers, joined, label it from beside (:func:`place_labels`), so no number sits on another."""
    matplotlib = import_extra('report', 'matplotlib', needed_for='the report plot')
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, ax = plt.subplots(figsize=(8, 5.5))
    groups = table['name'].str.split(' @ ').str[0]
    colours = plt.rcParams['axes.prop_cycle'].by_key()['color']
    colour_of = {group: colours[i % len(colours)] for i, group in enumerate(dict.fromkeys(groups))}
    for group, colour in colour_of.items():
        part = table[groups == group].sort_values(x)
        ax.plot(part[x], part[y], color=colour, alpha=0.5, linewidth=1.2)
    xs, ys = table[x].to_numpy(float), table[y].to_numpy(float)
    if (xs > 0).all() and xs.max() > 10 * xs.min():
        ax.set_xscale('log')
        ax.xaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f'{v:g}'))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.margins(0.08)
    ax.set_xlabel(x.replace('_', ' '))
    ax.set_ylabel(y)
    ax.set_title(title or f'{y} vs {x.replace("_", " ")}')
    ax.grid(alpha=0.3)
    handles = [
        Line2D([], [], marker='o', linestyle='none', color=colour_of[group], markersize=7, label=f'{number}  {name}')
        for number, (name, group) in enumerate(zip(table['name'], groups), start=1)
    ]
    ax.legend(handles=handles, loc='upper left', bbox_to_anchor=(1.02, 1), fontsize=8, frameon=False)
    fig.tight_layout()
    ax.autoscale_view()
    ax.set_autoscale_on(False)  # the layout is final: marker distances in pixels are those of the saved figure
    points_to_pixels = fig.dpi / 72
    pixels = ax.transData.transform(np.column_stack([xs, ys]))
    clusters = _clusters(pixels, MARKER_PT * points_to_pixels)
    numbers = [','.join(str(m + 1) for m in members) for members in clusters]
    offsets = place_labels([tuple(pixels[members[0]]) for members in clusters],
                           [None if len(members) == 1 else text for members, text in zip(clusters, numbers)],
                           MARKER_PT * points_to_pixels, points_to_pixels, tuple(ax.get_window_extent().extents))
    for members, text, offset in zip(clusters, numbers, offsets):
        point = (xs[members[0]], ys[members[0]])
        shared = {colour_of[groups.iloc[m]] for m in members}
        colour = shared.pop() if len(shared) == 1 else 'grey'  # points of several groups: no group's colour
        ax.plot(*point, marker='o', markersize=MARKER_PT, color=colour, linestyle='none')
        if offset is None:
            ax.annotate(text, point, ha='center', va='center', fontsize=LABEL_PT, color='white', fontweight='bold')
        else:
            ax.annotate(text, point, xytext=offset, textcoords='offset pixels', ha='center', va='center',
                        fontsize=LABEL_PT, bbox=dict(boxstyle='round,pad=0.2', facecolor='white', edgecolor=colour),
                        arrowprops=dict(arrowstyle='-', color=colour, linewidth=0.8, shrinkA=0, shrinkB=0))
    return fig
