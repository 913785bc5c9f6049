import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from keras import ops

import kzoo
from kzoo import layers

LAYERS = [
    layers.MultiHeadAttention(4, 8, num_key_value_heads=2, dropout=0.1, output_dim=12, seed=3),
    layers.SinusoidalPositionEncoding(max_wavelength=100),
    layers.PositionEmbedding(16, initializer="zeros"),
    layers.RotaryEmbedding(max_wavelength=500, scaling_factor=2.0),
    layers.TokenAndPositionEmbedding(40, 16, 8, position="sinusoidal", merge="concat", mask_zero=True),
    layers.FeedForward(32, activation="gelu_approximate", dropout=0.2, output_dim=8),
    layers.TransformerEncoderBlock(4, 32, dropout=0.1, activation="gelu", norm_first=True, num_key_value_heads=2),
    layers.TransformerDecoderBlock(4, 32, cross_attention=False, layer_norm_epsilon=1e-6),
    layers.LayerNormalization(epsilon=1e-6),
    layers.AddAndNorm(0.1, epsilon=1e-6, seed=2),
    layers.RMSNormalization(epsilon=1e-5, unit_offset=True),
    layers.GatedFeedForward(32, activation="gelu_approximate", use_bias=True, dropout=0.1),
    # The Llama lineage's settings: rotary positions with scaling, QK-norm, a window, four norms.
    layers.MultiHeadAttention(
        4,
        8,
        num_key_value_heads=1,
        use_bias=True,
        use_output_bias=False,
        rotary_embedding=layers.RotaryEmbedding(
            500000.0,
            rotary_dim=4,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
        query_key_norm=layers.RMSNormalization(epsilon=1e-6),
        scale=0.25,
        soft_cap=50.0,
        sliding_window=3,
    ),
    layers.TransformerDecoderBlock(
        cross_attention=False,
        norm_first=True,
        sandwich_norm=True,
        self_attention=layers.MultiHeadAttention(4, 8, use_bias=False, rotary_embedding=layers.RotaryEmbedding()),
        feed_forward=layers.GatedFeedForward(32),
        normalization=layers.RMSNormalization(unit_offset=True),
    ),
]


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: type(layer).__name__)
def test_config_round_trip(layer):
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    serialized = keras.saving.serialize_keras_object(layer)
    assert serialized["module"].startswith("kzoo.layers")
    assert type(keras.saving.deserialize_keras_object(serialized)) is type(layer)


def build_model():
    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    source_ids = keras.Input((None,), dtype="int32", name="source_ids")
    x = layers.TokenAndPositionEmbedding(50, 16, 32, mask_zero=True)(token_ids)
    source = layers.TokenAndPositionEmbedding(50, 16, 16, position="sinusoidal", merge="concat", scale_embeddings=True)(
        source_ids
    )
    source = source + layers.SinusoidalPositionEncoding()(source)
    source = layers.TransformerEncoderBlock(4, 64, activation="gelu")(source)
    x = layers.TransformerDecoderBlock(4, 64, norm_first=True)(x, source)
    x = layers.MultiHeadAttention(4, 8, num_key_value_heads=2)(x, use_causal_mask=True)
    heads = keras.layers.Reshape((-1, 4, 8))(x)
    x = keras.layers.Reshape((-1, 32))(layers.RotaryEmbedding()(heads)) + layers.PositionEmbedding(16)(x)
    x = layers.FeedForward(64, activation="gelu_approximate")(x)
    x = layers.TransformerDecoderBlock(
        cross_attention=False,
        norm_first=True,
        sandwich_norm=True,
        self_attention=layers.MultiHeadAttention(
            4,
            8,
            num_key_value_heads=2,
            rotary_embedding=layers.RotaryEmbedding(),
            query_key_norm=layers.RMSNormalization(),
            sliding_window=2,
        ),
        feed_forward=layers.GatedFeedForward(48),
        normalization=layers.RMSNormalization(unit_offset=True),
    )(x)
    return keras.Model([token_ids, source_ids], keras.layers.Dense(50)(x))


def test_model_with_every_layer_reloads_in_a_fresh_process(tmp_path):
    model = build_model()
    inputs = [np.array([[3, 4, 5, 0, 0], [7, 8, 9, 10, 11]]), np.array([[1, 2, 3, 4], [5, 6, 0, 0]])]
    want = ops.convert_to_numpy(model(inputs))
    path, inputs_path, out_path = tmp_path / "model.keras", tmp_path / "inputs.npz", tmp_path / "out.npy"
    model.save(path)
    np.savez(inputs_path, *inputs)
    script = textwrap.dedent(
        f"""
        import os
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        import numpy as np, keras
        import kzoo
        model = keras.saving.load_model({str(path)!r}, safe_mode=True)
        inputs = np.load({str(inputs_path)!r})
        np.save({str(out_path)!r}, keras.ops.convert_to_numpy(model([inputs["arr_0"], inputs["arr_1"]])))
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    np.testing.assert_array_equal(np.load(out_path), want)


def test_a_block_builds_its_own_copies_of_the_layers_it_is_given():
    attention = layers.MultiHeadAttention(4, 8, use_bias=False)
    blocks = [
        layers.TransformerDecoderBlock(
            cross_attention=False, norm_first=True, self_attention=attention, feed_forward=layers.GatedFeedForward(16)
        )
        for _ in range(2)
    ]
    x = keras.random.normal((1, 3, 32))
    for block in blocks:
        block(x)
    assert not attention.built
    first, second = (block.self_attention.query_dense.kernel for block in blocks)
    assert first is not second and not np.allclose(first.numpy(), second.numpy())


def test_every_public_layer_is_covered():
    public = {name for name in dir(kzoo.layers) if name[0].isupper()}
    assert public == {type(layer).__name__ for layer in LAYERS}
    names = {type(layer).__name__ for layer in LAYERS}
    assert names <= {type(layer).__name__ for layer in build_model()._flatten_layers()} | {"AddAndNorm"}
