"""The corpus readers yield the documented counts and contents for the shipped files."""

import collections

import pytest

from kzoo.data import corpora


@pytest.fixture(scope="module")
def spa_eng():
    return corpora.read_spa_eng()


def sizes(splits):
    return {name: len(examples) for name, examples in splits.items()}


def test_tiny_shakespeare_is_a_90_10_character_split():
    splits = corpora.read_tiny_shakespeare()
    train, validation = splits["train"][0]["text"], splits["validation"][0]["text"]
    assert sizes(splits) == {"train": 1, "validation": 1}
    assert len(train) + len(validation) == 1_115_394
    assert len(train) == int(0.9 * 1_115_394)
    assert train.startswith("First Citizen:\nBefore we proceed any further, hear me speak.")
    assert len(set(train + validation)) == 65


def test_spa_eng_is_a_seeded_80_10_10_split_of_all_pairs(spa_eng):
    assert sizes(spa_eng) == {"train": 95_172, "validation": 11_896, "test": 11_896}
    pairs = [(p["english"], p["spanish"]) for split in spa_eng.values() for p in split]
    assert len(set(pairs)) == len(pairs) == 118_964
    # Pinned: changing the seed or the shuffle would silently move pairs between splits.
    assert spa_eng["validation"][0] == {"english": "All of them are not poor.", "spanish": "Todos ellos no son pobres."}
    assert spa_eng["test"][0]["english"] == "These grapes are so sour that I can't eat them."


def test_spa_eng_split_does_not_follow_the_length_sorted_file(spa_eng):
    first_hundred = [pair["english"] for pair in spa_eng["train"][:100]]
    assert "Go." not in first_hundred
    assert max(len(sentence.split()) for sentence in first_hundred) > 5


def test_rt_polarity_has_both_files_stripped_and_split_90_10():
    splits = corpora.read_rt_polarity()
    assert sizes(splits) == {"train": 9_596, "test": 1_066}
    labels = collections.Counter(e["label"] for split in splits.values() for e in split)
    assert labels == {"positive": 5_331, "negative": 5_331}
    texts = [e["text"] for e in splits["train"]]
    assert all(text == text.strip() and text for text in texts)
    assert any("é" in text for text in texts)  # the cp1252 -> UTF-8 conversion shows


def test_sentiment_sentences_splits_on_the_last_tab_and_keeps_the_upstream_lines():
    splits = corpora.read_sentiment_sentences()
    assert sizes(splits) == {"train": 2_700, "test": 300}
    examples = splits["train"] + splits["test"]
    assert collections.Counter(e["source"] for e in examples) == {"amazon": 1_000, "imdb": 1_000, "yelp": 1_000}
    assert collections.Counter((e["source"], e["label"]) for e in examples)[("imdb", "positive")] == 500
    # imdb lines 19-20: one sentence cut at a quote upstream, kept as the two labelled lines.
    texts = {e["text"] for e in examples}
    assert "It's practically perfect in all of them \x96 a true masterpiece in a sea of faux \"masterpieces." in texts
    assert '" The structure of this film is easily the most tightly constructed in the history of cinema.' in texts


def test_ud_english_ewt_skips_multiword_and_empty_nodes():
    splits = corpora.read_ud_english_ewt()
    assert sizes(splits) == {"train": 4_276, "validation": 2_001, "test": 2_077}
    token_counts = {name: sum(len(s["tokens"]) for s in split) for name, split in splits.items()}
    assert token_counts == {"train": 69_030, "validation": 25_147, "test": 25_094}
    first = splits["validation"][0]
    assert first["text"] == "From the AP comes this story :"
    assert first["tokens"] == ["From", "the", "AP", "comes", "this", "story", ":"]
    assert first["upos"] == ["ADP", "DET", "PROPN", "VERB", "DET", "NOUN", "PUNCT"]
    assert all(len(s["tokens"]) == len(s["upos"]) for split in splits.values() for s in split)
    assert {tag for s in splits["validation"] for tag in s["upos"]} == set(corpora.UPOS_TAGS)


def test_wnut17_counts_and_tags():
    splits = corpora.read_wnut17()
    assert sizes(splits) == {"train": 3_394, "validation": 1_009, "test": 1_287}
    token_counts = {name: sum(len(s["tokens"]) for s in split) for name, split in splits.items()}
    assert token_counts == {"train": 62_730, "validation": 15_733, "test": 23_394}
    assert {tag for s in splits["train"] for tag in s["ner_tags"]} == set(corpora.WNUT17_TAGS)
    assert len(corpora.WNUT17_TAGS) == 13
    assert splits["test"][0]["tokens"][:3] == ["&", "gt", ";"]


def test_scitldr_joins_the_source_and_keeps_every_target():
    splits = corpora.read_scitldr()
    assert sizes(splits) == {"train": 1_992, "validation": 619}
    assert all(len(r["targets"]) == 1 for r in splits["train"])
    assert collections.Counter(len(r["targets"]) for r in splits["validation"]) == {3: 267, 2: 237, 1: 94, 4: 21}
    assert all(r["target"] == r["targets"][0] for split in splits.values() for r in split)
    assert splits["train"][0]["source"].startswith(
        "Due to the success of deep learning to solving a variety of challenging machine learning tasks, "
        "there is a rising interest"
    )


def test_seeded_split_is_a_reproducible_partition():
    examples = list(range(1000))
    first = corpora.seeded_split(examples, {"train": 0.8, "validation": 0.1, "test": 0.1})
    assert first == corpora.seeded_split(examples, {"train": 0.8, "validation": 0.1, "test": 0.1})
    assert sizes(first) == {"train": 800, "validation": 100, "test": 100}
    assert sorted(sum(first.values(), [])) == examples
    assert first != corpora.seeded_split(examples, {"train": 0.8, "validation": 0.1, "test": 0.1}, seed=7)


def test_rounding_never_loses_examples():
    assert sizes(corpora.seeded_split(list(range(7)), {"train": 0.5, "test": 0.25, "extra": 0.25})) == {
        "train": 3,
        "test": 2,
        "extra": 2,
    }
