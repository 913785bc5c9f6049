import keras
import numpy as np
import pytest

import kzoo
import kzoo.visualization
from tests.models import tiny_models


def test_gpt_attention_is_causal_and_ignores_padding():
    lm = kzoo.models.GPTCausalLM(tiny_models.gpt_backbone())
    ids = np.array([[5, 6, 7, 8, 0, 0]], "int32")
    mask = (ids > 0).astype("int32")
    weights = kzoo.visualization.self_attention_weights(lm.backbone, {"token_ids": ids, "padding_mask": mask})
    assert weights.shape == (1, 2, 6, 6)
    np.testing.assert_allclose(weights[0, :, :4].sum(-1), 1.0, rtol=1e-5)
    assert np.all(np.triu(weights[0], k=1) == 0)  # No query sees a later key.
    assert np.all(weights[0, :, :, 4:] == 0)  # Nor a padded one.


def test_bert_attention_sees_both_sides_and_matches_the_block():
    backbone = tiny_models.bert_backbone()
    ids = np.array([[5, 6, 7, 8]], "int32")
    inputs = tiny_models.bert_inputs(ids, np.ones_like(ids))
    weights = kzoo.visualization.self_attention_weights(backbone, inputs, layer=0)
    assert np.all(weights[0, :, 0, 1:] > 0)
    # The weights are the block's own: its attention output is their average of the values.
    block = backbone.transformer_blocks[0]
    hidden = keras.Model(backbone.input, block.input[0])(inputs)
    values = block.self_attention.value_dense(hidden).numpy()  # (1, T, h, d_v)
    mixed = np.einsum("hqk,khd->qhd", weights[0], values[0])
    expected = block.self_attention(hidden).numpy()[0]
    np.testing.assert_allclose(block.self_attention.output_dense(mixed[None]).numpy()[0], expected, atol=1e-5)


def test_plot_attention_writes_a_png_with_a_panel_per_head(tmp_path):
    path = tmp_path / "attention.png"
    kzoo.visualization.plot_attention(np.full((3, 4, 4), 0.25), list("ab c"), path, title="t")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_plot_attention_checks_the_tokens():
    with pytest.raises(ValueError, match="4 query and 4 key positions; received 4 query and 3 key tokens"):
        kzoo.visualization.plot_attention(np.full((4, 4), 0.25), list("abc"), "unused.png", query_tokens=list("abcd"))
