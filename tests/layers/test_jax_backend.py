"""The layers are `keras.ops` code: a model saved under TensorFlow runs under JAX."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from keras import ops

from tests.layers.test_serialization import build_model

pytest.importorskip("jax")


def test_model_saved_under_tensorflow_gives_the_same_outputs_and_trains_under_jax(tmp_path):
    model = build_model()
    inputs = [np.array([[3, 4, 5, 0, 0], [7, 8, 9, 10, 11]]), np.array([[1, 2, 3, 4], [5, 6, 0, 0]])]
    want = ops.convert_to_numpy(model(inputs))
    path, out_path = tmp_path / "model.keras", tmp_path / "out.npz"
    model.save(path)
    script = textwrap.dedent(
        f"""
        import jax, keras, numpy as np
        import kzoo
        assert keras.backend.backend() == "jax"
        model = keras.saving.load_model({str(path)!r})
        inputs = [np.array([[3, 4, 5, 0, 0], [7, 8, 9, 10, 11]]), np.array([[1, 2, 3, 4], [5, 6, 0, 0]])]
        outputs = np.asarray(jax.jit(lambda a, b: model([a, b]))(*inputs))

        # The KV cache under jit, with a traced cache index.
        mha = kzoo.layers.MultiHeadAttention(4, 4, num_key_value_heads=2)
        x = np.random.default_rng(0).normal(size=(2, 6, 16)).astype("float32")
        full = np.asarray(mha(x, use_causal_mask=True))
        step = jax.jit(lambda t, c, i: mha(t, use_causal_mask=True, cache=c, cache_index=i))
        cache, steps = mha.empty_cache(2, 8), []
        for t in range(6):
            out, cache = step(x[:, t : t + 1], cache, t)
            steps.append(np.asarray(out))

        # Out-of-range ids raise eagerly and inside compiled code on CPU; compiled for an
        # accelerator (no host callback there) the bad row is NaN.
        embed = kzoo.layers.TokenAndPositionEmbedding(10, 8, 4)
        errors = []
        for call in (embed, jax.jit(embed)):
            try:
                jax.block_until_ready(call(np.array([[1, 12]])))
                errors.append("")
            except Exception as e:
                errors.append(str(e))
        jax.default_backend = lambda: "gpu"
        on_gpu = np.asarray(jax.jit(lambda ids: embed(ids))(np.array([[1, 12]])))  # a new trace

        # Training (kzoo's fused path, plain keras.ops under JAX), with dropout.
        gpt = kzoo.models.GPTCausalLM(kzoo.models.GPTBackbone(
            vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32,
            max_sequence_length=8, dropout=0.1))
        gpt.compile(learning_rate=1e-2)
        ids = np.random.default_rng(0).integers(1, 30, (4, 9))
        x = {{"token_ids": ids[:, :-1], "padding_mask": np.ones((4, 8), "int32")}}
        losses = gpt.fit(x, ids[:, 1:], epochs=20, verbose=0).history["loss"]
        np.savez({str(out_path)!r}, outputs=outputs, full=full, steps=np.concatenate(steps, 1), errors=errors,
                 losses=losses, on_gpu=on_gpu)
        """
    )
    env = dict(os.environ, KERAS_BACKEND="jax")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300, env=env)
    result = np.load(out_path)
    np.testing.assert_allclose(result["outputs"], want, atol=1e-5)
    np.testing.assert_allclose(result["steps"], result["full"], atol=1e-5)
    assert all("`token_ids` must be in [0, 10)" in str(error) for error in result["errors"])
    assert np.isfinite(result["on_gpu"][0, 0]).all() and np.isnan(result["on_gpu"][0, 1]).all()
    losses = result["losses"]
    assert np.isfinite(losses).all() and losses[-1] < 0.7 * losses[0]
