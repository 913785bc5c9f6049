"""Tensor parallelism: a decoder sharded with `DecoderBackbone.get_layout_map` over two host devices
(JAX, `keras.distribution.ModelParallel`) computes what the unsharded one does, and trains alike."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("jax")

SCRIPT = """
import os, sys
os.environ["KERAS_BACKEND"] = "jax"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax, keras, numpy as np
import kzoo

assert len(jax.devices()) == 2, jax.devices()


def build():
    keras.utils.set_random_seed(3)
    backbone = kzoo.models.DecoderBackbone(
        vocabulary_size=64, num_layers=2, num_heads=4, num_key_value_heads=2, hidden_dim=32,
        intermediate_dim=64, max_sequence_length=16, tie_embeddings=False, attention_bias=True,
        query_key_norm=True,
    )
    return kzoo.models.CausalLM(backbone)


rng = np.random.default_rng(0)
ids = rng.integers(1, 64, (4, 9)).astype("int32")
x, y = {"token_ids": ids[:, :-1], "padding_mask": np.ones((4, 8), "int32")}, ids[:, 1:]


def run(lm, weights):
    lm.set_weights(weights)
    logits = np.asarray(lm(x))
    lm.backbone.enable_lora(2)
    lm.compile(optimizer=keras.optimizers.SGD(0.1))
    lm.fit(x, y, batch_size=4, epochs=2, verbose=0)
    return logits, [np.asarray(w) for w in lm.weights]


plain = build()
weights = [w + rng.normal(0, 0.2, w.shape) for w in plain.get_weights()]
want_logits, want_weights = run(plain, weights)
mesh = keras.distribution.DeviceMesh((1, 2), ("batch", "model"), keras.distribution.list_devices())
layout_map = kzoo.models.DecoderBackbone.get_layout_map(mesh)
with keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch").scope():
    sharded = build()
    split = sorted(w.path for w in sharded.weights if "model" in str(w.value.sharding.spec))
    logits, trained = run(sharded, weights)
np.savez(sys.argv[1], want_logits=want_logits, logits=logits, split=split,
         diffs=[np.abs(a - b).max() for a, b in zip(want_weights, trained)])
"""


def test_a_sharded_decoder_gives_the_unsharded_logits_and_lora_steps(tmp_path):
    out = tmp_path / "out.npz"
    subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT), str(out)], check=True, timeout=600)
    result = np.load(out)
    # Every projection and the vocabulary are split over the two devices (norms are not).
    split = set(result["split"])
    for block in ("transformer_block_0", "transformer_block_1"):
        for name in ("query", "key", "value", "attention_output"):
            assert f"{block}/self_attention/{name}/kernel" in split
        for name in ("gate_dense", "intermediate_dense", "output_dense"):
            assert f"{block}/feed_forward/{name}/kernel" in split
    assert {"embedding/token_embedding/embeddings", "lm_head/kernel"} <= split
    # Only the order of the sums differs.
    np.testing.assert_allclose(result["logits"], result["want_logits"], atol=1e-5)
    assert result["diffs"].max() < 1e-6


CHECKPOINT_SCRIPT = """
import os, sys
os.environ["KERAS_BACKEND"] = "jax"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import keras, numpy as np
import kzoo

keras.utils.set_random_seed(5)
plain = kzoo.models.CausalLM.from_preset("llama_tiny")
plain.export_to_transformers(sys.argv[2])
ids = {"token_ids": np.array([[5, 9, 2, 7]], "int32"), "padding_mask": np.ones((1, 4), "int32")}
mesh = keras.distribution.DeviceMesh((1, 2), ("batch", "model"), keras.distribution.list_devices())
layout_map = kzoo.models.DecoderBackbone.get_layout_map(mesh)
with keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch").scope():
    sharded = kzoo.models.CausalLM.from_preset(sys.argv[2])
    split = sorted(w.path for w in sharded.weights if "model" in str(w.value.sharding.spec))
    logits = np.asarray(sharded(ids))
np.savez(sys.argv[1], want=np.asarray(plain(ids)), logits=logits, split=split)
"""


def test_a_checkpoint_loads_sharded(tmp_path):
    """A Hugging Face folder read inside `ModelParallel.scope()` (as a GGUF file is: each weight
    handed to its variable once, `_compat.set_variable`) gives sharded weights and the logits of
    the model written. Keras' own sharding of a new variable jits its initializer, which failed
    on the loader's."""
    out = tmp_path / "out.npz"
    command = [sys.executable, "-c", textwrap.dedent(CHECKPOINT_SCRIPT), str(out), str(tmp_path / "folder")]
    subprocess.run(command, check=True, timeout=600)
    result = np.load(out)
    assert "transformer_block_0/feed_forward/output_dense/kernel" in set(result["split"])
    np.testing.assert_allclose(result["logits"], result["want"], atol=1e-5)
