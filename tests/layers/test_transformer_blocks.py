import keras
import keras_hub
import numpy as np
import pytest
from keras import ops

from kzoo.layers import TransformerDecoderBlock
from kzoo.layers import TransformerEncoderBlock
from tests.layers.weights import copy_keras_hub_block


def random(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def padding(lengths, length):
    return np.arange(length)[None, :] < np.asarray(lengths)[:, None]


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_block_matches_keras_hub(norm_first):
    x, mask = random(2, 6, 16, seed=1), padding([6, 4], 6)
    theirs = keras_hub.layers.TransformerEncoder(32, 4, activation="gelu", normalize_first=norm_first)
    ours = TransformerEncoderBlock(4, 32, activation="gelu", norm_first=norm_first)
    theirs(x, padding_mask=mask)
    ours(x, padding_mask=mask)
    copy_keras_hub_block(theirs, ours)
    want = ops.convert_to_numpy(theirs(x, padding_mask=mask))
    got = ops.convert_to_numpy(ours(x, padding_mask=mask))
    np.testing.assert_allclose(got[mask], want[mask], atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("cross", [True, False])
def test_decoder_block_matches_keras_hub(norm_first, cross):
    x, enc = random(2, 5, 16, seed=2), random(2, 7, 16, seed=3)
    dec_mask, enc_mask = padding([5, 3], 5), padding([7, 4], 7)
    enc_kwargs = dict(encoder_sequence=enc, encoder_padding_mask=enc_mask) if cross else {}
    theirs = keras_hub.layers.TransformerDecoder(32, 4, normalize_first=norm_first)
    ours = TransformerDecoderBlock(4, 32, norm_first=norm_first, cross_attention=cross)
    theirs(x, decoder_padding_mask=dec_mask, **enc_kwargs)
    ours(x, padding_mask=dec_mask, **enc_kwargs)
    copy_keras_hub_block(theirs, ours)
    want = ops.convert_to_numpy(theirs(x, decoder_padding_mask=dec_mask, **enc_kwargs))
    got = ops.convert_to_numpy(ours(x, padding_mask=dec_mask, **enc_kwargs))
    np.testing.assert_allclose(got[dec_mask], want[dec_mask], atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_real_token_outputs_do_not_change_with_more_padding(norm_first):
    # Every amount of extra padding from 1 to 6, through the same blocks (building them again for
    # each amount cost ten times the calls).
    keras.utils.set_random_seed(0)
    embed = keras.layers.Embedding(50, 16, mask_zero=True)
    encoder = TransformerEncoderBlock(4, 32, norm_first=norm_first)
    decoder = TransformerDecoderBlock(4, 32, norm_first=norm_first)
    ids = np.array([[5, 8, 13, 21, 0]])
    src = np.array([[7, 3, 0]])

    def run(tokens, source):
        memory = encoder(embed(source))
        return ops.convert_to_numpy(decoder(embed(tokens), memory))

    want = run(ids, src)[:, :4]
    for extra in range(1, 7):
        more, src_more = np.pad(ids, ((0, 0), (0, extra))), np.pad(src, ((0, 0), (0, extra)))
        np.testing.assert_allclose(run(more, src_more)[:, :4], want, atol=1e-5, err_msg=f"{extra} more")


def test_decoder_block_has_no_information_flow_from_the_future():
    block = TransformerDecoderBlock(2, 16, cross_attention=False)
    x = random(1, 6, 8, seed=4)
    base = ops.convert_to_numpy(block(x))
    for t in range(5):
        changed = x.copy()
        changed[:, t + 1 :] += 1.0
        np.testing.assert_allclose(ops.convert_to_numpy(block(changed))[:, : t + 1], base[:, : t + 1], atol=1e-6)


@pytest.mark.parametrize("cross", [True, False])
def test_decoder_block_prefill_and_cached_steps_equal_full_pass(cross):
    block = TransformerDecoderBlock(4, 32, cross_attention=cross, norm_first=True)
    x, enc = random(2, 8, 16, seed=5), random(2, 6, 16, seed=6)
    enc_mask = padding([6, 2], 6)
    enc_kwargs = dict(encoder_sequence=enc, encoder_padding_mask=enc_mask) if cross else {}
    full = ops.convert_to_numpy(block(x, **enc_kwargs))
    cache = block.empty_cache(2, 10)
    result = block(x[:, :3], self_attention_cache=cache, self_attention_cache_index=0, **enc_kwargs)
    outputs = [ops.convert_to_numpy(result[0])]
    cache, cross_cache = result[1], (result[2] if cross else None)
    for t in range(3, 8):
        kwargs = dict(cross_attention_cache=cross_cache, encoder_padding_mask=enc_mask) if cross else {}
        result = block(x[:, t : t + 1], self_attention_cache=cache, self_attention_cache_index=t, **kwargs)
        outputs.append(ops.convert_to_numpy(result[0]))
        cache = result[1]
    np.testing.assert_allclose(np.concatenate(outputs, 1), full, atol=1e-5)


def test_bad_block_configuration_and_calls():
    with pytest.raises(ValueError, match=r"`num_heads` \(3\) must divide the input width \(16\)"):
        TransformerEncoderBlock(3, 32)(random(1, 4, 16))
    with pytest.raises(ValueError, match=r"dropout.*\[0, 1\)"):
        TransformerDecoderBlock(4, 32, dropout=-0.1)
    with pytest.raises(ValueError, match=r"intermediate_dim.*positive"):
        TransformerEncoderBlock(4, 0)
    with pytest.raises(ValueError, match="encoder_sequence"):
        TransformerDecoderBlock(4, 32)(random(1, 4, 16))
    with pytest.raises(ValueError, match="cross_attention=False"):
        TransformerDecoderBlock(4, 32, cross_attention=False)(random(1, 4, 16), random(1, 4, 16))
    with pytest.raises(ValueError, match="self_attention_cache_index"):
        block = TransformerDecoderBlock(4, 32, cross_attention=False)
        block(random(1, 4, 16))
        block(random(1, 1, 16), self_attention_cache=block.empty_cache(1, 4))


def test_blocks_in_sequential_functional_and_subclassed_models():
    x = random(2, 5, 16)
    sequential = keras.Sequential(
        [keras.Input((5, 16)), TransformerEncoderBlock(4, 32), TransformerDecoderBlock(4, 32, cross_attention=False)]
    )
    assert sequential(x).shape == (2, 5, 16)

    src, tgt = keras.Input((None, 16)), keras.Input((None, 16))
    out = TransformerDecoderBlock(4, 32)(tgt, TransformerEncoderBlock(4, 32)(src))
    functional = keras.Model([src, tgt], out)
    assert functional([x, x[:, :3]]).shape == (2, 3, 16)

    class Seq2Seq(keras.Model):
        def __init__(self):
            super().__init__()
            self.encoder = TransformerEncoderBlock(4, 32)
            self.decoder = TransformerDecoderBlock(4, 32)

        def call(self, inputs):
            return self.decoder(inputs[1], self.encoder(inputs[0]))

    assert Seq2Seq()((x, x[:, :2])).shape == (2, 2, 16)


@pytest.mark.parametrize("policy, tolerance", [("mixed_float16", 2e-2), ("mixed_bfloat16", 1e-1)])
def test_mixed_precision_blocks_are_finite_and_close_to_float32(policy, tolerance):
    x, mask = random(2, 6, 16, seed=7), padding([6, 2], 6)
    reference = TransformerDecoderBlock(4, 32, cross_attention=False)
    want = ops.convert_to_numpy(reference(x, padding_mask=mask))
    keras.config.set_dtype_policy(policy)
    block = TransformerDecoderBlock(4, 32, cross_attention=False)
    block(x, padding_mask=mask)
    block.set_weights(reference.get_weights())
    got = block(x, padding_mask=mask)
    assert got.dtype == policy.split("_")[1]
    got = ops.convert_to_numpy(ops.cast(got, "float32"))
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got[mask], want[mask], atol=tolerance)


def test_every_sublayer_starts_from_its_own_random_weights():
    block = TransformerDecoderBlock(4, 16, kernel_initializer=keras.initializers.GlorotUniform())
    block(random(1, 3, 16), random(1, 3, 16))
    kernels = [
        ops.convert_to_numpy(layer.kernel).ravel()[:32]
        for attention in (block.self_attention, block.cross_attention_layer)
        for layer in (attention.query_dense, attention.key_dense, attention.value_dense, attention.output_dense)
    ] + [
        ops.convert_to_numpy(d.kernel).ravel()[:32]
        for d in (block.feed_forward.intermediate_dense, block.feed_forward.output_dense)
    ]
    for i in range(len(kernels)):
        for j in range(i):
            assert not np.allclose(kernels[i], kernels[j]), (i, j)
