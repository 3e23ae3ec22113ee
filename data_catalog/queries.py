"""Named reads of the catalog: every SQL statement over its tables lives here, so the
tables' conventions (which captions are machine translations, which images have a file)
are written once. Tasks ask for "the captions of this split", never for a SELECT.
"""

from __future__ import annotations

import pyarrow as pa

from mule.data_catalog.tables import Catalog

# A caption is a machine translation when its source names the system: "mt:<backend>".
MT_PREFIX = "mt:"
_IS_MT = f"c.source LIKE '{MT_PREFIX}%'"

# Which captions a training-caption selection (data.captions) uses.
CAPTION_SELECTIONS = {
    "human": f"NOT {_IS_MT}",
    "human+mt": "TRUE",
    "mt": f"((c.lang = 'en' AND NOT {_IS_MT}) OR (c.lang <> 'en' AND {_IS_MT}))",  # English stays human
}


def mt_source(backend: str) -> str:
    """The source of a caption the backend translated."""
    return f"{MT_PREFIX}{backend}"


def _in(values) -> str:
    return ", ".join("?" for _ in values)


def _in_split(names_sql: str) -> str:
    """Captions (c) of the splits named: a name that is one of the dataset's splits selects
    that split alone (`test` is not `test_shoes`, though both play the test role); a name
    that is no split selects its role (Multi30K's `test` is test_2016). The splits are the
    captions' own (each caption carries its image's split), so a stage that reads captions
    reads no other table to select them (data_catalog.declared)."""
    return (f"(c.split IN ({names_sql}) OR (c.role IN ({names_sql}) AND c.role NOT IN "
            f"(SELECT DISTINCT s.split FROM captions s WHERE s.dataset = c.dataset)))")


# -- captions -------------------------------------------------------------------------
def added_dataset(dataset: str, lang: str) -> str:
    """Where a language added to a trained model keeps its captions of the dataset's images
    (the language-captions step writes them): a table of their own, which the rebuild's
    stages never read."""
    return f"{dataset}+{lang}"


def caption_selection(catalog: Catalog, dataset: str, selector: str, languages, captions: str,
                      with_files: bool = True, added=()) -> pa.Table:  # fmt: skip
    """The captions of a split (name, role or "all") in `languages` under a training-caption
    selection, with whether their image has a file (`with_files`: from the images table;
    else all true, and that table is not read) and their translation key (the caption a
    translation was made from, else the caption itself: Multi30K task1's parallel lines
    share one); ordered by image, language, caption. `added`: languages whose captions are
    read from their own tables (added_dataset) beside the dataset's."""
    has_file, images = ('i."exists"', "JOIN images i ON i.dataset = ? AND i.image_id = c.image_id") \
        if with_files else ("TRUE", "")  # fmt: skip
    sources = [dataset, *(added_dataset(dataset, lang) for lang in added)]
    return catalog.query(
        f"""SELECT c.caption_id, c.image_id, c.lang, c.tokens, {has_file} AS has_file,
                   COALESCE(c.origin_caption_id, c.caption_id) AS translation_key
            FROM captions c {images}
            WHERE c.dataset IN ({_in(sources)}) AND (? = 'all' OR {_in_split("?")})
              AND c.lang IN ({_in(languages)}) AND {CAPTION_SELECTIONS[captions]}
            ORDER BY c.image_id, c.lang, c.caption_id""",
        [*([dataset] if with_files else []), *sources, selector, selector, selector, *languages],
    )


def training_words(catalog: Catalog, dataset: str, lang: str, captions: str, added: bool = False) -> list[str]:
    """The words of a language's training captions (those the selection uses), commonest
    first; `added`: a language whose captions are in their own table (added_dataset)."""
    source = added_dataset(dataset, lang) if added else dataset
    rows = catalog.query(
        f"""SELECT token, count(*) AS n FROM (SELECT unnest(c.tokens) AS token FROM captions c
                WHERE c.dataset = ? AND c.lang = ? AND c.role = 'train' AND {CAPTION_SELECTIONS[captions]})
            GROUP BY token ORDER BY n DESC, token""",
        [source, lang],
    )
    return rows["token"].to_pylist()


def split_words(catalog: Catalog, dataset: str, selector: str, lang: str, added: bool = False) -> list[str]:
    """The distinct words of a language's human captions in a split (name, role or "all");
    `added`: a language whose captions are in their own table (added_dataset)."""
    rows = caption_selection(catalog, dataset, selector, [lang], "human", with_files=False,
                             added=(lang,) if added else ())  # fmt: skip
    return sorted({token for tokens in rows["tokens"].to_pylist() for token in tokens or ()})


def split_names(catalog: Catalog, dataset: str) -> list[tuple[str, str]]:
    """(split, role) of every split of the dataset's images, in name order."""
    rows = catalog.query("SELECT DISTINCT split, role FROM images WHERE dataset = ? ORDER BY split", [dataset])
    return list(zip(rows["split"].to_pylist(), rows["role"].to_pylist()))


def evaluation_splits(catalog: Catalog, dataset: str, selector: str) -> list[tuple[str, str]]:
    """eval.split as (what to read: a split or role, the name its metrics carry), in order.
    Items are separated by commas; "tests" is every test split the dataset has (the test
    role's, then the other splits named test*: Multi30K's 2017 and 2018 ones). A role that
    is one split is named by that split (test -> test_2016); one that spans several keeps
    its own name (their union is evaluated)."""
    splits = split_names(catalog, dataset)
    out: list[tuple[str, str]] = []
    for item in (part.strip() for part in selector.split(",") if part.strip()):
        if item == "tests":
            named = [s for s, r in splits if r == "test"] + [s for s, r in splits if r != "test" and s.startswith("test")]
            out += [(s, s) for s in named]
            continue
        by_role = [s for s, r in splits if r == item and s != item]
        out.append((item, by_role[0] if len(by_role) == 1 and item not in {s for s, _ in splits} else item))
    return list(dict.fromkeys(out))


def captions_for_word_vectors(catalog: Catalog, dataset: str, lang: str, captions: str) -> pa.Table:
    """Every human caption of a language (all splits: every word gets a vector) and the MT
    captions the selection uses; columns tokens, role, selected (used by the selection)."""
    return catalog.query(
        f"""SELECT tokens, role, {CAPTION_SELECTIONS[captions]} AS selected FROM captions c
            WHERE dataset = ? AND lang = ? AND (NOT {_IS_MT} OR {CAPTION_SELECTIONS[captions]})""",
        [dataset, lang],
    )


def human_captions_to_translate(catalog: Catalog, dataset: str, splits) -> list[dict]:
    return catalog.query(
        f"""SELECT caption_id, image_id, split, role, lang, text, tokens FROM captions c
            WHERE dataset = ? AND NOT {_IS_MT} AND {_in_split(_in(splits))}
            ORDER BY caption_id""",
        [dataset, *splits, *splits],
    ).to_pylist()


def parallel_training_captions(catalog: Catalog, dataset: str) -> list[dict]:
    """Human translations of training captions beside the caption they translate."""
    return catalog.query(
        f"""SELECT o.lang AS src_lang, o.tokens AS src_tokens, c.lang AS dest_lang, c.tokens AS dest_tokens
            FROM captions c JOIN captions o ON o.caption_id = c.origin_caption_id AND o.dataset = c.dataset
            WHERE c.dataset = ? AND c.role = 'train' AND NOT {_IS_MT} AND o.source NOT LIKE '{MT_PREFIX}%'""",
        [dataset],
    ).to_pylist()


def first_captions(catalog: Catalog, dataset: str, lang: str, n: int) -> list[str]:
    """The texts of a language's first `n` captions (by id)."""
    return catalog.query("SELECT text FROM captions WHERE dataset = ? AND lang = ? ORDER BY caption_id LIMIT ?",
                         [dataset, lang, n])["text"].to_pylist()  # fmt: skip


def caption_texts(catalog: Catalog, dataset: str, caption_ids=None, added=()) -> dict[str, str]:
    """caption id -> text, for the ids given (all of the dataset's when None); `added`:
    languages whose captions are in their own tables (added_dataset), read too."""
    sources = [dataset, *(added_dataset(dataset, lang) for lang in added)]
    if caption_ids is None:
        rows = catalog.query(f"SELECT caption_id, text FROM captions WHERE dataset IN ({_in(sources)})", sources)
    else:
        caption_ids = list(caption_ids)
        if not caption_ids:
            return {}
        rows = catalog.query(f"SELECT caption_id, text FROM captions WHERE dataset IN ({_in(sources)}) AND caption_id "
                             f"IN ({_in(caption_ids)})", [*sources, *caption_ids])  # fmt: skip
    return dict(zip(rows["caption_id"].to_pylist(), rows["text"].to_pylist()))


# -- images ---------------------------------------------------------------------------
def image_paths(catalog: Catalog, dataset: str) -> dict[str, str]:
    rows = catalog.query("SELECT image_id, path FROM images WHERE dataset = ?", [dataset])
    return dict(zip(rows["image_id"].to_pylist(), rows["path"].to_pylist()))


def image_rows(catalog: Catalog, dataset: str, image_ids=None) -> list[dict]:
    """image_id, path, split, "exists" of the images (ordered by id), or of those named."""
    if image_ids is None:
        return catalog.query('SELECT image_id, path, split, "exists" FROM images WHERE dataset = ? ORDER BY image_id',
                             [dataset]).to_pylist()  # fmt: skip
    image_ids = list(image_ids)
    if not image_ids:
        return []
    return catalog.query(f'SELECT image_id, path, split, "exists" FROM images WHERE dataset = ? AND image_id IN '
                         f"({_in(image_ids)}) ORDER BY image_id", [dataset, *image_ids]).to_pylist()  # fmt: skip


def image_names(catalog: Catalog, dataset: str) -> pa.Table:
    """Every image's id, file name, path, split and role: what a table naming images by
    any of those is read against (datasets/readers/added_captions.py)."""
    return catalog.query("SELECT image_id, file_name, path, split, role FROM images WHERE dataset = ? ORDER BY image_id",
                         [dataset])  # fmt: skip


def image_file_count(catalog: Catalog, dataset: str) -> int:
    return int(catalog.query('SELECT count(*) AS n FROM images WHERE dataset = ? AND "exists"', [dataset])["n"][0]
               .as_py())  # fmt: skip


def image_digests(catalog: Catalog, dataset: str) -> dict[str, str | None]:
    rows = catalog.query("SELECT image_id, sha256 FROM images WHERE dataset = ?", [dataset])
    return dict(zip(rows["image_id"].to_pylist(), rows["sha256"].to_pylist()))


def image_with_bytes(catalog: Catalog, dataset: str, sha256: str) -> str | None:
    """The id of an image of the dataset whose file has these bytes."""
    found = catalog.query("SELECT image_id FROM images WHERE dataset = ? AND sha256 = ? LIMIT 1",
                          [dataset, sha256])["image_id"].to_pylist()  # fmt: skip
    return found[0] if found else None


# -- word vectors and features ------------------------------------------------------------
def word_vectors(catalog: Catalog, dataset: str) -> pa.Table:
    return catalog.query('SELECT lang, token, vector FROM word_vectors WHERE dataset = ? ORDER BY lang, "index"',
                         [dataset])  # fmt: skip


def subword_vectors(catalog: Catalog, dataset: str) -> pa.Table:
    return catalog.query("SELECT lang, ngram, vector FROM subword_vectors WHERE dataset = ? ORDER BY lang, ngram",
                         [dataset])  # fmt: skip


def training_word_counts(catalog: Catalog, dataset: str, lang: str) -> dict[str, int]:
    rows = catalog.query("SELECT token, train_count FROM word_vectors WHERE dataset = ? AND lang = ?", [dataset, lang])
    return dict(zip(rows["token"].to_pylist(), rows["train_count"].to_pylist()))


def feature_dim(catalog: Catalog, extractor: str) -> int:
    return int(catalog.query("SELECT len(vector) AS d FROM features WHERE extractor = ? LIMIT 1", [extractor])["d"][0]
               .as_py())  # fmt: skip


# -- what the catalog holds (mule catalog) ------------------------------------------------
def summary(catalog: Catalog) -> dict[str, list[dict]]:
    """Images per dataset and split, captions per language and origin, rejects per kind."""
    out = {"images": catalog.query(
        """SELECT dataset, split, count(*) AS images, sum(CASE WHEN "exists" THEN 1 ELSE 0 END) AS with_file
           FROM images GROUP BY ALL ORDER BY dataset, split""").to_pylist()}  # fmt: skip
    out["captions"] = catalog.query(
        f"""SELECT dataset, split, lang, CASE WHEN {_IS_MT} THEN source ELSE 'human' END AS origin,
                   count(*) AS n FROM captions c GROUP BY ALL ORDER BY dataset, split, lang, origin""").to_pylist()
    out["rejects"] = catalog.query(
        "SELECT dataset, coalesce(kind, '?') AS kind, count(*) AS n FROM rejects GROUP BY ALL ORDER BY dataset, n DESC"
    ).to_pylist() if (catalog.workdir.catalog_dir / "rejects").exists() else []  # fmt: skip
    return out


def rejected_rows(catalog: Catalog, dataset: str | None, limit: int) -> tuple[list[dict], int]:
    """(the first `limit` rejected rows, by file and line; how many there are), of one
    dataset or of all."""
    if not (catalog.workdir.catalog_dir / "rejects").exists():
        return [], 0
    where, params = ("WHERE dataset = ?", [dataset]) if dataset else ("", [])
    total = catalog.query(f"SELECT count(*) AS n FROM rejects {where}", params).to_pylist()[0]["n"]
    rows = catalog.query(f"SELECT dataset, source_file, line, kind, reason, raw FROM rejects {where} "
                         f"ORDER BY dataset, source_file, line LIMIT {int(limit)}", params).to_pylist()  # fmt: skip
    return rows, total


def train_images_per_language(catalog: Catalog, dataset: str) -> dict[str, int]:
    """lang -> training images with a caption in it (human captions)."""
    rows = catalog.query("""SELECT lang, count(DISTINCT image_id) AS images FROM captions
                            WHERE dataset = ? AND role = 'train' GROUP BY lang""", [dataset])  # fmt: skip
    return dict(zip(rows["lang"].to_pylist(), rows["images"].to_pylist()))
