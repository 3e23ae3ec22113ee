"""`mule catalog`: what the workdir's catalog holds."""

from __future__ import annotations

import argparse

from mule.commands.options import reading_workdir


def run(args: argparse.Namespace) -> int:
    from mule.data_catalog import queries
    from mule.data_catalog.tables import Catalog
    from mule.storage.locks import catalog_reading

    workdir = reading_workdir(args.workdir, "catalog")
    catalog = Catalog(workdir, read_only=True)
    if getattr(args, "rejects", None) is not None:  # an ingest that stopped keeps its rejects, and no images
        return _rejects(catalog, workdir, args.rejects, args.limit)
    if not catalog.datasets():
        print(f"the catalog in {workdir.root} is empty: run `mule demo` or `mule run ingest ...`")
        return 0
    print(f"catalog: {workdir.duckdb_path}")
    with catalog_reading(workdir):
        held = queries.summary(catalog)
        identities = {dataset: catalog.feature_identities(dataset) for dataset in catalog.datasets()}
    for row in held["images"]:
        print(
            f"  images    {row['dataset']:<12} {row['split']:<18} {row['images']:>7}  ({row['with_file']} with a file)"
        )
    for row in held["captions"]:
        print(f"  captions  {row['dataset']:<12} {row['split']:<18} {row['lang']:<4} {row['n']:>7}  {row['origin']}")
    for row in held["rejects"]:
        print(f"  rejects   {row['dataset']:<12} {row['kind']:<18} {row['n']:>7}")
    for dataset, rows in identities.items():
        for row in rows:
            use = "current" if row["current"] else "kept (a model may use it; delete the folder to free it)"
            print(f"  features  {dataset:<12} {row['extractor']:<50} {row['rows']:>7}  "
                  f"{row['bytes'] / 2**20:.1f} MiB, {use}")  # fmt: skip
    return 0


def _rejects(catalog, workdir, dataset: str, limit: int) -> int:
    """The rejected rows themselves: where (file:line), what kind, why, and the line as read."""
    from mule.data_catalog import queries
    from mule.storage.locks import catalog_reading

    with catalog_reading(workdir):
        rows, total = queries.rejected_rows(catalog, dataset or None, limit)
    if not total:
        print(f"no rejected rows{f' in {dataset}' if dataset else ''}")
        return 0
    for row in rows:
        where = f"{row['source_file']}:{row['line']}" if row["line"] is not None else row["source_file"]
        print(f"{row['dataset']}  {where}  {row['kind']}: {row['reason']}")
        if row["raw"]:
            print(f"    {row['raw'][:160]}")
    if total > len(rows):
        print(f"... {total - len(rows)} more (--limit)")
    return 0
