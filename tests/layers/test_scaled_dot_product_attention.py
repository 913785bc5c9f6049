import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from keras import ops

from kzoo.layers import scaled_dot_product_attention
from kzoo.ops.attention import MASKED_SCORE


def reference_attention(q, k, v, mask=None, scale=None):
    """Eq. (1) of the paper, in float64 NumPy."""
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    scores = scores - scores.max(-1, keepdims=True)
    weights = np.exp(scores)
    weights = weights / weights.sum(-1, keepdims=True)
    return weights @ v, weights


def test_unbatched_textbook_form_matches_formula():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(4, 8)), rng.normal(size=(6, 8)), rng.normal(size=(6, 5))
    out, weights = scaled_dot_product_attention(
        q.astype("float32"), k.astype("float32"), v.astype("float32"), return_scores=True
    )
    want_out, want_weights = reference_attention(q, k, v)
    np.testing.assert_allclose(ops.convert_to_numpy(out), want_out, atol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(weights), want_weights, atol=1e-6)
    assert out.shape == (4, 5)


def test_batched_with_mask_and_custom_scale():
    rng = np.random.default_rng(1)
    q = rng.normal(size=(2, 3, 4, 8))
    k = rng.normal(size=(2, 3, 6, 8))
    v = rng.normal(size=(2, 3, 6, 8))
    mask = rng.random(size=(2, 1, 4, 6)) > 0.3
    mask[..., 0] = True
    out = scaled_dot_product_attention(
        q.astype("float32"), k.astype("float32"), v.astype("float32"), mask=mask, scale=0.5
    )
    want, _ = reference_attention(q, k, v, mask, scale=0.5)
    np.testing.assert_allclose(ops.convert_to_numpy(out), want, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_fully_masked_row_gives_zeros(dtype):
    rng = np.random.default_rng(2)
    q, k, v = (ops.cast(rng.normal(size=(3, 4)), dtype) for _ in range(3))
    mask = np.ones((3, 3), bool)
    mask[1] = False
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask, return_scores=True)
    out = ops.convert_to_numpy(ops.cast(out, "float32"))
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[1], 0.0)
    np.testing.assert_array_equal(ops.convert_to_numpy(ops.cast(weights, "float32"))[1], 0.0)
    assert np.abs(out[0]).sum() > 0


@settings(max_examples=25, deadline=None)
@given(mask=hnp.arrays(bool, (5, 7)))
def test_masked_positions_get_exactly_zero_weight(mask):
    rng = np.random.default_rng(3)
    q = rng.normal(size=(5, 8)).astype("float32") * 10
    k = rng.normal(size=(7, 8)).astype("float32") * 10
    v = rng.normal(size=(7, 3)).astype("float32")
    _, weights = scaled_dot_product_attention(q, k, v, mask=mask, return_scores=True)
    weights = ops.convert_to_numpy(weights)
    assert np.all(weights[~mask] == 0.0)
    rows_with_keys = mask.any(-1)
    np.testing.assert_allclose(weights.sum(-1)[rows_with_keys], 1.0, atol=1e-5)


def test_a_bias_adds_to_the_scaled_scores_and_a_mask_as_bias_weighs_as_the_mask():
    rng = np.random.default_rng(5)
    q, k, v = (rng.normal(size=(2, 5, 8)).astype("float32") * 4 for _ in range(3))
    bias = rng.normal(size=(5, 5)).astype("float32")  # any additive bias, as ALiBi adds one
    out = scaled_dot_product_attention(q, k, v, bias=bias, scale=0.3)
    scores = q @ np.swapaxes(k, -1, -2) * 0.3 + bias
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(ops.convert_to_numpy(out), weights / weights.sum(-1, keepdims=True) @ v, atol=1e-5)
    # A causal mask as 0 / MASKED_SCORE: the very weights of the boolean mask, masked keys at 0.
    causal = np.tril(np.ones((5, 5), bool))
    as_bias = np.where(causal, 0.0, MASKED_SCORE).astype("float32")
    _, by_mask = scaled_dot_product_attention(q, k, v, mask=causal, return_scores=True)
    _, by_bias = scaled_dot_product_attention(q, k, v, bias=as_bias, return_scores=True)
    np.testing.assert_array_equal(ops.convert_to_numpy(by_bias), ops.convert_to_numpy(by_mask))
    assert np.all(ops.convert_to_numpy(by_bias)[:, ~causal] == 0.0)


def test_dropout_only_in_training_and_rate_validated():
    x = np.random.default_rng(4).normal(size=(4, 8)).astype("float32")
    clean = scaled_dot_product_attention(x, x, x, dropout_rate=0.5, training=False)
    np.testing.assert_allclose(clean, scaled_dot_product_attention(x, x, x))
    dropped = scaled_dot_product_attention(x, x, x, dropout_rate=0.5, training=True, seed=1)
    assert not np.allclose(ops.convert_to_numpy(dropped), ops.convert_to_numpy(clean))
    with pytest.raises(ValueError, match=r"dropout_rate.*\[0, 1\)"):
        scaled_dot_product_attention(x, x, x, dropout_rate=1.0)


@pytest.mark.parametrize("dtype, atol", [("float32", 1e-5), ("bfloat16", 3e-2)])
def test_single_query_path_matches_formula(dtype, atol):
    """One query row (a decoding step) takes the K q^T path."""
    rng = np.random.default_rng(3)
    q, k, v = rng.normal(size=(2, 3, 1, 8)), rng.normal(size=(2, 3, 6, 8)), rng.normal(size=(2, 3, 6, 5))
    mask = np.ones((2, 1, 1, 6), bool)
    mask[0, ..., 4:] = False
    mask[1] = False  # a row with no key
    out, weights = scaled_dot_product_attention(*(ops.cast(t, dtype) for t in (q, k, v)), mask=mask, return_scores=True)
    assert out.shape == (2, 3, 1, 5) and weights.shape == (2, 3, 1, 6)
    assert ops.convert_to_numpy(ops.cast(out, "float32")).dtype == np.float32
    want, want_weights = reference_attention(q[:1], k[:1], v[:1], mask[:1])
    np.testing.assert_allclose(ops.convert_to_numpy(ops.cast(out, "float32"))[:1], want, atol=atol)
    np.testing.assert_allclose(ops.convert_to_numpy(ops.cast(weights, "float32"))[:1], want_weights, atol=atol)
    np.testing.assert_array_equal(ops.convert_to_numpy(ops.cast(out, "float32"))[1], 0.0)
