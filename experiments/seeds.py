"""Figures over seeds: a mean with its spread, and a difference that is called a gain only
when it is more than the noise.

Spread: the sample standard deviation over seeds. A difference between two settings is
taken seed by seed (each seed's two runs, the same initial weights and batch order), then
averaged; it is a gain (or a loss) only when every seed moves the same way and the mean
exceeds the spread of the differences, else "none". With one seed there is no spread and
no verdict.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


def mean_spread(values: list[float]) -> str:
    """"58.6 ± 0.5" (one value: "58.6")."""
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"


@dataclass(frozen=True)
class Difference:
    mean: float
    spread: float | None  # None with one seed
    verdict: str  # "gain", "loss", "none", or "one seed"

    def __str__(self) -> str:
        if self.spread is None:
            return f"{self.mean:+.1f} (one seed)"
        return f"{self.mean:+.1f} ± {self.spread:.1f} ({self.verdict})"


def paired_difference(row: dict[int, float], baseline: dict[int, float]) -> Difference:
    """row - baseline over the seeds both have (seed -> figure)."""
    seeds = sorted(set(row) & set(baseline))
    if not seeds:
        raise ValueError("no seed in common: the difference cannot be paired")
    differences = [row[s] - baseline[s] for s in seeds]
    mean = statistics.mean(differences)
    if len(differences) == 1:
        return Difference(mean, None, "one seed")
    spread = statistics.stdev(differences)
    same_way = all(d > 0 for d in differences) or all(d < 0 for d in differences)
    verdict = ("gain" if mean > 0 else "loss") if same_way and abs(mean) > spread else "none"
    return Difference(mean, spread, verdict)
