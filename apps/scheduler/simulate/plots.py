"""PNG plots of simulation results (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from .engine import JobRecord, SimResult
from .metrics import TABLE_TIERS


def _rolling_mean(values: list[float], window: int) -> np.ndarray:
    data = np.asarray(values, dtype=float)
    if len(data) < window or window <= 1:
        return data
    kernel = np.ones(window) / window
    return np.convolve(data, kernel, mode="valid")


def plot_utilisation(results: list[SimResult], path: Path, smooth_s: int = 60) -> Path:
    fig, ax = plt.subplots(figsize=(9, 4))
    for result in results:
        series = _rolling_mean(result.utilisation, smooth_s)
        offset = (len(result.utilisation) - len(series)) / 2
        ax.plot(np.arange(len(series)) + offset, series * 100, label=result.policy, lw=1.2)
    if results:
        ax.axvline(results[0].warmup_s, color="grey", ls=":", lw=1, label="end of warm-up")
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel(f"GPUs busy (%, {smooth_s} s mean)")
    ax.set_ylim(0, 102)
    ax.set_title(f"Utilisation — {results[0].scenario if results else ''}")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _waits(result: SimResult, tier: str, org_filter=None) -> np.ndarray:
    values = []
    for record in result.jobs:
        if record.tier != tier or not record.admitted:
            continue
        if not result.warmup_s <= record.submit_at < result.duration_s:
            continue
        if org_filter is not None and not org_filter(record):
            continue
        end = record.first_start if record.first_start is not None else result.duration_s
        values.append(end - record.submit_at)
    return np.sort(np.asarray(values, dtype=float))


def _cdf(ax, waits: np.ndarray, label: str, **style) -> None:
    if not len(waits):
        return
    fractions = np.arange(1, len(waits) + 1) / len(waits)
    ax.step(np.maximum(waits, 0.5), fractions, where="post", label=label, **style)


def plot_wait_cdf(results: list[SimResult], path: Path) -> Path:
    fig, axes = plt.subplots(1, len(TABLE_TIERS), figsize=(13, 4), sharey=True)
    for ax, tier in zip(axes, TABLE_TIERS, strict=True):
        for result in results:
            _cdf(ax, _waits(result, tier), result.policy)
        ax.set_xscale("log")
        ax.set_title(f"{tier}: start wait CDF")
        ax.set_xlabel("wait (s, log)")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("fraction of jobs")
    axes[-1].legend(loc="lower right")
    fig.suptitle(f"Start waits — {results[0].scenario if results else ''}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_flood_waits(
    pairs: list[tuple[SimResult, SimResult]], flood_org: str, flood_at: float, path: Path
) -> Path:
    """Other enterprise customers' waits with and without the flood, per policy."""

    def others(record: JobRecord) -> bool:
        return record.org != flood_org and record.submit_at >= flood_at

    fig, ax = plt.subplots(figsize=(7, 4))
    for number, (base, flooded) in enumerate(pairs):
        color = f"C{number}"
        _cdf(ax, _waits(base, "enterprise", others), f"{base.policy}, no flood", color=color)
        _cdf(
            ax,
            _waits(flooded, "enterprise", others),
            f"{flooded.policy}, flood",
            color=color,
            linestyle="--",
        )
    ax.set_xscale("log")
    ax.set_xlabel("wait (s, log)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("Other enterprise customers' start waits")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
