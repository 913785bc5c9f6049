"""`rerounding`: the finer-source weight groups an int4 export re-rounds into int4 blocks, chosen by
measuring each on the Keras model, and written so by ai-edge-quantizer."""

import keras
import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema

from kzoo.export import litertlm
from kzoo.export import verification
from kzoo.export.tflite import graph_passes
from kzoo.export.tflite import quantize
from kzoo.export.tflite import rerounding
from tests.export.test_litertlm_int4 import q4_source_lm
from tests.export.test_litertlm_int4 import tiny_lm

# q4_source_lm's finer weights: one Q8_0 feed-forward output projection, and the tied Q8_0 table.
OUTPUT = "transformer_block_*/feed_forward/output_dense/kernel"
TABLE = "embedding/token_embedding/embeddings"


def held_out():
    rows = np.random.default_rng(1).integers(1, 128, (2, 25))
    return rows[:, :-1], rows[:, 1:]


def int4_matrices(flatbuffer):
    """The int4 weights of a TFLite model, dequantized: `(out, in)` float32 arrays, by buffer."""
    model = graph_passes.unpacked(flatbuffer)
    found = {}
    for subgraph in model.subgraphs:
        for tensor in subgraph.tensors:
            data = model.buffers[tensor.buffer].data
            if tensor.type != schema.TensorType.INT4 or data is None or tensor.buffer in found:
                continue
            details = tensor.quantization.details
            rows, inputs = tensor.shape
            packed = np.asarray(data, np.uint8)
            nibbles = np.stack([packed & 15, packed >> 4], -1).reshape(-1)[: rows * inputs].astype(np.int8)
            codes = np.where(nibbles > 7, nibbles - 16, nibbles).reshape(rows, inputs // details.blockSize, -1)
            scales_tensor = subgraph.tensors[details.scales]
            scales = np.frombuffer(np.asarray(model.buffers[scales_tensor.buffer].data, np.uint8).tobytes(), np.float16)
            scales = scales.astype(np.float32).reshape(rows, inputs // details.blockSize, 1)
            found[tensor.buffer] = (codes * scales).reshape(rows, inputs)
    return list(found.values())


def test_the_chosen_weights_are_the_int4_blocks_ai_edge_quantizer_writes():
    # `int4_rounded` (what `choose` measures) is what the quantizer then writes for the weights
    # chosen, with the file's blocks along the same inputs; without a choice they stay int8.
    lm = q4_source_lm()
    record = rerounding.choose(lm, *held_out(), budget=10.0)
    assert [name for name, group in record["groups"].items() if group["rerounded"]] == [OUTPUT, TABLE]
    float32 = litertlm.bundle_model(litertlm.RuntimeSignatures(lm, 32), "tflite_fp32")
    weights = {w.group if w.group != OUTPUT else w.variable.path: w for w in rerounding.weight_matrices(lm)}
    chosen = [weights["transformer_block_1/feed_forward/output_dense/kernel"].matrix(), weights[TABLE].matrix()]
    written = int4_matrices(quantize.quantize(float32, quantize.INT4, record["fingerprints"]))
    for matrix in chosen:
        expected = rerounding.int4_rounded(matrix)
        assert np.abs(expected - matrix).max() > 0  # the test sees a rounding
        assert any(w.shape == matrix.shape and np.array_equal(w, expected) for w in written)
    by_rule = int4_matrices(quantize.quantize(float32, quantize.INT4))
    for matrix in chosen:
        assert not any(w.shape == matrix.shape and np.array_equal(w, rerounding.int4_rounded(matrix)) for w in by_rule)


def test_a_weight_is_rounded_in_its_own_layout_as_the_file_s_matrix_is():
    # Kernels (in, out), attention kernels (d, heads, dim) and (heads, dim, d), the tied table (V, d).
    lm = tiny_lm(64)
    weights = rerounding.weight_matrices(lm)
    kinds = {(tuple(w.variable.shape), w.inputs, w.inputs_first) for w in weights}
    assert kinds == {
        ((64, 2, 32), 64, True),  # query
        ((64, 1, 32), 64, True),  # key, value (one KV head)
        ((2, 32, 64), 64, True),  # the attention's output
        ((64, 128), 64, True),  # gate, up
        ((128, 64), 128, True),  # down
        ((128, 64), 64, False),  # the tied table as the output layer
    }
    assert len(weights) == 2 * 7 + 1
    for weight in weights:
        values = weight.values()
        np.testing.assert_array_equal(
            weight.matrix(weight.int4_rounded(values)), rerounding.int4_rounded(weight.matrix(values))
        )


def test_each_group_is_measured_and_those_taken_keep_within_the_budget():
    lm = q4_source_lm()
    token_ids, targets = held_out()
    before = [keras.ops.convert_to_numpy(v) for v in lm.weights]

    def cross_entropy():
        logits = keras.ops.convert_to_numpy(lm({"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)}))
        return verification.quality(logits, targets)["cross_entropy"]

    own = cross_entropy()
    (table,) = [w for w in rerounding.weight_matrices(lm) if w.group == TABLE]
    original = table.values()
    table.variable.assign(rerounding.int4_rounded(original))  # (V, d): the FC's (outputs, inputs)
    by_hand = cross_entropy() - own
    table.variable.assign(original)

    record = rerounding.choose(lm, token_ids, targets, budget=10.0)
    groups = record["groups"]
    assert sorted(groups) == sorted([OUTPUT, TABLE]) and groups[OUTPUT]["weights"] == 1  # block 0's is Q4_1
    np.testing.assert_allclose(groups[TABLE]["cross_entropy_increase"], by_hand, atol=1e-6)
    assert by_hand > 0.05  # this random model's table loses in int4, its Q8_0 projection does not
    assert groups[OUTPUT]["cross_entropy_increase"] < 0.02
    # A budget between the two takes the cheap group alone; one below both takes none.
    tight = rerounding.choose(lm, token_ids, targets, budget=0.05)
    assert [name for name, group in tight["groups"].items() if group["rerounded"]] == [OUTPUT]
    assert len(tight["fingerprints"]) == 1 and tight["cross_entropy_increase"] <= 0.05
    # The model's own logits given (as the export has them) instead of computed: the same choice.
    logits = keras.ops.convert_to_numpy(lm({"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)}))
    given = rerounding.choose(lm, token_ids, targets, logits=logits, budget=0.05)
    for name, group in given["groups"].items():
        assert group["rerounded"] == tight["groups"][name]["rerounded"]
        np.testing.assert_allclose(
            group["cross_entropy_increase"], tight["groups"][name]["cross_entropy_increase"], atol=1e-6
        )
    none = rerounding.choose(lm, token_ids, targets, budget=-1.0)
    assert not any(group["rerounded"] for group in none["groups"].values()) and none["fingerprints"] == []
    for variable, values in zip(lm.weights, before):  # every weight as it was
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), values)


def test_a_group_of_few_values_is_not_measured(monkeypatch):
    # Each of q4_source_lm's two finer groups holds 8,192 of its 81,920 weight values (10%).
    monkeypatch.setattr(rerounding, "LEAST_SHARE", 0.2)
    monkeypatch.setattr(verification, "Quality", None)  # nothing measured
    record = rerounding.choose(q4_source_lm(), *held_out(), budget=10.0)
    assert record["groups"] == {
        name: {"weights": 1, "values": 8192, "cross_entropy_increase": None, "rerounded": False}
        for name in (OUTPUT, TABLE)
    }
    assert record["fingerprints"] == []


def test_a_weight_with_a_block_of_zeros_stays_int8():
    # Its int4 scale would be 0, which LiteRT's XNNPACK refuses: the bundle would not load.
    lm = q4_source_lm()
    (output,) = [
        w
        for w in rerounding.weight_matrices(lm)
        if w.variable.path == "transformer_block_1/feed_forward/output_dense/kernel"
    ]
    values = output.values()
    assert output.int4_loads(values)
    values[:32, 5] = 0  # one block of 32 inputs of output 5
    output.variable.assign(values)
    assert not output.int4_loads(values)
    assert list(rerounding.choose(lm, *held_out(), budget=10.0)["groups"]) == [TABLE]


def test_a_model_trained_in_keras_has_nothing_to_re_round(monkeypatch):
    lm = tiny_lm(64)
    monkeypatch.setattr(verification, "Quality", None)  # nothing measured
    assert rerounding.choose(lm, *held_out()) == {
        "budget": rerounding.BUDGET,
        "groups": {},
        "cross_entropy_increase": 0.0,
        "fingerprints": [],
    }


def test_a_fingerprint_knows_a_weight_transposed_and_not_another():
    weights = np.random.default_rng(0).normal(0, 0.02, (96, 64)).astype(np.float32)
    fingerprint = quantize.Fingerprint.of(weights)
    assert fingerprint.matches(quantize.Fingerprint.of(np.ascontiguousarray(weights.T)))
    other = weights.copy()
    other[3, 5] += 1e-4  # one value a small rounding step away
    assert not fingerprint.matches(quantize.Fingerprint.of(other))
    assert not fingerprint.matches(quantize.Fingerprint.of(np.random.default_rng(1).normal(0, 0.02, (96, 64))))


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, down_projections",
    [
        # Qwen2.5-Coder's Q6_K down-projections cost it next to nothing in int4 blocks.
        ("qwen2.5-coder-0.5b-instruct", True),
        # Gemma 3 270M's cost it about a seventh of a nat: they stay int8.
        ("gemma-3-270m", False),
    ],
)
def test_a_real_gguf_s_finer_weights_are_re_rounded_where_they_cost_next_to_nothing(name, down_projections):
    from kzoo import models
    from kzoo.checkpoints import fetch
    from kzoo.data.corpora import read_tiny_shakespeare

    path = fetch.path(name)
    if path is None:
        pytest.skip(f"needs `python -m kzoo.checkpoints.fetch {name}`")
    lm = models.CausalLM.from_preset(str(path))
    text = read_tiny_shakespeare()["validation"][0]["text"]
    ids = np.asarray(lm.tokenizer(text[:20000]))[: 4 * 257].reshape(4, 257)
    before = [keras.ops.convert_to_numpy(v) for v in lm.weights if len(v.shape) > 1]
    record = rerounding.choose(lm, ids[:, :-1], ids[:, 1:])
    groups = record["groups"]
    down = groups[OUTPUT]  # half of them Q6_K in both files
    assert down["rerounded"] == down_projections
    assert (down["cross_entropy_increase"] <= rerounding.BUDGET) == down_projections
    assert record["cross_entropy_increase"] <= rerounding.BUDGET
    assert len(record["fingerprints"]) == sum(group["weights"] for group in groups.values() if group["rerounded"])
    for variable, values in zip([v for v in lm.weights if len(v.shape) > 1], before):  # every weight as it was
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), values)
