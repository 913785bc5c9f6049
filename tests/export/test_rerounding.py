"""`rerounding`: the finer-source weight groups an int4 export re-rounds into int4 blocks, chosen by
measuring each on the Keras model, and written so by ai-edge-quantizer."""

import keras
import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema

from kzoo import export
from kzoo.export import litertlm
from kzoo.export.tflite import graph_passes
from kzoo.export.tflite import quantize
from kzoo.export.tflite import rerounding
from tests.export.test_litertlm_int4 import q4_source_lm
from tests.export.test_litertlm_int4 import tiny_lm
from tests.export.test_quantization import q8_0

# `finer_lm`'s finer weights in its blocks: block 1's Q8_0 feed-forward output projection, and
# both blocks' Q8_0 query projections (its tied table is Q8_0 too, and no candidate).
OUTPUT = "transformer_block_*/feed_forward/output_dense/kernel"
QUERY = "transformer_block_*/self_attention/query/kernel"


def finer_lm():
    """`q4_source_lm` with its query projections in Q8_0."""
    lm = q4_source_lm()
    rng = np.random.default_rng(2)
    for weight in rerounding.weight_matrices(lm):
        if weight.group == QUERY:
            matrix = rng.normal(0, 0.2, weight.matrix().shape).astype(np.float32)  # (out, in)
            weight.variable.assign(q8_0(matrix).T.reshape(weight.variable.shape))
    return lm


def held_out():
    return np.random.default_rng(1).integers(1, 128, (2, 24))


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
    lm = finer_lm()
    record = rerounding.choose(lm, held_out(), budget=10.0)
    assert [name for name, group in record["groups"].items() if group["rerounded"]] == [OUTPUT, QUERY]
    float32 = litertlm.bundle_model(litertlm.RuntimeSignatures(lm, 32), "tflite_fp32")
    paths = ("transformer_block_1/feed_forward/output_dense/kernel", "self_attention/query/kernel")
    chosen = [w.matrix() for w in rerounding.weight_matrices(lm) if w.variable.path.endswith(paths)]
    assert len(chosen) == 3 == len(record["fingerprints"])
    written = int4_matrices(quantize.quantize(float32, quantize.INT4, record["fingerprints"]))
    for matrix in chosen:
        expected = rerounding.int4_rounded(matrix)
        assert np.abs(expected - matrix).max() > 0  # the test sees a rounding
        assert any(w.shape == matrix.shape and np.array_equal(w, expected) for w in written)
    by_rule = int4_matrices(quantize.quantize(float32, quantize.INT4))
    for matrix in chosen:
        assert not any(w.shape == matrix.shape and np.array_equal(w, rerounding.int4_rounded(matrix)) for w in by_rule)


def test_an_int4_export_asked_to_re_round_writes_the_groups_it_measured_in_int4(tmp_path):
    settings = dict(
        formats="litertlm_int4",
        cache_length=32,
        num_examples=2,
        latency_runs=1,
        generate_tokens=2,
        representative_data="synthetic",
        quality_bounds={"litertlm_int4": 10.0},  # a random model: its bound is not what is tested
    )
    kept = export.export(finer_lm(), tmp_path / "kept", **settings)["artifacts"]["litertlm_int4"]
    rerounded = export.export(finer_lm(), tmp_path / "rerounded", int4_rerounding=1.0, **settings)
    record = rerounded["artifacts"]["litertlm_int4"]
    assert "int4_rerounded" not in kept
    groups = record["int4_rerounded"]["groups"]
    assert sorted(groups) == sorted([OUTPUT, QUERY]) and all(group["rerounded"] for group in groups.values())
    assert record["int4_rerounded"]["weights"] == {"chosen": 3, "in_file": 3}  # each found in the file
    # Three weights of 8,192 / 4,096 / 4,096 values from int8 (a byte each) to int4 blocks (4.5 bits).
    assert kept["tflite_bytes"] - record["tflite_bytes"] >= 0.4 * 16384


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
    lm = finer_lm()
    token_ids = held_out()
    before = [keras.ops.convert_to_numpy(v) for v in lm.weights]

    def distributions():
        logits = keras.ops.convert_to_numpy(lm({"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)}))
        return keras.ops.convert_to_numpy(keras.ops.softmax(logits.astype("float64"), -1))

    own = distributions()
    queries = [w for w in rerounding.weight_matrices(lm) if w.group == QUERY]
    originals = [w.values() for w in queries]
    for weight, values in zip(queries, originals):
        matrix = rerounding.int4_rounded(weight.matrix(values))  # the FC's (outputs, inputs)
        weight.variable.assign(matrix.T.reshape(values.shape))
    rerounded = distributions()
    for weight, values in zip(queries, originals):
        weight.variable.assign(values)
    by_hand = np.mean(np.sum(own * np.log(own / rerounded), -1))  # KL(own || re-rounded)
    agreement = np.mean(own.argmax(-1) == rerounded.argmax(-1))

    record = rerounding.choose(lm, token_ids, budget=10.0)
    groups = record["groups"]
    # Block 0's output projection is Q4_1 (int4 keeps its blocks), the tied Q8_0 table the output layer.
    assert sorted(groups) == sorted([OUTPUT, QUERY]) and groups[OUTPUT]["weights"] == 1
    np.testing.assert_allclose(groups[QUERY]["divergence"], by_hand, rtol=1e-5)
    np.testing.assert_allclose(groups[QUERY]["top1_agreement"], agreement)
    cheap, costly = sorted(group["divergence"] for group in groups.values())
    assert 0 < cheap < costly
    # A budget between the two takes the cheap group alone; one below both takes none.
    tight = rerounding.choose(lm, token_ids, budget=(cheap + costly) / 2)
    taken = [name for name, group in tight["groups"].items() if group["rerounded"]]
    assert taken == [name for name, group in groups.items() if group["divergence"] == cheap]
    assert len(tight["fingerprints"]) == groups[taken[0]]["weights"] and tight["divergence"] == cheap
    # The model's own logits given (as the export has them) instead of computed: the same choice.
    logits = keras.ops.convert_to_numpy(lm({"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)}))
    given = rerounding.choose(lm, token_ids, logits, budget=(cheap + costly) / 2)
    assert {k: v for k, v in given.items() if k != "fingerprints"} == {
        k: v for k, v in tight.items() if k != "fingerprints"
    }
    none = rerounding.choose(lm, token_ids, budget=cheap / 2)
    assert not any(group["rerounded"] for group in none["groups"].values()) and none["fingerprints"] == []
    for variable, values in zip(lm.weights, before):  # every weight as it was
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), values)


def test_groups_within_the_budget_alone_but_not_together_lose_the_last_taken(monkeypatch):
    # Measurements made up: each group alone within the budget, the two together over it.
    costs = {(OUTPUT,): 0.004, (QUERY,): 0.005, (OUTPUT, QUERY): 0.012}
    asked = []

    def divergence(self, chosen):
        asked.append(tuple(chosen))
        return costs[tuple(chosen)], 0.9

    monkeypatch.setattr(rerounding._Measurement, "divergence", divergence)
    record = rerounding.choose(finer_lm(), held_out(), budget=0.01)
    assert asked == [(OUTPUT,), (QUERY,), (OUTPUT, QUERY)]
    # The cheaper per value first: OUTPUT (0.004 for 8,192 values), then QUERY (0.005); together
    # 0.012, so QUERY, the last taken, is left out.
    assert {name: group["rerounded"] for name, group in record["groups"].items()} == {OUTPUT: True, QUERY: False}
    np.testing.assert_allclose(record["divergence"], 0.004)
    assert len(record["fingerprints"]) == 1


def test_a_group_of_few_values_is_not_measured(monkeypatch):
    # Each of finer_lm's two finer groups holds 8,192 of its 81,920 weight values (10%).
    monkeypatch.setattr(rerounding, "LEAST_SHARE", 0.2)
    monkeypatch.setattr(rerounding._Measurement, "__enter__", None)  # nothing measured
    record = rerounding.choose(finer_lm(), held_out(), budget=10.0)
    assert record["groups"] == {
        OUTPUT: {"weights": 1, "values": 8192, "divergence": None, "top1_agreement": None, "rerounded": False},
        QUERY: {"weights": 2, "values": 8192, "divergence": None, "top1_agreement": None, "rerounded": False},
    }
    assert record["fingerprints"] == []


def test_a_weight_with_a_block_of_zeros_stays_int8():
    # Its int4 scale would be 0, which LiteRT's XNNPACK refuses: the bundle would not load.
    lm = finer_lm()
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
    assert list(rerounding.choose(lm, held_out(), budget=10.0)["groups"]) == [QUERY]


def test_a_model_trained_in_keras_has_nothing_to_re_round(monkeypatch):
    lm = tiny_lm(64)
    monkeypatch.setattr(rerounding._Measurement, "__enter__", None)  # nothing measured
    assert rerounding.choose(lm, held_out()) == {
        "budget": rerounding.BUDGET,
        "groups": {},
        "divergence": 0.0,
        "top1_agreement": 1.0,
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
    "name, rerounded",
    [
        # Its Q6_K down-projections move its distributions by about 0.009 nats, less per value
        # than its query projections (Q5_0 / Q8_0, 0.005), and the two together are over the budget.
        ("qwen2.5-coder-0.5b-instruct", {OUTPUT}),
        # Every finer group of Gemma 3 270M moves it by 0.05 nats or more: all stay int8.
        ("gemma-3-270m", set()),
    ],
)
def test_a_real_gguf_s_finer_weights_are_re_rounded_where_they_cost_next_to_nothing(name, rerounded):
    from kzoo import models
    from kzoo.checkpoints import fetch
    from kzoo.data.corpora import read_tiny_shakespeare

    path = fetch.path(name)
    if path is None:
        pytest.skip(f"needs `python -m kzoo.checkpoints.fetch {name}`")
    lm = models.CausalLM.from_preset(str(path))
    text = read_tiny_shakespeare()["validation"][0]["text"]
    ids = np.asarray(lm.tokenizer(text[:20000]))[: 4 * 256].reshape(4, 256)
    before = [keras.ops.convert_to_numpy(v) for v in lm.weights if len(v.shape) > 1]
    record = rerounding.choose(lm, ids)
    groups = record["groups"]
    assert OUTPUT in groups  # half the down-projections are Q6_K in both files
    assert {name for name, group in groups.items() if group["rerounded"]} == rerounded
    assert record["divergence"] <= rerounding.BUDGET
    assert len(record["fingerprints"]) == sum(group["weights"] for group in groups.values() if group["rerounded"])
    for variable, values in zip([v for v in lm.weights if len(v.shape) > 1], before):  # every weight as it was
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), values)
