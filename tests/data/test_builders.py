"""The tensorflow-datasets builders, end to end, and `load`."""

import pytest
import tensorflow_datasets as tfds

from kzoo.data import BUILDERS
from kzoo.data import corpora
from kzoo.data import load


def test_every_corpus_has_a_registered_builder():
    assert sorted(BUILDERS) == [
        "kzoo_rt_polarity",
        "kzoo_scitldr",
        "kzoo_sentiment_sentences",
        "kzoo_spa_eng",
        "kzoo_tiny_shakespeare",
        "kzoo_ud_english_ewt",
        "kzoo_wnut17",
    ]
    registered = tfds.list_builders(with_community_datasets=False)
    assert set(BUILDERS) <= set(registered)
    assert "corpus_builder" not in registered  # the base class is not a dataset


def test_shipped_corpus_through_tfds_matches_the_reader(tfds_dir):
    expected = corpora.read_sentiment_sentences()
    builder = tfds.builder("kzoo_sentiment_sentences", data_dir=tfds_dir)
    builder.download_and_prepare()
    assert {name: split.num_examples for name, split in builder.info.splits.items()} == {"train": 2_700, "test": 300}
    assert builder.info.features["label"].names == ["negative", "positive"]

    test = list(load("kzoo_sentiment_sentences", "test", data_dir=tfds_dir).as_numpy_iterator())
    assert [example["text"].decode("utf-8") for example in test] == [e["text"] for e in expected["test"]]
    labels = [builder.info.features["label"].int2str(example["label"]) for example in test]
    assert labels == [e["label"] for e in expected["test"]]


def test_supervised_sequence_labels_from_a_source_dir(tfds_dir, write_corpus, monkeypatch):
    source = write_corpus(
        {
            "wnut17/wnut17train.conll": "Visit\tO\nNew\tB-location\nYork\tI-location\n\nHi\tO\n",
            "wnut17/emerging.dev.conll": "Acme\tB-corporation\n",
            "wnut17/emerging.test.annotated": "ok\tO\n",
        }
    )
    monkeypatch.setenv("KZOO_DATA_DIR", str(source))
    train = load("kzoo_wnut17", "train", data_dir=tfds_dir / "synthetic", as_supervised=True)
    (tokens, tags), (hi_tokens, hi_tags) = list(train.as_numpy_iterator())
    assert tokens.tolist() == [b"Visit", b"New", b"York"]
    names = corpora.WNUT17_TAGS
    assert [names[tag] for tag in tags] == ["O", "B-location", "I-location"]
    assert hi_tokens.tolist() == [b"Hi"] and hi_tags.tolist() == [0]


def test_unknown_name_lists_the_kzoo_datasets():
    with pytest.raises(ValueError, match=r"Unknown dataset 'kzoo_nope'.*kzoo_rt_polarity.*kzoo_wnut17"):
        load("kzoo_nope", "train")


def test_source_dir_is_for_kzoo_datasets_only(tmp_path):
    with pytest.raises(ValueError, match="kzoo datasets only"):
        load("mnist", "train", data_dir=tmp_path, source_dir=tmp_path)


def test_a_changed_corpus_is_prepared_again_never_read_stale(tfds_dir, write_corpus):
    """The prepared copy is keyed by the source files' SHA-256: a change (here an edited, then an
    emptied input.txt, then another source folder) is never silently ignored."""
    source = write_corpus({"tinyshakespeare/input.txt": "ROMEO: a" * 10})
    data_dir = tfds_dir / "changed"

    def text(split="train", source_dir=source):
        return b"".join(
            example["text"]
            for example in load("kzoo_tiny_shakespeare", split, data_dir, source_dir=source_dir).as_numpy_iterator()
        )

    assert text() == ("ROMEO: a" * 10).encode()[:72]
    (source / "tinyshakespeare" / "input.txt").write_text("JULIET: b" * 10, encoding="utf-8")
    assert text() == ("JULIET: b" * 10).encode()[:81]
    (source / "tinyshakespeare" / "input.txt").write_text("", encoding="utf-8")
    with pytest.raises(corpora.DataFileError, match="input.txt"):
        text()
    other = write_corpus({"other/tinyshakespeare/input.txt": "HAMLET: c" * 10}) / "other"
    assert text(source_dir=other) == ("HAMLET: c" * 10).encode()[:81]


def test_preparing_prints_kzoo_s_line_alone(tfds_dir, write_corpus, capsys):
    source = write_corpus({"tinyshakespeare/input.txt": "ROMEO: a" * 10})
    tfds.enable_progress_bar()  # the caller's setting (a test before, in this worker, may have turned it off)
    load("kzoo_tiny_shakespeare", "train", tfds_dir / "quiet", source_dir=source)
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        f"Preparing kzoo_tiny_shakespeare from its corpus files into {tfds_dir / 'quiet'}"
        "/kzoo_tiny_shakespeare/1.0.0 (on first use only)"
    ]
    assert "examples" not in captured.err  # tensorflow-datasets' progress bars
    assert tfds.core.utils.tqdm_utils._active  # the caller's setting is left as it was
