"""Writes the `.keras` files that `tests/models/test_saved_models.py` loads.

Run once with the code whose files must keep loading (it was run at commit
de43b79, before layers owned their weights and fusion became named ops):

    PYTHONPATH=. python tests/models/data/make_saved_models.py

Each model is tiny, has dropout on (so files hold the dropout layers' seed
states where those existed), is compiled and trained one step (so the file
holds optimizer variables, in the order of the trainable variables), and is
saved with its inputs, its inference outputs and its optimizer variables by
path, in `saved_models/<name>.keras` and `saved_models/<name>.npz`.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kzoo  # noqa: E402
from kzoo import layers  # noqa: E402
from kzoo import models  # noqa: E402

DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "saved_models")
VOCABULARY = 32
TRANSFORMER = dict(
    vocabulary_size=VOCABULARY,
    num_layers=2,
    num_heads=2,
    hidden_dim=8,
    intermediate_dim=16,
    max_sequence_length=12,
    dropout=0.1,
)


def layers_model():
    """Every public layer in one functional model."""
    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    source_ids = keras.Input((None,), dtype="int32", name="source_ids")
    x = layers.TokenAndPositionEmbedding(VOCABULARY, 12, 8, mask_zero=True)(token_ids)
    source = layers.TokenAndPositionEmbedding(VOCABULARY, 12, 4, position="sinusoidal", merge="concat")(source_ids)
    source = source + layers.SinusoidalPositionEncoding()(source)
    source = layers.TransformerEncoderBlock(2, 16, dropout=0.1, activation="gelu")(source)
    source = layers.TransformerEncoderBlock(2, 16, dropout=0.1, norm_first=True, activation="relu")(source)
    x = layers.TransformerDecoderBlock(2, 16, dropout=0.1, norm_first=True, activation="gelu_approximate")(x, source)
    x = layers.TransformerDecoderBlock(2, 16, dropout=0.1, cross_attention=False, num_key_value_heads=1)(x)
    x = layers.MultiHeadAttention(4, 2, num_key_value_heads=2, dropout=0.1)(x, use_causal_mask=True)
    heads = keras.layers.Reshape((-1, 2, 4))(x)
    x = keras.layers.Reshape((-1, 8))(layers.RotaryEmbedding()(heads)) + layers.PositionEmbedding(12)(x)
    x = layers.FeedForward(16, activation="gelu_approximate", dropout=0.1)(x)
    return keras.Model({"token_ids": token_ids, "source_ids": source_ids}, keras.layers.Dense(VOCABULARY)(x))


def main():
    rng = np.random.default_rng(0)
    batch, length = 3, 8
    mask = (np.arange(length)[None] < np.array([[8], [6], [3]])).astype("int32")
    ids = rng.integers(1, VOCABULARY, (batch, length)).astype("int32") * mask
    bert_x = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask}
    gpt_x = {"token_ids": ids, "padding_mask": mask}
    seq2seq = dict(
        vocabulary_size=VOCABULARY,
        num_encoder_layers=1,
        num_decoder_layers=2,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=12,
        dropout=0.1,
    )
    cases = {
        "gpt_causal_lm": (models.GPTCausalLM(models.GPTBackbone(**TRANSFORMER)), gpt_x, ids),
        "bert_masked_lm": (
            models.BertMaskedLM(models.BertBackbone(**TRANSFORMER)),
            {**bert_x, "mask_positions": np.array([[1, 2], [0, 5], [1, 2]], "int32")},
            ids[:, :2],
        ),
        "bert_classifier": (models.BertClassifier(models.BertBackbone(**TRANSFORMER), 3), bert_x, ids[:, 0] % 3),
        "bert_token_classifier": (models.BertTokenClassifier(models.BertBackbone(**TRANSFORMER), 3), bert_x, ids % 3),
        "seq2seq_transformer": (
            models.Seq2SeqTransformer(models.Seq2SeqBackbone(**seq2seq)),
            {"encoder_token_ids": ids, "decoder_token_ids": ids[:, :5]},
            ids[:, :5],
        ),
        "seq2seq_transformer_untied": (
            models.Seq2SeqTransformer(models.Seq2SeqBackbone(**seq2seq, tie_embeddings=False)),
            {"encoder_token_ids": ids, "decoder_token_ids": ids[:, :5]},
            ids[:, :5],
        ),
        "bilstm_classifier": (
            models.BiLSTMClassifier(VOCABULARY, 3, 4, 4, num_layers=2, dropout=0.1),
            ids,
            ids[:, 0] % 3,
        ),
        "bilstm_tagger": (models.BiLSTMTagger(VOCABULARY, 5, 4, 4, dropout=0.1), ids, ids % 5),
        "rnn_language_model": (
            models.RNNLanguageModel(VOCABULARY, 4, 4, num_layers=2, cell="gru", dropout=0.1),
            ids,
            ids,
        ),
        "feed_forward_language_model": (
            models.FeedForwardLanguageModel(VOCABULARY, 3, 4, 8, num_layers=2, dropout=0.1),
            ids,
            ids,
        ),
        "layers": (layers_model(), {"token_ids": ids, "source_ids": ids[:, :6]}, ids),
    }
    os.makedirs(DIRECTORY, exist_ok=True)
    for name, (model, x, y) in cases.items():
        keras.utils.set_random_seed(1)
        if isinstance(model, kzoo.models.Task):
            model.compile()
        else:
            model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, epochs=1, batch_size=batch, verbose=0)
        model.save(os.path.join(DIRECTORY, f"{name}.keras"))
        arrays = {f"input/{key}": value for key, value in (x if isinstance(x, dict) else {"inputs": x}).items()}
        arrays["output"] = keras.ops.convert_to_numpy(model(x))
        for variable in model.optimizer.variables:
            arrays[f"optimizer/{variable.path}"] = keras.ops.convert_to_numpy(variable)
        np.savez_compressed(os.path.join(DIRECTORY, f"{name}.npz"), **arrays)
        print(name, os.path.getsize(os.path.join(DIRECTORY, f"{name}.keras")))


if __name__ == "__main__":
    main()
