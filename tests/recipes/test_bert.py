"""bert_pretrain.py, then bert_classify.py and bert_tag.py from scratch and from its output."""

import argparse
import json

import bert_classify
import bert_pretrain
import bert_tag
import keras
import pytest

from tests.recipes.conftest import check_run_files


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, tfds_dir):
    """One quick bert_pretrain.py run shared by the fine-tuning tests."""
    output_dir = tmp_path_factory.mktemp("bert_pretrain")
    bert_pretrain.main(["--quick", "--output-dir", str(output_dir), "--tfds-dir", str(tfds_dir)])
    return output_dir


def test_pretrain_writes_a_masked_lm_and_its_tokenizer(pretrained):
    check_run_files(pretrained)
    record = json.loads((pretrained / "metrics.json").read_text())
    assert record["metrics"]["texts"] == bert_pretrain.QUICK["max_texts"]
    # The model carries its tokenizer. Cased by default: a capital tells a proper noun apart,
    # and the taggers read it.
    tokenizer = keras.saving.load_model(pretrained / "model.keras", compile=False).tokenizer
    assert list(tokenizer("Apple")) != list(tokenizer("apple"))


@pytest.mark.slow  # by default the recipe runs from a checkpoint (test_classify_from_a_hugging_face_checkpoint)
def test_classify_from_scratch_beside_the_bag_of_words_baseline(run_recipe):
    output_dir, record = run_recipe(bert_classify)
    check_run_files(output_dir, model_dirs=["bert", "bag_of_words"])
    metrics = record["metrics"]
    assert metrics["bert_initialization"] == "random"
    assert 0 <= metrics["bert_test_accuracy"] <= 1 and 0 <= metrics["bag_of_words_test_accuracy"] <= 1


def test_classify_from_a_hugging_face_checkpoint(run_recipe, tmp_path):
    """`--checkpoint DIR`: a Hugging Face BERT folder's weights and tokenizer; the saved
    classifier carries the tokenizer and takes text."""
    from tests.models import hf_folders

    folder = tmp_path / "bert"
    hf_folders.write_bert(folder, "BertModel")
    output_dir, record = run_recipe(bert_classify, "--checkpoint", str(folder), "--sequence-length", "32")
    assert record["metrics"]["bert_initialization"] == f"checkpoint: {folder}"
    assert record["settings"]["learning_rate"] == bert_classify.CHECKPOINT_DEFAULTS["learning_rate"]
    classifier = keras.saving.load_model(output_dir / "model.keras", compile=False)
    assert classifier.tokenizer.get_vocabulary() == hf_folders.VOCABULARY
    labels = classifier.predict(["a fine film", "dull"], verbose=0)
    assert labels.shape == (2,) and set(labels.tolist()) <= {0, 1}


def test_minilm_names_the_packaged_folder():
    import _common

    folder = _common.checkpoint_dir(argparse.Namespace(checkpoint="minilm"))
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def test_tag_named_entities_from_the_pretrained_backbone(run_recipe, pretrained):
    output_dir, record = run_recipe(bert_tag, "--tasks", "ner", "--pretrained", str(pretrained))
    check_run_files(output_dir, model_dirs=["ner"])
    metrics = record["metrics"]
    for split in ("validation", "test"):
        assert 0 <= metrics[f"ner_{split}_entity_f1"] <= 1
    assert (output_dir / "ner" / "model.keras").is_file()


@pytest.mark.parametrize(
    "recipe, flags, message",
    [
        (bert_classify, ["--pretrained", "/nonexistent/run"], "--checkpoint /nonexistent/run"),
        (bert_tag, ["--tasks", "upos,chunking"], "Unknown --tasks ['chunking']"),
        (bert_pretrain, ["--datasets", "kzoo_rt_polarity,imdb_reviews"], "no English text known for ['imdb_reviews']"),
    ],
)
def test_bad_input_exits_with_a_clear_message(recipe, flags, message, run_recipe, capsys):
    with pytest.raises(SystemExit):
        run_recipe(recipe, *flags)
    assert message in capsys.readouterr().err


def test_bio_entities_follow_conlleval():
    tags = ["B-person", "I-person", "O", "I-location", "B-location", "I-group", "I-group"]
    assert bert_tag.bio_entities(tags) == [(0, 2, "person"), (3, 4, "location"), (4, 5, "location"), (5, 7, "group")]


def test_entity_scores_need_span_and_type():
    names = ("O", "B-person", "I-person", "B-location", "I-location")
    gold = [[1, 2, 0, 3], [3, 4]]
    predicted = [[1, 2, 0, 1], [3]]  # Right, wrong type, cut short (the rest counts as "O").
    scores = bert_tag.entity_scores(gold, predicted, names)
    assert scores == pytest.approx({"precision": 1 / 3, "recall": 1 / 3, "f1": 1 / 3})


def test_entity_scores_pair_each_sentence_with_its_own_gold_tags(tfds_dir):
    """Through the recipe's bucketed batches (bucketing reorders sentences), a tagger that
    answers every sentence's gold tags scores entity F1 1: predictions meet their own gold."""
    import _common
    import numpy as np

    import kzoo.data
    from kzoo.checkpoints.hf import tokenizer_files
    from tests.models import hf_folders

    tokenizer = tokenizer_files.load_tokenizer(hf_folders.minilm_dir())
    splits = {"validation": kzoo.data.load("kzoo_wnut17", "validation", tfds_dir, as_supervised=True).take(300)}

    def batches(split, bucket_boundaries=(16, 24, 32)):
        return kzoo.data.tagging_batches(
            splits[split],
            tokenizer,
            64,
            16,
            label_piece="first",
            bucket_boundaries=bucket_boundaries,
            **_common.bert_special_ids(tokenizer),
        )

    gold_by_ids = {}
    for x, y, _ in batches("validation", bucket_boundaries=None):
        for ids, tags in zip(x["token_ids"].numpy(), y.numpy()):
            gold_by_ids[tuple(ids[ids > 0])] = tags[ids > 0]

    class Oracle:
        def predict_on_batch(self, x):
            ids = np.asarray(x["token_ids"])
            logits = np.zeros((*ids.shape, len(bert_tag.WNUT17_TAGS)), "float32")
            for row, row_ids in enumerate(ids):
                tags = gold_by_ids[tuple(row_ids[row_ids > 0])]
                logits[row, np.arange(len(tags)), tags] = 1.0
            return logits

    assert [len(ids) for ids in gold_by_ids] != sorted(len(ids) for ids in gold_by_ids)  # bucketing would reorder
    metrics = bert_tag.evaluate_entities(Oracle(), batches, splits, ["validation"])
    assert metrics["validation_entity_f1"] > 0.99, metrics
