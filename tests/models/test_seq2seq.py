"""The encoder-decoder Transformer: presets, masking, cached decoding, training, saving."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from kzoo import models
from tests.models.fresh_process import assert_reload_in_fresh_process
from tests.models.model_checks import dense
from tests.models.model_checks import pad
from tests.models.model_checks import repeated

VOCABULARY_SIZE = 30
BOS_ID, EOS_ID = 1, 2
TINY_CONFIG = dict(
    vocabulary_size=VOCABULARY_SIZE,
    num_encoder_layers=2,
    num_decoder_layers=2,
    num_heads=2,
    hidden_dim=16,
    intermediate_dim=32,
    max_sequence_length=24,
    dropout=0.0,
)
# Tracing a train step dominates the test time (AdamW adds a few ops per
# variable), so the training tests use one layer per stack.
ONE_LAYER = dict(num_encoder_layers=1, num_decoder_layers=1)


def tiny_model(tie_embeddings=True, **overrides):
    backbone = models.Seq2SeqBackbone(**{**TINY_CONFIG, "tie_embeddings": tie_embeddings, **overrides})
    return models.Seq2SeqTransformer(backbone)


def reversal_batch(seed=0, lengths=(8, 6, 5, 3)):
    """Source sentences and their reversals, right-padded with 0:
    `(x, y, sample_weight)` for teacher forcing, decoder input = [BOS] + target."""
    rng = np.random.default_rng(seed)
    source = np.zeros((len(lengths), max(lengths)), "int32")
    decoder_input = np.zeros((len(lengths), max(lengths) + 1), "int32")
    target = np.zeros_like(decoder_input)
    for row, length in enumerate(lengths):
        sentence = rng.integers(EOS_ID + 1, VOCABULARY_SIZE, length)
        source[row, :length] = sentence
        decoder_input[row, : length + 1] = [BOS_ID, *sentence[::-1]]
        target[row, : length + 1] = [*sentence[::-1], EOS_ID]
    x = {"encoder_token_ids": source, "decoder_token_ids": decoder_input}
    return x, target, (target != 0).astype("float32")


def logits_of(model, encoder_token_ids, decoder_token_ids):
    return ops.convert_to_numpy(model({"encoder_token_ids": encoder_token_ids, "decoder_token_ids": decoder_token_ids}))


def loss_of(model, x, y, sample_weight):
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return float(loss_fn(y, model(x), sample_weight=sample_weight))


# --- Presets and parameter counts ---


def paper_parameter_count(vocabulary_size, num_layers, d_model, d_ff):
    """Parameters of the paper's Transformer with one shared embedding/softmax table.

    Multi-head attention: W^Q, W^K, W^V, W^O are d_model x d_model in all
    (h heads of d_model/h), each with a bias. Feed-forward (eq. 2): W_1, b_1,
    W_2, b_2. LayerNorm: gain and bias. An encoder layer has one attention and
    two LayerNorms, a decoder layer two attentions (self, encoder-decoder) and
    three. The pre-softmax projection is the embedding table, with no bias;
    sinusoidal positions have no parameters.
    """
    attention = 4 * (d_model * d_model + d_model)
    feed_forward = d_model * d_ff + d_ff + d_ff * d_model + d_model
    layer_norm = 2 * d_model
    encoder_layer = attention + feed_forward + 2 * layer_norm
    decoder_layer = 2 * attention + feed_forward + 3 * layer_norm
    return vocabulary_size * d_model + num_layers * (encoder_layer + decoder_layer)


@pytest.mark.parametrize(
    "preset, d_model, d_ff, table_3",
    [
        # base: 37000 x 512 = 18,944,000 (table) + 6 x 3,152,384 (encoder layers)
        # + 6 x 4,204,032 (decoder layers) = 63,082,496; Table 3 says 65M.
        ("transformer_base", 512, 2048, 65e6),
        # big: 37,888,000 + 6 x 12,596,224 + 6 x 16,796,672 = 214,245,376; Table 3 says 213M.
        ("transformer_big", 1024, 4096, 213e6),
    ],
)
def test_paper_presets_have_the_paper_parameter_count(preset, d_model, d_ff, table_3):
    # The paper's English-German vocabulary: 37000 shared BPE tokens.
    expected = paper_parameter_count(37000, num_layers=6, d_model=d_model, d_ff=d_ff)
    # Shapes only: variables made in this scope are never initialized (no 200M random draws).
    with keras.StatelessScope(initialize_variables=False):
        model = models.Seq2SeqTransformer.from_preset(preset)
    backbone = model.backbone
    assert (backbone.hidden_dim, backbone.intermediate_dim, backbone.vocabulary_size) == (d_model, d_ff, 37000)
    assert backbone.count_params() == expected
    assert model.count_params() == expected  # the output projection is the shared table
    assert abs(expected - table_3) / table_3 < 0.04
    assert f"{expected:,}" in models.PRESETS[preset]["description"]


def test_small_presets_build_and_run():
    assert models.list_presets("Seq2SeqTransformer") == [
        "transformer_base",
        "transformer_big",
        "transformer_small",
        "transformer_tiny",
    ]
    for preset in ("transformer_tiny", "transformer_small"):
        model = models.Seq2SeqTransformer.from_preset(preset)
        config = models.PRESETS[preset]["config"]
        expected = paper_parameter_count(
            config["vocabulary_size"], config["num_encoder_layers"], config["hidden_dim"], config["intermediate_dim"]
        )
        assert model.count_params() == expected
        assert f"{expected / 1e6:.1f}M parameters" in models.PRESETS[preset]["description"]
        logits = logits_of(model, np.ones((2, 10), "int32"), np.ones((2, 7), "int32"))
        assert logits.shape == (2, 7, config["vocabulary_size"])


# --- Embedding sharing and gradients ---


@pytest.mark.parametrize("tie_embeddings", [True, False])
def test_gradients_reach_every_trainable_variable(tie_embeddings):
    model = tiny_model(tie_embeddings)
    x, y, sample_weight = reversal_batch()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True), sample_weight=sample_weight)
    variables = model.trainable_variables
    gradients = tape.gradient(loss, variables)
    for variable, gradient in zip(variables, gradients):
        assert gradient is not None, variable.path
        assert np.any(dense(gradient) != 0), variable.path

    tables = [variable for variable in variables if tuple(variable.shape) == (VOCABULARY_SIZE, 16)]
    if tie_embeddings:
        backbone = model.backbone
        assert len(tables) == 1  # one table, not three copies
        assert backbone.encoder_embedding.embeddings is tables[0]
        assert backbone.decoder_embedding.embeddings is tables[0]
        assert model.lm_head.embedding.embeddings is tables[0]
    else:
        assert len(tables) == 2  # encoder and decoder; the output projection is (d, V)


def test_shared_table_gets_gradient_from_the_encoder_side():
    # The encoder's lookups land in the shared table: the rows of the source
    # tokens, and only those, get a gradient from the encoder's real outputs.
    model = tiny_model()
    x, _, _ = reversal_batch()
    source = x["encoder_token_ids"]
    table = model.backbone.encoder_embedding.embeddings
    with tf.GradientTape() as tape:
        encoder_output = model.backbone(x)["encoder_sequence_output"]
        loss = ops.sum(ops.where((source != 0)[..., None], encoder_output, 0.0) ** 2)
    gradient = dense(tape.gradient(loss, table))
    used = np.unique(source[source != 0])
    unused = np.setdiff1d(np.arange(VOCABULARY_SIZE), used)  # includes padding, id 0
    assert np.all(np.abs(gradient[used]).sum(axis=1) > 0)
    assert np.all(gradient[unused] == 0)


# --- Masking ---


@pytest.mark.parametrize("tie_embeddings", [True, False])
def test_outputs_of_real_tokens_do_not_depend_on_padding(tie_embeddings):
    model = tiny_model(tie_embeddings)
    x, _, _ = reversal_batch()
    source, target = x["encoder_token_ids"], x["decoder_token_ids"]
    reference = logits_of(model, source, target)
    real = target != 0

    # Encoder side: more padding after the source.
    np.testing.assert_allclose(logits_of(model, pad(source, 7), target)[real], reference[real], atol=1e-5)
    backbone_outputs = model.backbone({"encoder_token_ids": source, "decoder_token_ids": target})
    padded_outputs = model.backbone({"encoder_token_ids": pad(source, 7), "decoder_token_ids": target})
    source_real = source != 0
    np.testing.assert_allclose(
        np.asarray(padded_outputs["encoder_sequence_output"])[:, : source.shape[1]][source_real],
        np.asarray(backbone_outputs["encoder_sequence_output"])[source_real],
        atol=1e-5,
    )
    # Decoder side: more padding after the target.
    padded = logits_of(model, source, pad(target, 5))[:, : target.shape[1]]
    np.testing.assert_allclose(padded[real], reference[real], atol=1e-5)
    # Padding ids are not tokens: replacing them changes the real outputs.
    filled = np.where(source == 0, 7, source)
    assert not np.allclose(logits_of(model, filled, target)[real], reference[real], atol=1e-3)


def test_decoder_output_at_t_does_not_depend_on_later_tokens():
    model = tiny_model()
    x, _, _ = reversal_batch()
    source, target = x["encoder_token_ids"], np.where(x["decoder_token_ids"] == 0, 5, x["decoder_token_ids"])
    reference = logits_of(model, source, target)
    for t in range(target.shape[1] - 1):
        changed = target.copy()
        changed[:, t + 1 :] = np.random.default_rng(t).integers(3, VOCABULARY_SIZE, changed[:, t + 1 :].shape)
        logits = logits_of(model, source, changed)
        np.testing.assert_allclose(logits[:, : t + 1], reference[:, : t + 1], atol=1e-5)
        assert not np.allclose(logits[:, t + 1 :], reference[:, t + 1 :], atol=1e-3)


# --- Cached decoding ---


@pytest.mark.parametrize("tie_embeddings", [True, False])
def test_cached_decoding_matches_teacher_forcing(tie_embeddings):
    model = tiny_model(tie_embeddings)
    x, _, _ = reversal_batch()
    source, target = x["encoder_token_ids"], np.where(x["decoder_token_ids"] == 0, 5, x["decoder_token_ids"])
    batch, length = target.shape
    reference = logits_of(model, source, target)

    prefill = 3
    logits, state = model.prefill(target[:, :prefill], length, encoder_token_ids=source)
    steps = [ops.convert_to_numpy(logits)]
    step = tf.function(model.decode)  # as `generate` runs it: a graph with a tensor index
    for t in range(prefill, length):
        logits, new_state = step(target[:, t : t + 1], state, tf.constant(t))
        steps.append(ops.convert_to_numpy(logits))
        # Only the self-attention cache changes; the source's keys, values and mask are read.
        changed = {name for name in state if not np.array_equal(new_state[name], state[name])}
        assert changed <= {f"{kind}_cache_{i}" for kind in ("key", "value") for i in range(2)}, changed
        state = new_state
    np.testing.assert_allclose(np.concatenate(steps, axis=1), reference, atol=1e-5)
    # Per decoder block, keys and values (B, h, S, d/h) of the encoder output.
    assert [tuple(state[f"cross_{kind}_cache_{i}"].shape) for i in range(2) for kind in ("key", "value")] == [
        (batch, 2, source.shape[1], 8)
    ] * 4


# --- Training ---


def test_overfits_a_tiny_batch():
    model = tiny_model(**ONE_LAYER)
    x, y, sample_weight = reversal_batch()
    model.compile(learning_rate=1e-2, warmup_steps=5)
    before = loss_of(model, x, y, sample_weight)
    model.fit(repeated(x), repeated(y), sample_weight=repeated(sample_weight), batch_size=4, shuffle=False, verbose=0)
    after = loss_of(model, x, y, sample_weight)
    assert after <= 0.1 * before, (before, after)


# Each policy with one of the two output layers. One eager step: tracing a train function per
# policy would be most of the test's time; training in graph mode is tested above (and a mixed
# precision step in graph mode, loss scaling included, in test_feed_forward_lm.py).
@pytest.mark.parametrize("policy, tie_embeddings", [("mixed_float16", True), ("mixed_bfloat16", False)])
def test_mixed_precision_forward_and_fit_step(policy, tie_embeddings):
    keras.config.set_dtype_policy(policy)
    model = tiny_model(tie_embeddings, **ONE_LAYER)
    x, y, sample_weight = reversal_batch()
    logits = model(x)
    assert logits.dtype == "float32"
    assert np.all(np.isfinite(np.asarray(logits)))
    model.compile(run_eagerly=True)
    if policy == "mixed_float16":
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    loss = model.train_on_batch(x, y, sample_weight=sample_weight, return_dict=True)["loss"]
    assert np.isfinite(loss)
    assert all(np.all(np.isfinite(np.asarray(variable))) for variable in model.trainable_variables)


def test_explicit_dtype_policy_without_a_global_one():
    model = tiny_model(dtype="mixed_float16")
    x, _, _ = reversal_batch()
    assert model.backbone.decoder_blocks[0].compute_dtype == "float16"
    assert model(x).dtype == "float32"
    model.compile()
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)


# --- Saving ---


def test_keras_round_trip_in_a_fresh_process(tmp_path):
    x, _, _ = reversal_batch()
    tied, untied = tiny_model(), tiny_model(tie_embeddings=False)
    tied.compile(warmup_steps=10, decay_steps=100)
    assert_reload_in_fresh_process(
        tmp_path,
        {"tied": (tied, x), "untied": (untied, x), "backbone": (tiny_model().backbone, x)},
    )


def test_config_round_trip():
    model = tiny_model(tie_embeddings=False)
    clone = models.Seq2SeqTransformer.from_config(model.get_config())
    assert clone.backbone.get_config() == model.backbone.get_config()
    assert clone.count_params() == model.count_params()


# --- Validation ---


BAD_CONFIGS = [
    ({"vocabulary_size": 0}, "vocabulary_size"),
    ({"num_encoder_layers": 0}, "num_encoder_layers"),
    ({"num_decoder_layers": 1.5}, "num_decoder_layers"),
    ({"num_heads": 3}, "num_heads"),
    ({"hidden_dim": -16}, "hidden_dim"),
    ({"intermediate_dim": None}, "intermediate_dim"),
    ({"max_sequence_length": 0}, "max_sequence_length"),
    ({"dropout": 1.0}, "dropout"),
    ({"tie_embeddings": "yes"}, "tie_embeddings"),
]


# One test for all cases: each test's Keras teardown costs about a second.
def test_bad_config_raises_naming_the_argument():
    for overrides, argument in BAD_CONFIGS:
        with pytest.raises(ValueError, match=f"`{argument}`"):
            models.Seq2SeqBackbone(**{**TINY_CONFIG, **overrides})


def test_sequences_longer_than_max_sequence_length_raise():
    model = tiny_model()
    with pytest.raises(ValueError, match="sequence_length"):
        logits_of(model, np.ones((1, 25), "int32"), np.ones((1, 3), "int32"))
