"""Bad corpus files fail loudly: a `DataFileError` (a `ValueError`) naming the file and the line."""

import gzip
import lzma
import re

import pytest

from kzoo.data import DataFileError
from kzoo.data import corpora
from kzoo.data import readers

CONLLU_SENTENCE = (
    "# sent_id = s1\n"
    "# text = I don't know\n"
    "1\tI\tI\tPRON\tPRP\t_\t3\tnsubj\t_\t_\n"
    "2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_\n"
    "2\tdo\tdo\tAUX\tVBP\t_\t4\taux\t_\t_\n"
    "3\tn't\tnot\tPART\tRB\t_\t4\tadvmod\t_\t_\n"
    "3.1\tknow\tknow\tVERB\tVB\t_\t_\t_\t0:root\t_\n"
    "4\tknow\tknow\tVERB\tVB\t_\t0\troot\t_\t_\n"
    "\n"
)


def ud_files(train):
    return {
        "ud-english-ewt/en_ewt-ud-train.every3rd-doc.conllu": train,
        "ud-english-ewt/en_ewt-ud-dev.conllu": CONLLU_SENTENCE,
        "ud-english-ewt/en_ewt-ud-test.conllu": CONLLU_SENTENCE,
    }


def wnut_files(train):
    return {
        "wnut17/wnut17train.conll": train,
        "wnut17/emerging.dev.conll": "a\tO\n",
        "wnut17/emerging.test.annotated": "a\tO\n",
    }


def raises_at(file_name, line_number, message):
    """Expects a `DataFileError` for `file_name` at `line_number` (None: the whole file) saying `message` (a regex)."""
    where = re.escape(file_name) + (f", line {line_number}: " if line_number else ": ")
    return pytest.raises(DataFileError, match=f"{where}.*{message}")


def test_data_file_error_is_a_value_error():
    assert issubclass(DataFileError, ValueError)


def test_missing_file_names_what_was_looked_for(write_corpus):
    source = write_corpus({"spa-eng/other.txt": "Go.\tVe.\n"})
    with raises_at("spa.txt", None, r"no such file \(looked for spa\.txt, spa\.txt\.xz, spa\.txt\.gz"):
        corpora.read_spa_eng(source)


def test_missing_source_folder_says_how_to_point_elsewhere(tmp_path):
    with pytest.raises(DataFileError, match="KZOO_DATA_DIR"):
        corpora.read_wnut17(tmp_path / "nowhere")


def test_empty_file(write_corpus):
    source = write_corpus({"tinyshakespeare/input.txt": ""})
    with raises_at("input.txt", None, "empty"):
        corpora.read_tiny_shakespeare(source)


def test_empty_compressed_file(write_corpus):
    source = write_corpus({"tinyshakespeare/input.txt.xz": lzma.compress(b"")})
    with pytest.raises(DataFileError, match=r"input\.txt\.xz: the file is empty"):
        corpora.read_tiny_shakespeare(source)


def test_damaged_archive(write_corpus):
    source = write_corpus({"tinyshakespeare/input.txt.gz": gzip.compress(b"To be")[:-6]})
    with pytest.raises(DataFileError, match=r"input\.txt\.gz: cannot be read"):
        corpora.read_tiny_shakespeare(source)


def test_two_versions_of_a_file_are_ambiguous(write_corpus):
    source = write_corpus({"tinyshakespeare/input.txt": "a", "tinyshakespeare/input.txt.gz": gzip.compress(b"b")})
    with pytest.raises(DataFileError, match="keep only one"):
        corpora.read_tiny_shakespeare(source)


def test_non_utf8_bytes_name_the_line(write_corpus):
    source = write_corpus(
        {"rt-polarity/rt-polarity.pos": b"good\n", "rt-polarity/rt-polarity.neg": b"ok\nbad \xe9t\xe9\n"}
    )
    with raises_at("rt-polarity.neg", 2, "not valid UTF-8"):
        corpora.read_rt_polarity(source)


def test_non_utf8_inside_a_compressed_file_names_the_line(write_corpus):
    source = write_corpus({"tinyshakespeare/input.txt.xz": lzma.compress(b"one\ntwo\nthr\xffee\n")})
    with raises_at("input.txt.xz", 3, "not valid UTF-8"):
        corpora.read_tiny_shakespeare(source)


def test_wrong_number_of_fields_names_the_line(write_corpus):
    source = write_corpus({"spa-eng/spa.txt": "Go.\tVe.\nHi.\nRun!\tCorre.\n"})
    with raises_at("spa.txt", 2, "expected 2 tab-separated fields, found 1"):
        corpora.read_spa_eng(source)


def test_blank_field_names_the_line(write_corpus):
    source = write_corpus({"spa-eng/spa.txt": "Go.\tVe.\nHi.\t \n"})
    with raises_at("spa.txt", 2, "blank"):
        corpora.read_spa_eng(source)


def test_blank_line_in_a_one_example_per_line_file(write_corpus):
    source = write_corpus({"rt-polarity/rt-polarity.pos": "good\n\nfine\n", "rt-polarity/rt-polarity.neg": "bad\n"})
    with raises_at("rt-polarity.pos", 2, "blank"):
        corpora.read_rt_polarity(source)


def sentiment_files(imdb):
    return {
        "sentiment-labelled-sentences/amazon_cells_labelled.txt": "Great phone.\t1\n",
        "sentiment-labelled-sentences/imdb_labelled.txt": imdb,
        "sentiment-labelled-sentences/yelp_labelled.txt": "Cold food.\t0\n",
    }


def test_sentiment_lines_split_on_the_last_tab_without_quote_handling(write_corpus):
    source = write_corpus(sentiment_files('A "quoted\ttab" film.\t1\n"half\t1\nsentence.\t0\nnext\x85line\t1\n'))
    examples = sum(corpora.read_sentiment_sentences(source).values(), [])
    imdb = {e["text"]: e["label"] for e in examples if e["source"] == "imdb"}
    assert imdb == {
        'A "quoted\ttab" film.': "positive",
        '"half': "positive",
        "sentence.": "negative",
        "next\x85line": "positive",  # U+0085 is not a line break here
    }


def test_sentiment_label_outside_the_label_set(write_corpus):
    source = write_corpus(sentiment_files("Fine.\t1\nMeh.\t2\n"))
    with raises_at("imdb_labelled.txt", 2, r"label '2' is not one of \['0', '1'\]"):
        corpora.read_sentiment_sentences(source)


def test_wnut_tag_outside_the_13_tags(write_corpus):
    source = write_corpus(wnut_files("Paris\tB-location\n\nAcme\tB-company\n"))
    with raises_at("wnut17train.conll", 3, "'B-company' is not one of"):
        corpora.read_wnut17(source)


def test_wnut_whitespace_only_lines_end_sentences(write_corpus):
    source = write_corpus(wnut_files("Paris\tB-location\nis\tO\n\t\nAcme\tB-corporation\n\n\n"))
    assert corpora.read_wnut17(source)["train"] == [
        {"tokens": ["Paris", "is"], "ner_tags": ["B-location", "O"]},
        {"tokens": ["Acme"], "ner_tags": ["B-corporation"]},
    ]


def test_conllu_skips_multiword_tokens_and_empty_nodes(write_corpus):
    sentence = corpora.read_ud_english_ewt(write_corpus(ud_files(CONLLU_SENTENCE)))["train"][0]
    assert sentence == {
        "sent_id": "s1",
        "text": "I don't know",
        "tokens": ["I", "do", "n't", "know"],
        "upos": ["PRON", "AUX", "PART", "VERB"],
    }


def test_conllu_upos_outside_the_17_tags(write_corpus):
    source = write_corpus(ud_files(CONLLU_SENTENCE.replace("\tPART\t", "\tPRT\t")))
    with raises_at("en_ewt-ud-train.every3rd-doc.conllu", 6, "'PRT'"):
        corpora.read_ud_english_ewt(source)


def test_conllu_wrong_column_count(write_corpus):
    three_columns = CONLLU_SENTENCE.replace("4\tknow\tknow\tVERB\tVB\t_\t0\troot\t_\t_", "4\tknow\tVERB")
    source = write_corpus(ud_files(three_columns))
    with raises_at("en_ewt-ud-train.every3rd-doc.conllu", 8, "expected 10"):
        corpora.read_ud_english_ewt(source)


def test_conllu_bad_id(write_corpus):
    source = write_corpus(ud_files(CONLLU_SENTENCE.replace("1\tI\t", "one\tI\t")))
    with raises_at("en_ewt-ud-train.every3rd-doc.conllu", 3, "ID 'one'"):
        corpora.read_ud_english_ewt(source)


def test_conllu_sentence_without_text_comment(write_corpus):
    source = write_corpus(ud_files(CONLLU_SENTENCE.replace("# text = I don't know\n", "")))
    with raises_at("en_ewt-ud-train.every3rd-doc.conllu", 1, "no .# text = "):
        corpora.read_ud_english_ewt(source)


def scitldr_files(train):
    dev = '{"paper_id": "p", "title": "t", "source": ["s"], "target": ["a", "b"]}'
    return {"scitldr-a/train.jsonl": train, "scitldr-a/dev.jsonl": dev}


def test_scitldr_invalid_json_names_the_line(write_corpus):
    record = '{"paper_id": "p", "title": "t", "source": ["s"], "target": ["a"]}'
    source = write_corpus(scitldr_files(f"{record}\n{{broken\n"))
    with raises_at("train.jsonl", 2, "not valid JSON"):
        corpora.read_scitldr(source)


def test_scitldr_missing_key_and_empty_target(write_corpus):
    source = write_corpus(scitldr_files('{"paper_id": "p", "title": "t", "source": ["s"]}'))
    with raises_at("train.jsonl", 1, r"no \['target'\]"):
        corpora.read_scitldr(source)
    source = write_corpus(scitldr_files('{"paper_id": "p", "title": "t", "source": ["s"], "target": []}'))
    with raises_at("train.jsonl", 1, "non-empty list"):
        corpora.read_scitldr(source)


def test_crlf_line_ends_are_line_ends(tmp_path):
    path = tmp_path / "pairs.txt"
    path.write_bytes(b"Go.\tVe.\r\nHi.\tHola.\r\n")
    assert readers.read_tab_separated(path, 2) == [(1, ["Go.", "Ve."]), (2, ["Hi.", "Hola."])]


def test_kzoo_data_dir_overrides_the_default(monkeypatch, tmp_path):
    assert corpora.corpus_dir().samefile(corpora.corpus_dir(None))
    assert (corpora.corpus_dir() / "spa-eng" / "spa.txt.xz").is_file()
    monkeypatch.setenv("KZOO_DATA_DIR", str(tmp_path))
    assert corpora.corpus_dir() == tmp_path
