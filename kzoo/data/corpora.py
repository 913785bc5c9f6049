"""The corpora kzoo ships in `recipes/data`, read into splits of plain Python examples.

Each `read_*` function returns `{split_name: [example, ...]}` with examples as dicts whose keys
are the features of the matching tensorflow-datasets builder in `kzoo.data.builders`, and
labels as their names. The split of corpora with no official one is a seeded shuffle
(`seeded_split` with `SPLIT_SEED`), so it is the same on every machine.

The files are read from `corpus_dir()`: the repository's `recipes/data`, or the folder named
by the `KZOO_DATA_DIR` environment variable, or the `source_dir` argument.
"""

import os
import re
from pathlib import Path

import numpy as np

import kzoo
from kzoo.data.readers import DataFileError
from kzoo.data.readers import check_label
from kzoo.data.readers import find_file
from kzoo.data.readers import read_blocks
from kzoo.data.readers import read_json_lines
from kzoo.data.readers import read_lines
from kzoo.data.readers import read_tab_separated
from kzoo.data.readers import read_text
from kzoo.data.readers import split_fields

SPLIT_SEED = 1337

SENTIMENT_LABELS = ("negative", "positive")
UPOS_TAGS = (
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM",
    "PART", "PRON", "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X",
)  # fmt: skip
# The order of Hugging Face's `wnut_17`, so label ids agree with models trained there.
WNUT17_TAGS = (
    "O",
    "B-corporation", "I-corporation",
    "B-creative-work", "I-creative-work",
    "B-group", "I-group",
    "B-location", "I-location",
    "B-person", "I-person",
    "B-product", "I-product",
)  # fmt: skip
SENTIMENT_SOURCES = {
    "amazon": "amazon_cells_labelled.txt",
    "imdb": "imdb_labelled.txt",
    "yelp": "yelp_labelled.txt",
}


def corpus_dir(source_dir=None):
    """The folder holding kzoo's corpus folders (`spa-eng/`, `wnut17/`, ...).

    Args:
        source_dir: the folder to use; defaults to the `KZOO_DATA_DIR` environment variable,
            then to `recipes/data` next to the `kzoo` package in the repository.

    Example:
    >>> sorted(p.name for p in corpus_dir().iterdir() if p.is_dir())[:2]
    ['rt-polarity', 'scitldr-a']
    """
    if source_dir is None:
        source_dir = os.environ.get("KZOO_DATA_DIR") or Path(kzoo.__file__).parents[1] / "recipes" / "data"
    path = Path(source_dir)
    if not path.is_dir():
        raise DataFileError(
            path,
            "no such folder. kzoo's corpora ship in the repository's recipes/data; "
            "set KZOO_DATA_DIR or pass source_dir to read them from elsewhere.",
        )
    return path


def seeded_split(examples, fractions, seed=SPLIT_SEED):
    """Shuffles `examples` with a fixed seed, then cuts them into consecutive splits.

    Every split but the first gets `round(len(examples) * fraction)` examples; the first gets
    the rest, so no example is lost to rounding.

    Args:
        examples: a list.
        fractions: dict, split name -> fraction of the examples, e.g. {"train": 0.9, "test": 0.1}.
        seed: int, the seed of `numpy.random.default_rng`.

    Example:
    >>> {name: len(part) for name, part in seeded_split(list(range(10)), {"train": 0.8, "test": 0.2}).items()}
    {'train': 8, 'test': 2}
    """
    order = np.random.default_rng(seed).permutation(len(examples))
    sizes = [round(len(examples) * fraction) for fraction in fractions.values()]
    sizes[0] = len(examples) - sum(sizes[1:])
    splits, start = {}, 0
    for name, size in zip(fractions, sizes, strict=True):
        splits[name] = [examples[index] for index in order[start : start + size]]
        start += size
    return splits


def read_tiny_shakespeare(source_dir=None):
    """Tiny Shakespeare as one text per split: the first 90% of characters `train`, the rest `validation`.

    Args:
        source_dir: see `corpus_dir`.

    Example:
    >>> splits = read_tiny_shakespeare()
    >>> len(splits["train"][0]["text"]) + len(splits["validation"][0]["text"])
    1115394
    """
    text = read_text(find_file(corpus_dir(source_dir) / "tinyshakespeare", "input.txt"))
    cut = int(0.9 * len(text))
    return {"train": [{"text": text[:cut]}], "validation": [{"text": text[cut:]}]}


def read_spa_eng(source_dir=None):
    """English–Spanish pairs `{"english", "spanish"}`, seeded 80/10/10 train/validation/test.

    Pairs are split, not English sentences (as in the keras-io example): an English sentence
    with several translations can land in several splits, so about 20% of the validation and
    test English sentences also occur in train, with another translation.

    Args:
        source_dir: see `corpus_dir`.

    Example:
    >>> {name: len(pairs) for name, pairs in read_spa_eng().items()}
    {'train': 95172, 'validation': 11896, 'test': 11896}
    """
    path = find_file(corpus_dir(source_dir) / "spa-eng", "spa.txt")
    pairs = [{"english": english, "spanish": spanish} for _, (english, spanish) in read_tab_separated(path, 2)]
    return seeded_split(pairs, {"train": 0.8, "validation": 0.1, "test": 0.1})


def read_rt_polarity(source_dir=None):
    """Rotten Tomatoes snippets `{"text", "label"}`, seeded 90/10 train/test.

    The label comes from the file (`rt-polarity.neg` / `.pos`); the trailing space of each
    line is stripped.

    Args:
        source_dir: see `corpus_dir`.

    Example:
    >>> {name: len(examples) for name, examples in read_rt_polarity().items()}
    {'train': 9596, 'test': 1066}
    """
    folder = corpus_dir(source_dir) / "rt-polarity"
    examples = []
    for label in SENTIMENT_LABELS:
        path = find_file(folder, f"rt-polarity.{label[:3]}")
        for number, line in read_lines(path):
            if not line.strip():
                raise DataFileError(path, "the line is blank; expected one snippet per line.", number)
            examples.append({"text": line.strip(), "label": label})
    return seeded_split(examples, {"train": 0.9, "test": 0.1})


def read_sentiment_sentences(source_dir=None):
    """UCI sentiment labelled sentences `{"text", "label", "source"}`, seeded 90/10 train/test.

    Each line is split on its last tab, with no CSV quote handling. Lines 19 and 20 of
    `imdb_labelled.txt` are two halves of one sentence, cut at a quote character upstream;
    both carry a label, so they are kept as the two examples the file holds.

    Args:
        source_dir: see `corpus_dir`.

    Example:
    >>> {name: len(examples) for name, examples in read_sentiment_sentences().items()}
    {'train': 2700, 'test': 300}
    """
    folder = corpus_dir(source_dir) / "sentiment-labelled-sentences"
    examples = []
    for source, name in SENTIMENT_SOURCES.items():
        path = find_file(folder, name)
        for number, (text, label) in read_tab_separated(path, 2, split_on_last_tab=True):
            label = SENTIMENT_LABELS[int(check_label(path, number, label, ("0", "1")))]
            examples.append({"text": text.strip(), "label": label, "source": source})
    return seeded_split(examples, {"train": 0.9, "test": 0.1})


def read_ud_english_ewt(source_dir=None):
    """UD English EWT sentences `{"sent_id", "text", "tokens", "upos"}`: train (subset), validation, test.

    Multi-word token lines (`3-4`) and empty nodes (`8.1`) are skipped: `tokens` are the
    syntactic words, each with its UPOS tag.

    Args:
        source_dir: see `corpus_dir`.

    Example:
    >>> {name: len(sentences) for name, sentences in read_ud_english_ewt().items()}
    {'train': 4276, 'validation': 2001, 'test': 2077}
    """
    folder = corpus_dir(source_dir) / "ud-english-ewt"
    files = {
        "train": "en_ewt-ud-train.every3rd-doc.conllu",
        "validation": "en_ewt-ud-dev.conllu",
        "test": "en_ewt-ud-test.conllu",
    }
    return {split: _read_conllu(find_file(folder, name)) for split, name in files.items()}


def _read_conllu(path):
    sentences = []
    for block in read_blocks(path):
        comments, tokens, upos = {}, [], []
        for number, line in block:
            if line.startswith("#"):
                key, equals, value = line[1:].partition("=")
                if equals:
                    comments[key.strip()] = value.strip()
                continue
            token_id, form, _, tag, *_ = split_fields(path, number, line, 10)
            if token_id.isdigit():
                tokens.append(form)
                upos.append(check_label(path, number, tag, UPOS_TAGS))
            elif not re.fullmatch(r"\d+-\d+|\d+\.\d+", token_id):
                raise DataFileError(
                    path, f"ID {token_id!r} is not a word (7), a multi-word token (3-4) or an empty node (8.1).", number
                )
        first_line = block[0][0]
        if not tokens:
            raise DataFileError(path, "the sentence has no word lines.", first_line)
        for key in ("sent_id", "text"):
            if key not in comments:
                raise DataFileError(path, f"the sentence has no '# {key} = ...' comment.", first_line)
        sentences.append({"sent_id": comments["sent_id"], "text": comments["text"], "tokens": tokens, "upos": upos})
    return sentences


def read_wnut17(source_dir=None):
    """WNUT-17 sentences `{"tokens", "ner_tags"}` with BIO tags from `WNUT17_TAGS`: train, validation, test.

    A line holding only whitespace ends a sentence, like an empty line: the train file uses
    a lone tab for 2,394 of its sentence breaks.

    Args:
        source_dir: see `corpus_dir`.

    Example:
    >>> {name: len(sentences) for name, sentences in read_wnut17().items()}
    {'train': 3394, 'validation': 1009, 'test': 1287}
    """
    folder = corpus_dir(source_dir) / "wnut17"
    files = {"train": "wnut17train.conll", "validation": "emerging.dev.conll", "test": "emerging.test.annotated"}
    return {split: _read_bio(find_file(folder, name)) for split, name in files.items()}


def _read_bio(path):
    sentences = []
    for block in read_blocks(path):
        tokens, tags = [], []
        for number, line in block:
            token, tag = split_fields(path, number, line, 2)
            tokens.append(token)
            tags.append(check_label(path, number, tag, WNUT17_TAGS))
        sentences.append({"tokens": tokens, "ner_tags": tags})
    return sentences


def read_scitldr(source_dir=None):
    """SciTLDR-A `{"paper_id", "title", "source", "target", "targets"}`: train and validation (the dev file).

    `source` is the abstract's sentences joined with spaces, `target` the first TLDR (the
    author's), `targets` all of them: one per train record, 1 to 4 per validation record.

    Args:
        source_dir: see `corpus_dir`.

    Example:
    >>> {name: len(records) for name, records in read_scitldr().items()}
    {'train': 1992, 'validation': 619}
    """
    folder = corpus_dir(source_dir) / "scitldr-a"
    files = {"train": "train.jsonl", "validation": "dev.jsonl"}
    return {split: _read_scitldr_file(find_file(folder, name)) for split, name in files.items()}


def _read_scitldr_file(path):
    examples = []
    for number, record in read_json_lines(path, ("paper_id", "title", "source", "target")):
        for key in ("source", "target"):
            value = record[key]
            if not (isinstance(value, list) and value and all(isinstance(text, str) for text in value)):
                raise DataFileError(path, f"{key!r} must be a non-empty list of strings.", number)
        examples.append(
            {
                "paper_id": record["paper_id"],
                "title": record["title"],
                "source": " ".join(record["source"]),
                "target": record["target"][0],
                "targets": record["target"],
            }
        )
    return examples
