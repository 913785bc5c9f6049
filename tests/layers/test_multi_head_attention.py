import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from kzoo.layers import MultiHeadAttention
from kzoo.layers import cache_spans
from kzoo.layers.kv_cache import one_row_as_is
from tests.layers.weights import copy_attention


def numpy_mha(layer, query, value, mask=None):
    """Multi-head attention from the paper's formulas with grouped K/V heads."""
    w = {v.path.split("/")[-2] + "/" + v.name: ops.convert_to_numpy(v) for v in layer.weights}
    q = np.einsum("btd,dhk->bthk", query, w["query/kernel"]) + w["query/bias"]
    k = np.einsum("btd,dhk->bthk", value, w["key/kernel"]) + w["key/bias"]
    v = np.einsum("btd,dhk->bthk", value, w["value/kernel"]) + w["value/bias"]
    group = layer.num_heads // layer.num_key_value_heads
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)  # head i uses K/V head i // group
    scores = np.einsum("bqhk,bthk->bhqt", q, k) / np.sqrt(layer.key_dim)
    if mask is not None:
        scores = np.where(mask[:, None], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    heads = np.einsum("bhqt,bthv->bqhv", weights, v)
    return np.einsum("bqhv,hvd->bqd", heads, w["attention_output/kernel"]) + w["attention_output/bias"]


def random(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


@pytest.mark.parametrize("num_key_value_heads", [4, 2, 1])
def test_grouped_heads_match_numpy_reference(num_key_value_heads):
    query, value = random(2, 5, 16, seed=1), random(2, 7, 12, seed=2)
    layer = MultiHeadAttention(num_heads=4, key_dim=6, num_key_value_heads=num_key_value_heads)
    out = layer(query, value)
    np.testing.assert_allclose(ops.convert_to_numpy(out), numpy_mha(layer, query, value), atol=1e-5)
    assert len(layer.key_dense.kernel.shape) == 3 and layer.key_dense.kernel.shape[1] == num_key_value_heads


@pytest.mark.parametrize("case", ["self", "cross", "causal", "padding"])
def test_matches_keras_multi_head_attention(case):
    query = random(2, 6, 16, seed=3)
    value = random(2, 9, 16, seed=4) if case == "cross" else query
    theirs = keras.layers.MultiHeadAttention(num_heads=4, key_dim=8)
    ours = MultiHeadAttention(num_heads=4, key_dim=8)
    kwargs = {}
    if case == "causal":
        kwargs["use_causal_mask"] = True
    if case == "padding":
        lengths = np.array([6, 3])
        kwargs["attention_mask"] = np.arange(6)[None, None, :] < lengths[:, None, None]
    theirs(query, value, **kwargs)
    ours(query, value, **kwargs)
    copy_attention(theirs, ours)
    want, want_scores = theirs(query, value, return_attention_scores=True, **kwargs)
    got, got_scores = ours(query, value, return_attention_scores=True, **kwargs)
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(got_scores, want_scores, atol=1e-6)


def test_causal_mask_blocks_information_from_the_future():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    x = random(1, 8, 8, seed=5)
    base = ops.convert_to_numpy(layer(x, use_causal_mask=True))
    for t in range(7):
        changed = x.copy()
        changed[:, t + 1 :] = random(1, 7 - t, 8, seed=10 + t)
        out = ops.convert_to_numpy(layer(changed, use_causal_mask=True))
        np.testing.assert_allclose(out[:, : t + 1], base[:, : t + 1], atol=1e-6)
        assert not np.allclose(out[:, t + 1 :], base[:, t + 1 :])


def test_keras_implicit_padding_mask_makes_padding_invisible():
    embed = keras.layers.Embedding(20, 8, mask_zero=True)
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    short = np.array([[3, 5, 7, 0]])
    long = np.array([[3, 5, 7, 0, 0, 0, 0]])
    a = ops.convert_to_numpy(layer(embed(short)))
    b = ops.convert_to_numpy(layer(embed(long)))
    np.testing.assert_allclose(a[:, :3], b[:, :3], atol=1e-6)
    # Without the mask the padding would be attended to.
    c = ops.convert_to_numpy(layer(ops.convert_to_tensor(embed(long).numpy())))
    assert not np.allclose(c[:, :3], a[:, :3], atol=1e-4)


def test_explicit_value_mask_and_attention_scores_are_zero_where_masked():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    q, v = random(2, 3, 8, seed=6), random(2, 5, 8, seed=7)
    value_mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    _, scores = layer(q, v, value_mask=value_mask, return_attention_scores=True)
    scores = ops.convert_to_numpy(scores)
    assert scores.shape == (2, 2, 3, 5)
    assert np.all(scores[0, :, :, 3:] == 0.0)
    np.testing.assert_allclose(scores.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("num_key_value_heads", [4, 1])
def test_kv_cache_prefill_then_single_steps_equal_full_pass(num_key_value_heads):
    layer = MultiHeadAttention(num_heads=4, key_dim=4, num_key_value_heads=num_key_value_heads)
    x = random(2, 9, 16, seed=8)
    full = ops.convert_to_numpy(layer(x, use_causal_mask=True))
    cache = layer.empty_cache(batch_size=2, max_length=12)
    out, cache = layer(x[:, :4], use_causal_mask=True, cache=cache, cache_index=0)
    outputs = [ops.convert_to_numpy(out)]
    for t in range(4, 9):
        out, cache = layer(x[:, t : t + 1], use_causal_mask=True, cache=cache, cache_index=t)
        outputs.append(ops.convert_to_numpy(out))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, atol=1e-5)


def test_kv_cache_works_inside_a_compiled_loop_with_a_tensor_index():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    x = random(1, 6, 8, seed=9)
    full = ops.convert_to_numpy(layer(x, use_causal_mask=True))

    @tf.function(jit_compile=True)
    def step(token, cache, index):
        return layer(token, use_causal_mask=True, cache=cache, cache_index=index)

    cache = layer.empty_cache(1, 6)
    for t in range(6):
        out, cache = step(x[:, t : t + 1], cache, tf.constant(t))
        np.testing.assert_allclose(ops.convert_to_numpy(out)[:, 0], full[:, t], atol=1e-5)


def check_under_xla(xla_step, args, out, cache):
    """`xla_step(*args)` gives the output and the cache that the traced step gave (NaN slots
    where it left them)."""
    xla_out, xla_cache = xla_step(*args)
    np.testing.assert_allclose(ops.convert_to_numpy(xla_out), ops.convert_to_numpy(out), atol=1e-5, equal_nan=False)
    for got, want in zip(xla_cache, cache):
        np.testing.assert_allclose(ops.convert_to_numpy(got), ops.convert_to_numpy(want), atol=1e-5)


# The cache span tests run every step traced as a graph, and under XLA the steps at the spans'
# edges, from the traced step's cache: XLA compiles a step again for each index it is given (a
# third of a second each), so every step under XLA was most of this module's time.
def test_cache_spans_read_only_the_span_that_holds_the_positions():
    # Slots 16-31 hold NaN: attention over the whole cache would return NaN (0 x NaN), so a
    # finite output equal to the full pass shows that no step up to position 15 read them.
    layer = MultiHeadAttention(num_heads=4, key_dim=4, num_key_value_heads=2, sliding_window=5)
    x = random(1, 16, 8, seed=13)
    full = ops.convert_to_numpy(layer(x, use_causal_mask=True))

    def step(tokens, cache, index):
        with cache_spans((4, 8, 16)):
            return layer(tokens, use_causal_mask=True, cache=cache, cache_index=index)

    traced, xla = tf.function(step), tf.function(step, jit_compile=True)
    unreached = np.zeros((1, 2, 32, 4), "float32")
    unreached[:, :, 16:] = np.nan
    cache = (unreached, unreached.copy())
    outputs = []
    for t in [0, *range(3, 16)]:  # a prefill chunk of three, then one position a step
        args = (x[:, :3] if t == 0 else x[:, t : t + 1], cache, tf.constant(t))
        out, cache = traced(*args)
        outputs.append(ops.convert_to_numpy(out))
        if t in (0, 3, 4, 7, 8, 15):  # the prefill, then each span's last position and the next one's first
            check_under_xla(xla, args, out, cache)
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, atol=1e-5)
    with pytest.raises(AssertionError):  # the same NaN slots read by the whole-cache attention
        out, _ = layer(x[:, :1], use_causal_mask=True, cache=(unreached, unreached), cache_index=0)
        np.testing.assert_allclose(ops.convert_to_numpy(out), full[:, :1], atol=1e-5)


def test_cache_spans_read_only_a_sliding_window_past_the_spans():
    # Before each step past the span (8), the slots behind the window hold NaN: a finite output
    # equal to the full pass shows that the step read only its window (W + T - 1 = 4 slots).
    layer = MultiHeadAttention(num_heads=4, key_dim=4, num_key_value_heads=2, sliding_window=4)
    x = random(1, 24, 8, seed=14)
    full = ops.convert_to_numpy(layer(x, use_causal_mask=True))

    def step(tokens, keys, values, index):
        with cache_spans((8,), max_queries=1):  # the step traced for any token count, run with one
            return layer(tokens, use_causal_mask=True, cache=(keys, values), cache_index=index)

    signature = [tf.TensorSpec([1, None, 8])] + [tf.TensorSpec([1, 2, 32, 4])] * 2 + [tf.TensorSpec([], tf.int32)]
    traced = tf.function(step, input_signature=signature)
    xla = tf.function(step, input_signature=signature, jit_compile=True)
    keys, values = np.zeros((1, 2, 32, 4), "float32"), np.zeros((1, 2, 32, 4), "float32")
    outputs = []
    for t in range(24):
        if t >= 8:
            keys[:, :, : t - 3], values[:, :, : t - 3] = np.nan, np.nan
        args = (x[:, t : t + 1], keys, values, tf.constant(t))
        out, cache = traced(*args)
        outputs.append(ops.convert_to_numpy(out))
        if t in (0, 7, 8, 9, 23):  # in the span, its last position, the window's first two and last
            check_under_xla(xla, args, out, cache)
        keys, values = (ops.convert_to_numpy(c).copy() for c in cache)
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, atol=1e-5)


def test_cache_spans_refuse_a_non_positive_length():
    with pytest.raises(ValueError, match="lengths"):
        with cache_spans((16, 0)):
            pass
    with pytest.raises(ValueError, match="max_queries"):
        with cache_spans((16,), max_queries=0):
            pass


def test_precomputed_cross_attention_cache_equals_direct_call():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    q, enc = random(2, 3, 8, seed=11), random(2, 5, 8, seed=12)
    mask = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], bool)[:, None, :]
    direct = layer(q, enc, attention_mask=mask)
    cached, _ = layer(q, attention_mask=mask, cache=layer.compute_cache(enc))
    np.testing.assert_allclose(cached, direct, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_heads=0, key_dim=4), r"num_heads.*positive"),
        (dict(num_heads=4, key_dim=-1), r"key_dim.*positive"),
        (dict(num_heads=4, key_dim=4, num_key_value_heads=3), r"num_heads.*divisible.*num_key_value_heads"),
        (dict(num_heads=4, key_dim=4, dropout=1.5), r"dropout.*\[0, 1\)"),
    ],
)
def test_bad_configuration_names_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(**kwargs)


def test_bad_cache_shape_and_index_raise():
    layer = MultiHeadAttention(num_heads=4, key_dim=4, num_key_value_heads=2)
    x = random(2, 1, 16)
    with pytest.raises(ValueError, match=r"`cache` must be a pair \(keys, values\)"):
        layer(x, cache=(ops.zeros((2, 4, 8, 4)),) * 2, cache_index=0)  # 4 heads, expected 2
    with pytest.raises(ValueError, match=r"`cache` must be a pair \(keys, values\)"):
        layer(x, cache=(ops.zeros((3, 2, 8, 4)),) * 2, cache_index=0)  # batch 3 for a batch of 2
    with pytest.raises(ValueError, match=r"`cache` must be a pair \(keys, values\)"):
        layer(x, cache=ops.zeros((2, 2, 2, 8, 4)), cache_index=0)  # a stacked tensor
    with pytest.raises(ValueError, match=r"cache_index.*\[0, 7\]"):
        layer(x, cache=layer.empty_cache(2, 8), cache_index=8)


@pytest.mark.parametrize("use_bias", [False, True])
def test_one_token_decode_under_xla_keeps_its_matmuls_out_of_naive_loops(use_bias):
    # XLA's CPU compiler fuses a one-row product whose kernel it reshapes into a `kLoop`
    # fusion (a naive loop, several times slower than its matrix-vector kernel): the
    # (h, d_v, d) output kernel did, in every decode step, until its call got a zero row.
    layer = MultiHeadAttention(num_heads=4, key_dim=8, num_key_value_heads=2, use_bias=use_bias)
    x, cache = random(1, 1, 32), layer.empty_cache(1, 16)
    layer(x, use_causal_mask=True, cache=cache, cache_index=3)

    def loop(x, cache):  # as generate runs it: the step in a compiled loop
        def body(i, x, cache):
            y, cache = layer(x, use_causal_mask=True, cache=cache, cache_index=i)
            return i + 1, y, cache

        return tf.while_loop(lambda i, *_: i < 16, body, (0, x, cache))[1]

    def naive_dots():
        compiled = tf.function(loop, jit_compile=True).experimental_get_compiler_ir(x, cache)
        hlo = compiled(stage="optimized_hlo")
        with_dot = {m[1] for m in re.finditer(r"^(%\S+) .*?^}", hlo, re.M | re.S) if " dot(" in m[0]}
        return [name for name in re.findall(r"kind=kLoop, calls=(%[^,\s]+)", hlo) if name in with_dot]

    assert naive_dots() == []
    if not use_bias:  # the test can fail: without the row, the output projection is one
        with one_row_as_is():
            assert len(naive_dots()) == 1


def test_cache_with_different_key_and_value_sizes():
    layer = MultiHeadAttention(num_heads=2, key_dim=4, value_dim=6)
    x = random(1, 5, 8, seed=13)
    full = ops.convert_to_numpy(layer(x, use_causal_mask=True))
    cache = layer.empty_cache(1, 5)
    assert [tuple(c.shape) for c in cache] == [(1, 2, 5, 4), (1, 2, 5, 6)]
    steps = []
    for t in range(5):
        out, cache = layer(x[:, t : t + 1], use_causal_mask=True, cache=cache, cache_index=t)
        steps.append(ops.convert_to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


def test_functional_api_output_specs():
    query = keras.Input((None, 16))
    cache = (keras.Input((2, 10, 8)), keras.Input((2, 10, 8)))
    layer = MultiHeadAttention(num_heads=2, key_dim=8)
    out, scores = layer(query, return_attention_scores=True)
    assert out.shape == (None, None, 16) and scores.shape == (None, 2, None, None)
    out, new_cache = layer(query, cache=cache, cache_index=0)
    assert [tuple(c.shape) for c in new_cache] == [(None, 2, 10, 8)] * 2
