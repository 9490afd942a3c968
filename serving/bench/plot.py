"""Bench receipts as one PNG: decode speed by concurrency with every repeat shown (the spread a
mean hides), prefill tok/s, and acceptance length where the server speculated. The numbers come
from the receipts' samples as `make bench` recorded them; nothing is recomputed or smoothed.

matplotlib is imported inside `write_png` with its file-only backend (Agg): over SSH there is no
display, and the receipt readers that import this module do not pay for it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.receipt import DECODE_SPEEDS, decode_speed


@dataclass(frozen=True)
class Series:
    """One receipt's points of one panel: x -> the repeats' values."""

    label: str
    points: dict[int, list[float]]

    def medians(self) -> tuple[list[int], list[float]]:
        xs = sorted(self.points)
        return xs, [statistics.median(self.points[x]) for x in xs]


def _series(label: str, receipt: dict[str, Any], kind: str, key: str) -> Series:
    """Every sample of `receipt`'s cells of `kind` holding `key`, by concurrency (decode) or
    prompt tokens (prefill); failed samples left out."""
    points: dict[int, list[float]] = {}
    for cell in receipt["cells"].values():
        if cell["kind"] != kind:
            continue
        for sample in cell["samples"]:
            x = sample.get("concurrency") if kind == "decode" else sample.get("prompt_tokens")
            value = sample.get(key)
            if x is not None and value is not None and sample.get("ok", True):
                points.setdefault(int(x), []).append(float(value))
    return Series(label, points)


def panels(labelled: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, list[Series]]:
    """Panel title -> a series per receipt. Decode speed is `make compare`'s metric
    (`receipt.decode_speed`); output tok/s for every receipt when any decode sample lacks steps/s
    (one unit per axis)."""
    samples = [s for _, r in labelled for c in r["cells"].values() if c["kind"] == "decode"
               for s in c["samples"]]  # fmt: skip
    measured = {decode_speed(s)[0] for s in samples}
    key = "target_steps_s" if measured == {"target_steps_s"} else "output_tok_s"
    return {
        f"decode: {DECODE_SPEEDS[key]} by concurrency":
            [_series(label, r, "decode", key) for label, r in labelled],
        "prefill: prompt tok/s by prompt tokens":
            [_series(label, r, "prefill", "prompt_tok_s") for label, r in labelled],
        "acceptance length by concurrency":
            [_series(label, r, "decode", "acceptance_length") for label, r in labelled],
    }  # fmt: skip


def write_png(labelled: Sequence[tuple[str, dict[str, Any]]], path: Path) -> Path:
    """Draw `panels(labelled)` side by side into `path`: each repeat a dot, the median a line."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    shown = panels(labelled)
    fig, axes = plt.subplots(1, len(shown), figsize=(6 * len(shown), 4.5), squeeze=False)
    for ax, (title, series) in zip(axes[0], shown.items(), strict=True):
        ax.set_title(title, fontsize=10)
        drawn = False
        for n, s in enumerate(series):
            if not s.points:
                continue
            drawn = True
            color = f"C{n}"
            for x, values in s.points.items():
                ax.scatter([x] * len(values), values, color=color, s=14, alpha=0.6)
            xs, medians = s.medians()
            ax.plot(xs, medians, color=color, marker="o", label=f"{s.label} (median)")
            ax.set_xticks(xs)
        if drawn:
            ax.legend(fontsize=8)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
        else:
            ax.text(0.5, 0.5, "not measured\n(no speculative counters moved)"
                    if title.startswith("acceptance") else "not measured",
                    ha="center", va="center", transform=ax.transAxes)  # fmt: skip
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(" vs ".join(f"{label}: {r['profile']} ({r['date']})" for label, r in labelled),
                 fontsize=9)  # fmt: skip
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
