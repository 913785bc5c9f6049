"""Quantized TFLite files: their size, and their quality loss, reported and bounded."""

import ml_dtypes
import numpy as np
import pytest

from kzoo import export
from kzoo import models
from kzoo.export.tflite import quantize
from tests.export.tiny_models import TRANSFORMER
from tests.export.tiny_models import build
from tests.export.tiny_models import redraw

# Large enough that the weights, not the graph, make up the file (as in any real model).
WEIGHTS_DOMINANT = dict(vocabulary_size=4000, hidden_dim=128, intermediate_dim=512)


def weights_dominant(family):
    """A `WEIGHTS_DOMINANT` model of `family` ("gpt" or "bert_classifier") with one transformer
    layer, which is traced, converted and quantized in about half the time of two (the token
    table is most of its weights either way)."""
    config = {**TRANSFORMER, **WEIGHTS_DOMINANT}
    if family == "gpt":
        return redraw(models.GPTCausalLM(models.GPTBackbone(num_layers=1, **config)))
    return redraw(models.BertClassifier(models.BertBackbone(num_layers=1, **config), num_classes=3, dropout=0.0))


def assert_small_and_bounded(report, quantized):
    fp32 = report["artifacts"]["tflite_fp32"]
    for name in quantized:
        artifact = report["artifacts"][name]
        assert artifact["size_bytes"] <= 0.3 * fp32["size_bytes"], name
        quality = artifact["quality"]
        assert quality["bound"] == export.QUALITY_BOUNDS[name]
        assert quality["cross_entropy_increase"] <= quality["bound"], name
        assert quality["top1_agreement"] >= 0.9, name


def test_dynamic_int8_gpt_is_small_and_close(tmp_path):
    report = export.export(
        weights_dominant("gpt"),
        tmp_path / "out",
        formats=["tflite_fp32", "tflite_int8_dynamic"],
        num_examples=4,
        latency_runs=1,
        generate_tokens=4,
    )
    assert_small_and_bounded(report, ["tflite_int8_dynamic"])
    # Quantized files generate too; their agreement with Keras is reported, not required.
    int8 = report["artifacts"]["tflite_int8_dynamic"]
    assert "decode" in int8["signatures"] and 0 <= int8["generation"]["token_agreement"] <= 1


def test_fp16_and_full_integer_int8_bert(tmp_path):
    report = export.export(
        weights_dominant("bert_classifier"),
        tmp_path / "out",
        formats=["tflite_fp32", "tflite_fp16", "tflite_int8"],
        num_examples=4,
        num_representative=8,
        latency_runs=1,
    )
    assert_small_and_bounded(report, ["tflite_int8"])
    activations = report["artifacts"]["tflite_int8"]["activation_types"]
    assert activations["INT8"] > activations.get("FLOAT32", 0)  # int8 compute, float interface only
    fp16 = report["artifacts"]["tflite_fp16"]
    assert fp16["size_bytes"] <= 0.55 * report["artifacts"]["tflite_fp32"]["size_bytes"]
    assert fp16["quality"]["cross_entropy_increase"] <= export.QUALITY_BOUNDS["tflite_fp16"]


def test_a_quality_loss_beyond_the_bound_fails_and_writes_nothing(tmp_path, monkeypatch):
    # A bound no file meets (`export` refuses a negative one it is given, before it starts). The
    # check is the format's, whatever the model: a feed-forward LM converts in a fraction of the time.
    monkeypatch.setitem(export.verification.QUALITY_BOUNDS, "tflite_int8_dynamic", -1.0)
    with pytest.raises(export.ExportError, match="tflite_int8_dynamic: the held-out cross-entropy rises"):
        export.export(
            build("feed_forward_lm"),
            tmp_path / "out",
            formats=["tflite_fp32", "tflite_int8_dynamic"],
            num_examples=2,
            latency_runs=1,
        )
    assert list(tmp_path.iterdir()) == []


def test_a_float32_difference_beyond_the_tolerance_fails_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(export.verification, "FP32_TOLERANCE", -1.0)
    with pytest.raises(
        export.ExportError, match="tflite_fp32: max \\|logit difference\\| from Keras is .* at length 1"
    ):
        export.export(
            build("feed_forward_lm"), tmp_path / "out", formats=["tflite_fp32"], num_examples=2, latency_runs=1
        )
    assert list(tmp_path.iterdir()) == []


def test_full_integer_int8_feed_forward_lm(tmp_path):
    # Unlike the recurrent models, the feed-forward LM has no WHILE loop to stop the calibrator.
    model = redraw(models.FeedForwardLanguageModel(4000, window_size=3, embedding_dim=64, hidden_dim=128))
    report = export.export(
        model,
        tmp_path / "out",
        formats=["tflite_fp32", "tflite_int8"],
        num_examples=4,
        num_representative=8,
        latency_runs=1,
    )
    int8 = report["artifacts"]["tflite_int8"]
    assert int8["size_bytes"] <= 0.3 * report["artifacts"]["tflite_fp32"]["size_bytes"]
    assert int8["quality"]["cross_entropy_increase"] <= export.QUALITY_BOUNDS["tflite_int8"]
    assert int8["activation_types"]["INT8"] > int8["activation_types"].get("FLOAT32", 0)


def q4_1(weights):
    """GGUF's Q4_1 of `(out, in)` weights, dequantized: per block of 32 inputs, 16 levels from
    the block's minimum to its maximum (both float16, as GGUF stores them)."""
    out, inputs = weights.shape
    blocks = weights.reshape(out, inputs // 32, 32)
    low = blocks.min(-1, keepdims=True).astype(np.float16).astype(np.float32)
    step = ((blocks.max(-1, keepdims=True) - low) / 15).astype(np.float16).astype(np.float32)
    return (low + np.clip(np.rint((blocks - low) / step), 0, 15) * step).reshape(out, inputs)


def q8_0(weights):
    """GGUF's Q8_0, dequantized: per block of 32, `step * q` with |q| <= 127, step = max|w| / 127."""
    rows, inputs = weights.shape
    blocks = weights.reshape(rows, inputs // 32, 32)
    step = (np.abs(blocks).max(-1, keepdims=True) / 127).astype(np.float16).astype(np.float32)
    return (np.rint(blocks / step) * step).reshape(rows, inputs)


def test_source_blocks_cut_a_4_bit_grid_into_int4_codes_and_offsets():
    weights = q4_1(np.random.default_rng(0).normal(0, 0.2, (48, 96)).astype(np.float32))
    codes, offsets, block = quantize.source_blocks(weights)
    assert block == 32 and codes.shape == weights.shape and offsets.shape == (48, 3)
    blocks = codes.reshape(48, 3, 32)
    # One step per block, stored as bfloat16 (LiteRT's int4 scales), the codes integers in [-8, 7]
    # that ai-edge-quantizer's recovery gets back.
    magnitudes = np.diff(np.sort(np.concatenate([np.abs(blocks), np.zeros((48, 3, 1))], -1), -1), axis=-1)
    step = np.min(np.where(magnitudes > 0, magnitudes, np.inf), -1)
    assert np.array_equal(step.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64), step)
    integers = blocks / step[..., None]
    assert np.array_equal(integers, np.rint(integers)) and integers.min() >= -8 and integers.max() <= 7
    # Codes plus offsets give the weights back, within the bfloat16 rounding of the step.
    source_step = (weights.reshape(48, 3, 32).max(-1) - weights.reshape(48, 3, 32).min(-1)) / 15
    error = np.abs(blocks + offsets[..., None] - weights.reshape(48, 3, 32)).max(-1)
    assert np.all(error <= 8 * 2**-8 * source_step + 1e-7)
    # The same from a transposed view (a Keras kernel is (in, out)).
    codes_t, offsets_t, _ = quantize.source_blocks(np.ascontiguousarray(weights.T).T)
    np.testing.assert_array_equal(codes_t, codes)
    np.testing.assert_array_equal(offsets_t, offsets)
    # Weights that are no 4-bit grid are left alone, and so is a grid of more levels.
    assert quantize.source_blocks(np.random.default_rng(1).normal(size=(8, 64)).astype(np.float32)) is None
    assert quantize.source_blocks(q8_0(np.random.default_rng(1).normal(size=(8, 64)).astype(np.float32))) is None
    # Grids of 5 to 8 bits are finer sources (for int8); float weights and bfloat16 ones are none.
    normal = np.random.default_rng(1).normal(size=(64, 256)).astype(np.float32)
    assert quantize.finer_source(q8_0(normal)) and quantize.finer_source(weights)
    assert not quantize.finer_source(normal)
    assert not quantize.finer_source(normal.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_a_weight_is_fitted_a_few_rows_at_a_time_as_a_whole(monkeypatch):
    """`source_blocks` and `finer_source` fit a large weight in chunks of rows (float64 copies
    of a whole token table are gigabytes): the same codes, offsets and answers as at once."""
    rng = np.random.default_rng(3)
    weights = q4_1(rng.normal(0, 0.2, (50, 96)).astype(np.float32))
    weights[7, :32] = 0.25  # a block of one value, cut apart from its neighbours' rows
    mixed = weights.copy()
    mixed[45] = rng.normal(size=96)  # the last chunk is no grid
    candidates = (weights, q8_0(rng.normal(size=(50, 96)).astype(np.float32)), mixed)
    whole = quantize.source_blocks(weights)
    answers = [quantize.finer_source(x) for x in candidates]
    monkeypatch.setattr(quantize, "_CHUNK_VALUES", 4 * 96)  # chunks of 4 rows, the last of 2
    assert len(quantize._row_chunks(weights)) == 13
    chunked = quantize.source_blocks(weights)
    np.testing.assert_array_equal(chunked[0], whole[0])
    np.testing.assert_array_equal(chunked[1], whole[1])
    assert quantize.source_blocks(mixed) is None
    assert [quantize.finer_source(x) for x in candidates] == answers == [True, True, False]


def test_a_block_whose_values_skip_levels_is_still_its_own_grid_and_recovered_exactly():
    # Levels 0, 2 and 5 of a step of 1/64: no two values are neighbours (the smallest gap is
    # two steps), and centred on 8 (codes -8, -6, -3) the smallest gap between magnitudes, 0
    # included, is 2, which 3 is no multiple of: ai-edge-quantizer's recovery would not get
    # the codes back. Another centre does.
    levels = np.array([0, 2, 5] * 10 + [0, 2])
    assert not quantize._recoverable(levels[None] - 8).all()
    step = 1 / 64
    weights = (0.25 + step * levels)[None].astype(np.float32)
    codes, offsets, _ = quantize.source_blocks(weights)
    integers = codes / step
    assert np.array_equal(integers, np.rint(integers)) and integers.min() >= -8 and integers.max() <= 7
    assert quantize._recoverable(np.rint(integers).astype(int)).all()
    # ai-edge-quantizer's own recovery finds that step.
    from ai_edge_quantizer.algorithms.uniform_quantize import dequantized_weight_recovery

    _, scales = dequantized_weight_recovery.get_zp_scale_from_dequantized_symmetric_weights(
        codes, quantized_dimension=1, block_size=32
    )
    recovered = codes / scales.reshape(1, 1)
    assert np.array_equal(recovered, np.rint(recovered)) and np.abs(recovered).max() <= 8
    np.testing.assert_array_equal(codes + offsets, weights)


def test_a_block_no_shift_makes_recoverable_is_rounded_to_even_codes_not_the_weight_to_int8():
    # Two of Qwen2.5-Coder-1.5B's Q4_K projections each hold one block of levels 0, 11 and 14:
    # centred on 7 its magnitudes are 0, 4, 7 (smallest gap 3), on 8 they are 0, 3, 6, 8 (gap 2),
    # and no other centre keeps the codes in [-8, 7]. The weight stays cut into codes and offsets,
    # that block's codes rounded to even integers (a step off at most), every other block exact.
    from ai_edge_quantizer.algorithms.uniform_quantize import dequantized_weight_recovery

    weights = q4_1(np.random.default_rng(2).normal(0, 0.2, (64, 512)).astype(np.float32))  # 1,024 blocks
    step = 1 / 64
    weights[5, 64:96] = 0.25 + step * np.array([0, 11, 14] * 10 + [0, 14])
    codes, offsets, _ = quantize.source_blocks(weights)
    blocks, source = codes.reshape(64, 16, 32), weights.reshape(64, 16, 32)
    restored = blocks + offsets[..., None]
    odd = np.abs(restored[5, 2] - source[5, 2])
    assert 0 < odd.max() <= step * (1 + 2**-7)  # the rounded block: a step at most (the step in bfloat16)
    others = np.abs(restored - source).max(-1)
    others[5, 2] = 0
    source_steps = (source.max(-1) - source.min(-1)) / 15
    assert np.all(others <= 8 * 2**-8 * source_steps + 1e-7)  # as exact as every cut block
    # ai-edge-quantizer's recovery reads every block's codes back as integers in [-8, 7].
    _, scales = dequantized_weight_recovery.get_zp_scale_from_dequantized_symmetric_weights(
        codes, quantized_dimension=1, block_size=32
    )
    recovered = blocks / scales.reshape(64, 16, 1)
    assert np.allclose(recovered, np.rint(recovered), atol=1e-3) and np.abs(np.rint(recovered)).max() <= 8
    # More than one such block in a thousand: no 4-bit source (the weight goes to int8).
    many = weights.copy()
    many[5:8, 64:96] = weights[5, 64:96]
    assert quantize.source_blocks(many) is None


def test_recoverability_looked_up_by_the_set_of_magnitudes_is_the_sorted_rule():
    """`_recoverable` looks codes under 16 up by the bit mask of their magnitudes; the rule it
    stands for (the smallest gap between sorted magnitudes, 0 included, divides them all) decides
    every block alike, and larger codes still go by it."""
    rng = np.random.default_rng(5)
    for high in (1, 3, 8, 15, 40):
        codes = rng.integers(-high, high + 1, (4000, 4)) * (rng.random((4000, 4)) < rng.random((4000, 1)))
        expected = quantize._recoverable_sorted(np.abs(codes))
        assert 0 < expected.mean() < 1 or high < 8  # below 8 every set of magnitudes is recoverable
        np.testing.assert_array_equal(quantize._recoverable(codes), expected)
    assert (
        quantize._recoverable(np.array([[0, 2, 4, 6]])).all()
        and not quantize._recoverable(np.array([[-8, -6, -3]])).all()
    )


def test_the_int4_rewrites_test_only_the_weights_they_did_not_split(monkeypatch):
    """After the 4-bit sources are split, `finer_source` is asked only about the weights left
    as they were (it costs about as much as the split, per weight)."""
    from kzoo.export.litertlm import RuntimeSignatures
    from kzoo.export.litertlm import bundle_model
    from kzoo.export.tflite import graph_passes
    from tests.export.test_litertlm_int4 import q4_source_lm

    float32 = bundle_model(RuntimeSignatures(q4_source_lm(), 32), "tflite_fp32")
    asked = []
    finer = quantize.finer_source
    monkeypatch.setattr(quantize, "finer_source", lambda weights: asked.append(weights.shape) or finer(weights))
    model = graph_passes.unpacked(float32)
    quantize._prepare(model, quantize.INT4)
    # The Q8_0 feed-forward output projection, (out, in) = (64, 128), and the Q8_0 token table.
    assert sorted(asked) == [(64, 128), (128, 64)]


def test_the_int4_rewrites_hold_each_split_weight_compact_until_it_is_written():
    """Every 4-bit weight's float32 codes at once were 5 GB at 1.5B parameters: the rewrites
    keep int8 integers and a step per block, made into `source_blocks`' codes, bit for bit,
    when the buffer is read to be written (tests/export/test_litertlm_int4.py: the file made so
    computes what the in-memory path's does)."""
    from kzoo.export.litertlm import RuntimeSignatures
    from kzoo.export.litertlm import bundle_model
    from kzoo.export.tflite import graph_passes
    from tests.export.test_litertlm_int4 import q4_source_lm

    weights = q4_1(np.random.default_rng(0).normal(0, 0.2, (48, 96)).astype(np.float32))
    codes, offsets, block = quantize.source_blocks(weights)
    deferred, deferred_offsets, deferred_block = quantize._deferred_source_blocks(weights)
    assert isinstance(deferred, graph_passes.Deferred) and len(deferred) == codes.nbytes
    assert np.asarray(deferred).tobytes() == codes.tobytes()
    np.testing.assert_array_equal(deferred_offsets, offsets)
    assert deferred_block == block
    model = graph_passes.unpacked(bundle_model(RuntimeSignatures(q4_source_lm(), 32), "tflite_fp32"))
    quantize._prepare(model, quantize.INT4)
    split = [buffer.data for buffer in model.buffers if isinstance(buffer.data, graph_passes.Deferred)]
    assert len(split) == len({sub.tensors[op.inputs[1]].buffer for sub, op in _source_block_ops(model)}) > 0
    packed = graph_passes.unpacked(graph_passes.packed(model, graph_passes.packed_size(model)))
    assert not any(isinstance(buffer.data, graph_passes.Deferred) for buffer in packed.buffers)


def _source_block_ops(model):
    """The FC ops of `model` whose outputs carry `quantize.SOURCE_BLOCKS` (the split codes')."""
    ops = []
    for subgraph in model.subgraphs:
        for op in subgraph.operators:
            name = subgraph.tensors[op.outputs[0]].name
            if quantize.SOURCE_BLOCKS in (name.decode() if isinstance(name, bytes) else name):
                ops.append((subgraph, op))
    return ops


@pytest.mark.parametrize("value", [0.0, 0.3])
def test_a_block_of_one_value_is_not_all_zero_codes(value):
    # Codes of 0 get the int4 scale 0, which LiteRT's XNNPACK refuses, failing the whole model
    # (Qwen2.5-Coder-0.5B's feed-forward has such blocks; tests/export/test_litertlm_int4.py
    # loads one in LiteRT).
    weights = q4_1(np.random.default_rng(0).normal(0, 0.2, (4, 96)).astype(np.float32))
    weights[1, 32:64] = np.float32(value)
    codes, offsets, _ = quantize.source_blocks(weights)
    assert np.all(np.abs(codes.reshape(4, 3, 32)).max(-1) > 0)
    np.testing.assert_array_equal(codes[1, 32:64] + offsets[1, 1], weights[1, 32:64])  # exactly: a power-of-two step


@pytest.mark.slow
def test_a_4_bit_source_s_blocks_keep_int8_s_error_next_to_a_large_activation():
    """The split FC (int4 codes + block offsets applied to the input's block sums) reads the input
    rounded per call as the codes' FC does: next to a large activation the rounding zeroes most
    small inputs, and offsets summed from the float input would no longer cancel what the codes'
    FC loses (on Qwen2.5-Coder-0.5B's Q4_K down-projections, about ten times int8's error and a
    quarter nat over the whole model)."""
    import tensorflow as tf
    from ai_edge_litert.interpreter import Interpreter

    from kzoo.checkpoints import fetch
    from kzoo.checkpoints.gguf.reader import GGUFCheckpoint

    path = fetch.path("qwen2.5-coder-0.5b-instruct")
    if path is None:
        pytest.skip("needs `python -m kzoo.checkpoints.fetch qwen2.5-coder-0.5b-instruct`")
    weights = GGUFCheckpoint(str(path)).read("model.layers.2.mlp.down_proj.weight")  # Q4_K, (out, in)
    inputs = tf.keras.Input((weights.shape[1],), batch_size=1)
    dense = tf.keras.layers.Dense(weights.shape[0], use_bias=False)
    model = tf.keras.Model(inputs, dense(inputs))
    dense.kernel.assign(weights.T)
    float32 = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    rng = np.random.default_rng(4)
    x = rng.normal(0, 1, (8, weights.shape[1])).astype(np.float32)
    x[:, [7, 100]] *= 300  # the large activations of a real model's feed-forward
    exact = x.astype(np.float64) @ weights.T.astype(np.float64)

    def error(flatbuffer):
        interpreter = Interpreter(model_content=flatbuffer)
        interpreter.allocate_tensors()
        (inp,), (out,) = interpreter.get_input_details(), interpreter.get_output_details()
        rows = []
        for row in x:
            interpreter.set_tensor(inp["index"], row[None])
            interpreter.invoke()
            rows.append(interpreter.get_tensor(out["index"])[0])
        return np.sqrt(np.mean((np.stack(rows) - exact) ** 2))

    int8, int4 = error(quantize.quantize(float32, quantize.INT8)), error(quantize.quantize(float32, quantize.INT4))
    assert int4 < 1.5 * int8
