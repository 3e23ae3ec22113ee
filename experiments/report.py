"""Recall tables as text: markdown for people and MLflow, CSV for tools."""

from __future__ import annotations

import csv
import io

RECALL_COLUMNS = ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "mR")
RECALL_HEADERS = ("img->txt R@1", "R@5", "R@10", "txt->img R@1", "R@5", "R@10", "mR")


def recall_rows(table: dict[str, dict[str, float]], chance: dict[str, dict[str, float]] | None = None) -> list[dict]:
    """One row per language (ranker "model"), then, given chance (metrics.chance_table),
    one per language for a random ranking of the same images and sentences ("chance")."""
    rows = []
    for ranker, rows_of in (("model", table), ("chance", chance or {})):
        for lang, row in rows_of.items():
            rows.append({"lang": lang, "ranker": ranker, "images": int(row["images"]),
                         "sentences": int(row["sentences"]),
                         **{c: round(row[c], 1) for c in RECALL_COLUMNS if c in row}})  # fmt: skip
    return rows


def recall_markdown(table: dict[str, dict[str, float]], chance: dict[str, dict[str, float]] | None = None) -> str:
    """The recall table; with chance, each language's chance row under the model's rows."""
    header = "| lang | images | sentences | " + " | ".join(RECALL_HEADERS) + " |"
    lines = [header, "|" + "---|" * (3 + len(RECALL_HEADERS))]
    for row in recall_rows(table, chance):
        name = row["lang"] if row["ranker"] == "model" else f"{row['lang']} chance"
        cells = [name, str(row["images"]), str(row["sentences"])] + [f"{row[c]:.1f}" for c in RECALL_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cross_lingual_markdown(tables: dict[str, dict[str, dict[str, float]]], ks=(1, 5, 10),
                           pairs: dict[str, dict[str, dict[str, float]]] | None = None,
                           ceilings: dict[str, dict[str, dict[str, float]]] | None = None) -> str:  # fmt: skip
    """tables: layer -> "a->b" -> {r1, r5, r10, queries}, image level (a hit: any caption
    of the query's image); pairs: the same for translation pairs (a hit: the query's own
    translation), when the split has them; ceilings: "a->a", a's captions against its own
    translated lines (image level): what a->x reaches with perfect translations, for an x
    that has only those lines."""
    lines = ["| layer | protocol | query -> target | queries | " + " | ".join(f"R@{k}" for k in ks) + " |",
             "|" + "---|" * (4 + len(ks))]  # fmt: skip
    protocols = (("image", tables), ("translation", pairs or {}), ("perfect-translation ceiling", ceilings or {}))
    for protocol, by_layer in protocols:
        for layer, table in by_layer.items():
            for pair, row in table.items():
                target = " (translated lines)" if protocol.startswith("perfect") else ""
                cells = [layer, protocol, pair.replace("->", " -> ") + target, str(int(row["queries"]))]
                lines.append("| " + " | ".join(cells + [f"{row[f'r{k}']:.1f}" for k in ks]) + " |")
    return "\n".join(lines)


def to_csv(rows: list[dict]) -> str:
    if not rows:
        return ""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def ablation_markdown(rows, languages: list[str]) -> str:
    """The ablation's table: mR per language and their mean (mean ± std over seeds when
    there are several), each row's difference from the row it adds to (paired by seed:
    experiments/seeds.py), parameters (total and language-specific), the models' validation
    mR and the minutes one seed's models trained (LP and joint).
    rows: pipeline.sweeps.RowResult."""

    def cell(row, lang: str) -> str:
        if lang not in row.mr:
            return "–"
        return f"{row.mr[lang]:.1f} ± {row.std[lang]:.1f}" if lang in row.std else f"{row.mr[lang]:.1f}"

    def mean(row) -> str:
        if not row.mr:
            return "–"
        return f"{row.mean:.1f}" if row.mean_std is None else f"{row.mean:.1f} ± {row.mean_std:.1f}"

    head = ("| model | " + " | ".join(languages)
            + " | mean | vs (paired by seed) | parameters | language-specific | val mR | training, min |")  # fmt: skip
    lines = [head, "|" + "---|" * (len(languages) + 7)]
    for row in rows:
        versus = f"{row.difference} vs {row.baseline}" if row.difference is not None else ""
        cells = [row.name] + [cell(row, lang) for lang in languages]
        sizes = [f"{row.parameters:,}", f"{row.language_specific:,}"] if row.parameters else ["–", "–"]
        cost = ["–" if row.val is None else f"{row.val:.1f}", "–" if row.minutes is None else f"{row.minutes:.1f}"]
        cells += [mean(row), versus, *sizes, *cost]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
