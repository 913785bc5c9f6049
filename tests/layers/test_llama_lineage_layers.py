"""RMSNorm, the gated feed-forward, RoPE's variants and the attention options of the Llama
lineage, against transformers' own modules on the same weights and against hand computation."""

import keras
import numpy as np
import pytest
import torch
import transformers
from transformers.models.gemma3 import modeling_gemma3
from transformers.models.llama import modeling_llama

from kzoo import layers


def _random(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


@pytest.mark.parametrize("unit_offset", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rms_norm_is_transformers_in_each_form_and_precision(unit_offset, dtype):
    x, w = _random(2, 5, 16) * 3, _random(16, seed=1)
    reference = (modeling_gemma3.Gemma3RMSNorm if unit_offset else modeling_llama.LlamaRMSNorm)(16, eps=1e-5)
    with torch.no_grad():
        reference.weight.copy_(torch.tensor(w))
    reference = reference.to(getattr(torch, dtype))
    theirs = reference(torch.tensor(x).to(getattr(torch, dtype))).float().detach().numpy()
    ours = layers.RMSNormalization(epsilon=1e-5, unit_offset=unit_offset, dtype=dtype)
    ours.build(x.shape)
    ours.scale.assign(reference.weight.float().detach().numpy())  # w as the reference stores it
    result = keras.ops.convert_to_numpy(keras.ops.cast(ours(keras.ops.cast(x, dtype)), "float32"))
    np.testing.assert_array_equal(result, theirs) if dtype == "bfloat16" else np.testing.assert_allclose(
        result, theirs, rtol=1e-6, atol=1e-6
    )


def test_a_fresh_unit_offset_norm_scales_by_one():
    x = _random(3, 8)
    plain = layers.RMSNormalization()(x)
    np.testing.assert_allclose(layers.RMSNormalization(unit_offset=True)(x), plain, rtol=1e-6)
    np.testing.assert_allclose(plain, x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6), rtol=1e-5)


@pytest.mark.parametrize("activation, hidden_act", [("silu", "silu"), ("gelu_approximate", "gelu_pytorch_tanh")])
def test_gated_feed_forward_is_transformers_mlp(activation, hidden_act):
    config = transformers.LlamaConfig(
        hidden_size=16, intermediate_size=24, num_attention_heads=4, hidden_act=hidden_act
    )
    reference = modeling_llama.LlamaMLP(config)
    x = _random(2, 3, 16)
    ours = layers.GatedFeedForward(24, activation=activation)
    ours.build(x.shape)
    for dense, linear in (
        (ours.gate_dense, reference.gate_proj),
        (ours.intermediate_dense, reference.up_proj),
        (ours.output_dense, reference.down_proj),
    ):
        dense.kernel.assign(linear.weight.detach().numpy().T)
    with torch.no_grad():
        theirs = reference(torch.tensor(x)).numpy()
    np.testing.assert_allclose(ours(x), theirs, rtol=1e-5, atol=1e-6)


ROPE_CASES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
}


@pytest.mark.parametrize("kind", list(ROPE_CASES))
def test_rope_variants_rotate_as_transformers(kind):
    settings = dict(ROPE_CASES[kind])
    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=2, rope_parameters=settings)
    rotary = modeling_llama.LlamaRotaryEmbedding(config)
    q = _random(1, 2, 40, 32)  # (B, heads, T, head_dim) as transformers holds it
    positions = torch.arange(3, 43)[None]  # from position 3
    cos, sin = rotary(torch.tensor(q), positions)
    theirs, _ = modeling_llama.apply_rotary_pos_emb(torch.tensor(q), torch.tensor(q), cos, sin)
    theta = settings.pop("rope_theta")
    scaling = settings if kind != "default" else None
    ours = layers.RotaryEmbedding(max_wavelength=theta, rope_scaling=scaling, sequence_axis=2)(q, start_index=3)
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-5, atol=1e-5)


def test_partial_rotary_rotates_the_first_features_and_passes_the_rest():
    x = _random(1, 6, 2, 8)
    ours = keras.ops.convert_to_numpy(layers.RotaryEmbedding(rotary_dim=4)(x, start_index=1))
    np.testing.assert_array_equal(ours[..., 4:], x[..., 4:])
    np.testing.assert_allclose(ours[..., :4], layers.RotaryEmbedding()(x[..., :4], start_index=1), rtol=1e-6)
    # Position p rotates pair j by p * 10000^(-2j/4): at p = 1, pair 0 (features 0 and 2) by 1 radian.
    c, s = np.cos(1.0), np.sin(1.0)
    np.testing.assert_allclose(ours[0, 0, :, 0], x[0, 0, :, 0] * c - x[0, 0, :, 2] * s, rtol=1e-5)


def test_an_unknown_rope_type_is_named():
    with pytest.raises(ValueError, match=r"rope_type 'yarn', which kzoo does not compute; supported: \['default'"):
        layers.RotaryEmbedding(rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ValueError, match=r"lacks \['low_freq_factor'"):
        layers.RotaryEmbedding(rope_scaling={"rope_type": "llama3", "factor": 4.0})


def test_a_sliding_window_sees_the_latest_keys_only():
    mask = keras.ops.convert_to_numpy(layers.causal_mask(3, 6, offset=3, window=2)).astype(int)
    assert mask.tolist() == [[0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1]]


def test_soft_capping_is_c_tanh_of_the_scaled_scores():
    q, k, v = _random(3, 4), _random(5, 4, seed=1), _random(5, 2, seed=2)
    scores = 20.0 * np.tanh(q @ k.T * 0.5 / 20.0)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    expected = weights / weights.sum(-1, keepdims=True) @ v
    ours = layers.scaled_dot_product_attention(q, k, v, scale=0.5, soft_cap=20.0)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("window", [None, 3])
def test_attention_with_rope_qk_norm_and_a_window_decodes_as_the_full_pass(window):
    attention = layers.MultiHeadAttention(
        4,
        8,
        num_key_value_heads=2,
        use_bias=False,
        rotary_embedding=layers.RotaryEmbedding(),
        query_key_norm=layers.RMSNormalization(),
        sliding_window=window,
    )
    x = _random(2, 7, 16)
    full = keras.ops.convert_to_numpy(attention(x, use_causal_mask=True))
    cache, steps = attention.empty_cache(2, 10), []
    for t in range(7):
        out, cache = attention(x[:, t : t + 1], use_causal_mask=True, cache=cache, cache_index=t)
        steps.append(keras.ops.convert_to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=1e-5, atol=1e-5)
    if window:  # the last query sees keys 4..6 only: changing keys 0..3 changes nothing there
        changed = x.copy()
        changed[:, :4] = _random(2, 4, 16, seed=9)
        again = keras.ops.convert_to_numpy(attention(changed, use_causal_mask=True))
        np.testing.assert_allclose(again[:, 6], full[:, 6], rtol=1e-5, atol=1e-6)
        assert not np.allclose(again[:, 5], full[:, 5], atol=1e-4)  # 5 sees 3..5
