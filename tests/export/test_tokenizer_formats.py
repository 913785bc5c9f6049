"""Every tokenizer kind kzoo supports, carried by a GPT, exports to every format and verifies.

One tiny random GPT per tokenizer kind is saved once and exported to each format on its own,
so that a format that fails for one kind fails one test. What each file must satisfy is what
the exporter checks against Keras (float32: logits and greedy tokens; quantized: the quality
bound; text signatures and LiteRT-LM bundles: Keras' text, decoded the same way); the tests
then read the files again: the SavedModel's `generate_text` against Keras' `generate` on the
same prompt, the TFLite files' signatures, the bundle's tokenizer against the Keras one.
"""

import json

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf
import tokenizers

from kzoo import data
from kzoo import export
from kzoo import models
from kzoo.export import litertlm_model
from kzoo.tokenizers.bert import BertTokenizer
from tests.export.tiny_models import build

MAX_LENGTH = 32
TEXTS = ["the cat sat on the mat", "a dog ran to the park", "Café, déjà vu 😀 中文 [SEP]", "ROMEO: But soft!"]
PROMPT = "Café 😀 the"


def _gpt2_bpe():
    """keras-hub's GPT-2 tokenizer over a byte-level BPE fitted by `tokenizers` (<|endoftext|> at 0)."""
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(TEXTS * 4, vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False)
    model = json.loads(bpe.to_str())["model"]
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in model["merges"]]
    return keras_hub.models.GPT2Tokenizer(vocabulary=model["vocab"], merges=merges)


TOKENIZERS = {
    "character": lambda: data.character_tokenizer(128),
    "word_piece": lambda: data.word_piece_tokenizer(data.train_word_piece_vocabulary(TEXTS, 80)),
    "bert": lambda: BertTokenizer(data.train_word_piece_vocabulary(TEXTS, 80, lowercase=True), lowercase=True),
    "gpt2_bpe": _gpt2_bpe,
}


@pytest.fixture(scope="module")
def saved_gpt(tmp_path_factory):
    """`saved_gpt(kind) -> path`: a tiny GPT carrying a tokenizer of `kind`, saved once."""
    paths = {}

    def get(kind, hidden_dim=16):
        if (kind, hidden_dim) not in paths:
            tokenizer = TOKENIZERS[kind]()
            backbone = build(
                "gpt",
                vocabulary_size=tokenizer.vocabulary_size(),
                max_sequence_length=MAX_LENGTH,
                hidden_dim=hidden_dim,
                intermediate_dim=2 * hidden_dim,
            )
            path = tmp_path_factory.mktemp(kind) / "model.keras"
            models.GPTCausalLM(backbone.backbone, tokenizer=tokenizer).save(path)
            paths[kind, hidden_dim] = path
        return paths[kind, hidden_dim]

    return get


# Every (kind, format). A TFLite file holds no tokenizer, so only byte-level BPE (whose lookup
# tables once ended up in the TFLite graph) runs them by default; the rest are slow. So is the
# int4 bundle but for BPE: it carries the tokenizer as the float32 bundle does.
PAIRS = [
    pytest.param(
        kind,
        format,
        id=f"{kind}-{format}",
        marks=[pytest.mark.slow] * (format.startswith(("tflite", "litertlm_int4")) and kind != "gpt2_bpe"),
    )
    for kind in TOKENIZERS
    for format in export.FORMATS
]


@pytest.mark.parametrize("kind, format", PAIRS)
def test_every_tokenizer_kind_exports_to_every_format(kind, format, saved_gpt, tmp_path):
    # int4 weights come in blocks of 32: the smallest width that can be cut into them.
    path = saved_gpt(kind, hidden_dim=32 if format == "litertlm_int4" else 16)
    out = tmp_path / "export"
    report = export.export(
        path,
        out,
        formats=[format],
        num_examples=2,
        num_representative=4,
        generate_tokens=6,
        latency_runs=1,
        # Random weights: full integer int8 and int4 are far from float on them; the bound is not
        # the point here.
        quality_bounds={"tflite_int8": 10.0, "litertlm_int4": 10.0},
    )
    lm = keras.saving.load_model(path)
    tokenizer = lm.tokenizer
    ids = np.asarray(tokenizer(PROMPT)).tolist()
    if format == "savedmodel":
        record = report["artifacts"]["savedmodel"]
        assert record["generation"]["matches_keras"] and record["text"]["matches_keras"]
        generate_text = tf.saved_model.load(str(out / "savedmodel")).signatures["generate_text"]
        text = generate_text(
            text=tf.constant([PROMPT]), max_new_tokens=tf.constant(5), stop_token_ids=tf.constant([], tf.int32)
        )["text"][0]
        expected = lm.generate([ids], max_length=len(ids) + 5, jit_compile=False)[0]
        assert export.verification.text(text) == export.verification.text(tokenizer.detokenize(expected))
    elif format.startswith("litertlm"):
        names = ["litertlm_int4"] if format == "litertlm_int4" else ["litertlm", "litertlm_int8"]
        for name in names:
            assert report["artifacts"][name]["tokenizer"]["matches_keras"]
        if format == "litertlm":
            assert report["artifacts"]["litertlm"]["generation"]["matches_keras"]
        runtime = litertlm_model.LiteRTLMModel(out / report["artifacts"][names[0]]["path"])
        try:
            assert runtime.tokenize(PROMPT) == ids
        finally:
            runtime.close()
    else:
        record = report["artifacts"][format]
        lite = export.LiteRTModel(out / export.tflite_file_name(format))
        if format == "tflite_fp32":
            assert record["generation"]["matches_keras"]
            expected = lm.generate([ids], max_length=len(ids) + 5, jit_compile=False)[0]
            assert lite.generate(ids, len(ids) + 5) == expected
        else:
            assert record["quality"]["cross_entropy_increase"] <= record["quality"]["bound"]
            inputs = {"token_ids": np.asarray([ids], np.int32), "padding_mask": np.ones((1, len(ids)), np.int32)}
            assert lite.run(**inputs)["logits"].shape == (1, len(ids), lm.backbone.vocabulary_size)
