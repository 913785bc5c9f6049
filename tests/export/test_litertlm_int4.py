"""`litertlm_int4`: a LiteRT-LM bundle with int4 weights in blocks of 32 (Google's ai-edge-quantizer),
within its quality bound of Keras in the runtime, exact to a 4-bit source's own blocks, and refused
for a model that cannot be blocked."""

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema

from kzoo import data
from kzoo import export
from kzoo import logs
from kzoo import models
from kzoo.export import litertlm
from kzoo.export import litertlm_model
from kzoo.export import verification
from kzoo.export.tflite import graph_passes
from kzoo.export.tflite import quantize
from tests.export.test_quantization import q4_1
from tests.export.test_quantization import q8_0

CACHE_LENGTH = 64  # the model's whole table: quality over 64 positions


def tiny_lm(hidden_dim, intermediate_dim=128, tie_embeddings=True):
    backbone = models.DecoderBackbone(
        vocabulary_size=128,
        num_layers=2,
        num_heads=2,
        num_key_value_heads=1,
        hidden_dim=hidden_dim,
        intermediate_dim=intermediate_dim,
        max_sequence_length=64,
        tie_embeddings=tie_embeddings,
    )
    return models.CausalLM(backbone, tokenizer=data.character_tokenizer(128))


def tensor_types(flatbuffer):
    """`{type name: bytes}` of the constant tensors of a TFLite model."""
    model = schema.Model.GetRootAs(flatbuffer, 0)
    names = {code: name for name, code in vars(schema.TensorType).items() if not name.startswith("_")}
    sizes, seen = {}, set()
    for g in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(g)
        for t in range(subgraph.TensorsLength()):
            tensor = subgraph.Tensors(t)
            size = model.Buffers(tensor.Buffer()).DataLength() or model.Buffers(tensor.Buffer()).Size()
            if size and tensor.Buffer() not in seen:
                seen.add(tensor.Buffer())
                sizes[names[tensor.Type()]] = sizes.get(names[tensor.Type()], 0) + size
    return sizes


def test_the_int4_bundle_is_within_its_bound_in_the_runtime(tmp_path):
    lm = tiny_lm(64)
    report = export.export(
        lm,
        tmp_path / "export",
        formats="litertlm_int4",
        cache_length=CACHE_LENGTH,
        num_examples=4,
        latency_runs=1,
        representative_data="synthetic",  # random ids: a random model's close calls, which int4 changes
    )
    assert list(report["artifacts"]) == ["litertlm_int4"]
    record = report["artifacts"]["litertlm_int4"]
    bundle = tmp_path / "export" / "model_int4.litertlm"
    assert record["path"] == bundle.name and bundle.stat().st_size == record["size_bytes"]
    quality = record["quality"]
    assert quality["bound"] == verification.QUALITY_BOUNDS["litertlm_int4"] == 0.15
    assert quality["cross_entropy_increase"] <= quality["bound"]
    assert 0.5 <= quality["top1_agreement"] < 1  # int4 changes some predictions, not most
    assert 0 <= record["generation"]["token_agreement"] <= 1 and record["tokenizer"]["matches_keras"]
    assert "ai-edge-quantizer" in record["description"]
    assert "int4_rerounded" not in record  # not asked for
    # The weights are int4: the 2 x (4 + 3) projections, and the tied token table, looked up (as
    # EMBEDDING_LOOKUP) and read by the output layer: no float32 copy of it is left.
    flatbuffer = litertlm_model.read_tflite_model(bundle)
    types = tensor_types(flatbuffer)
    matrices = 2 * (64 * 64 + 2 * 64 * 32 + 3 * 64 * 128)  # q, k and v (one KV head), o; the feed-forward
    table = 128 * 64
    assert types["INT4"] >= (matrices + table) // 2 and types.get("FLOAT32", 0) < table * 4
    assert record["ops"].get("EMBEDDING_LOOKUP") and "GATHER" not in record["ops"] and "CUSTOM" not in record["ops"]
    # It runs in LiteRT-LM, and its logits are those of the quantized model, not Keras'.
    runtime = litertlm_model.LiteRTLMModel(bundle)
    try:
        assert len(runtime.generate("ROMEO:", 8, top_k=1)) == 8
    finally:
        runtime.close()
    rows = np.random.default_rng(0).integers(1, 128, (1, 16))
    logits = litertlm_model.teacher_forced_logits(flatbuffer, rows[0])
    keras_logits = np.asarray(lm({"token_ids": rows, "padding_mask": np.ones_like(rows)}))[0]
    assert 0 < verification.max_abs_diff(logits, keras_logits) < 0.5 * np.abs(keras_logits).max()


def q4_source_lm():
    """`tiny_lm(64)` whose projections hold Q4_1 weights (one Q8_0) and whose tied table holds Q8_0,
    as a 4-bit GGUF's would."""
    lm = tiny_lm(64)
    rng = np.random.default_rng(0)
    for weight in lm.weights:
        if len(weight.shape) < 2:
            weight.assign(1 + rng.normal(0, 0.1, weight.shape))
            continue
        values = rng.normal(0, 0.2, weight.shape).astype(np.float32)
        if "embeddings" in weight.path:  # a table in 8 bits stays in 8
            weight.assign(q8_0(values))
            continue
        if "transformer_block_1/feed_forward/output_dense" in weight.path:  # a projection in 8 bits: int8
            weight.assign(q8_0(values.T).T)
            continue
        # (in, out) or einsum kernels: inputs first, except the output projection's (heads, dim, out).
        inputs = (
            values.reshape(-1, values.shape[-1])
            if "attention_output" in weight.path
            else values.reshape(values.shape[0], -1)
        )
        weight.assign(q4_1(inputs.T).T.reshape(weight.shape))
    return lm


def test_the_int4_bundle_keeps_a_4_bit_source_exact(tmp_path):
    # int4 keeps the Q4_1 projections' own blocks (codes + float32 offsets), and the table and
    # the Q8_0 projection in int8; the bundle's logits are Keras' up to the activations' int8
    # rounding. With ai-edge-quantizer's plain int4 blocks everywhere they move by as much as
    # the logits themselves.
    lm = q4_source_lm()
    rows = np.random.default_rng(1).integers(1, 128, (1, 24))
    keras_logits = np.asarray(lm({"token_ids": rows, "padding_mask": np.ones_like(rows)}))[0]
    float32 = litertlm.bundle_model(litertlm.RuntimeSignatures(lm, CACHE_LENGTH), "tflite_fp32")

    def difference(flatbuffer):
        return verification.max_abs_diff(litertlm_model.teacher_forced_logits(flatbuffer, rows[0]), keras_logits)

    kept = quantize.quantize(float32, quantize.INT4)
    types = tensor_types(kept)
    projections = 2 * (64 * 64 + 2 * 64 * 32 + 3 * 64 * 128)
    assert types["INT4"] >= projections // 2
    # The table and the Q8_0 projection, and the block sums' 0/1 weights (one per input width, 64 and
    # 128: they read the input quantized as the codes do), and only they.
    assert types["INT8"] == 128 * 64 + 128 * 64 + sum(width // 32 * width for width in (64, 128))
    assert types["FLOAT32"] >= (projections - 128 * 64) // 32 * 4  # one float32 offset per block
    census = graph_passes.op_census(kept)
    assert census["FULLY_CONNECTED"] >= 3 * 13  # each Q4_1 projection's FC, its offsets' and a sums FC
    scale = np.abs(keras_logits).max()
    assert difference(kept) < 0.15 * scale
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quantize, "_source_block_parts", lambda weights, tolerance=1e-5: None)
        patch.setattr(quantize, "finer_source", lambda weights: False)
        assert difference(quantize.quantize(float32, quantize.INT4)) > 0.4 * scale


@pytest.mark.parametrize("layout", ["inline", "outside"])
def test_quantizing_from_file_to_file_makes_the_same_model(tmp_path, layout):
    # The exporter quantizes its float32 file into another through mappings (`quantize_file`),
    # holding neither in memory; the file must compute what `quantize` of its bytes does, from
    # either layout of the float32 file (a model past 2 GB keeps its weights after the flatbuffer).
    lm = q4_source_lm()
    float32 = litertlm.bundle_model(litertlm.RuntimeSignatures(lm, CACHE_LENGTH), "tflite_fp32")
    source = tmp_path / "float32.tflite"
    if layout == "inline":
        source.write_bytes(float32)
    else:
        with open(source, "wb") as file:
            graph_passes.write_outside(file, graph_passes.unpacked(float32))
    rows = np.random.default_rng(1).integers(1, 128, (1, 24))
    for conversion in (quantize.INT8, quantize.INT4):
        destination = tmp_path / f"{conversion}.tflite"
        quantize.quantize_file(source, conversion, destination)
        written, expected = destination.read_bytes(), quantize.quantize(float32, conversion)
        assert tensor_types(written) == tensor_types(expected)
        assert graph_passes.op_census(written) == graph_passes.op_census(expected)
        np.testing.assert_array_equal(
            litertlm_model.teacher_forced_logits(written, rows[0]),
            litertlm_model.teacher_forced_logits(expected, rows[0]),
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["float32.tflite", f"{quantize.INT8}.tflite", f"{quantize.INT4}.tflite"]
    )  # nothing left beside them


def test_a_failed_quantization_leaves_no_file(tmp_path, monkeypatch):
    source = tmp_path / "float32.tflite"
    source.write_bytes(litertlm.bundle_model(litertlm.RuntimeSignatures(tiny_lm(64), CACHE_LENGTH), "tflite_fp32"))

    def fails(*args, **kwargs):
        raise RuntimeError("the quantizer failed")

    monkeypatch.setattr(quantize, "_recipe", fails)
    with pytest.raises(RuntimeError, match="the quantizer failed"):
        quantize.quantize_file(source, quantize.INT8, tmp_path / "int8.tflite")
    assert [p.name for p in tmp_path.iterdir()] == ["float32.tflite"]


def test_a_block_of_one_value_loads_in_litert():
    # LiteRT's XNNPACK refuses an int4 block whose scale is 0 and with it the whole model:
    # Qwen2.5-Coder-0.5B's bundle did, its feed-forward holding blocks of one value.
    lm = tiny_lm(64)
    rng = np.random.default_rng(0)
    for weight in lm.weights:
        if len(weight.shape) < 2:
            continue
        values = rng.normal(0, 0.2, weight.shape).astype(np.float32)
        if "embeddings" in weight.path:  # in 8 bits: the table in int8, as a GGUF's
            weight.assign(q8_0(values))
            continue
        output = "attention_output" in weight.path  # (heads, dim, out): inputs first, as the others
        shaped = values.reshape(-1, values.shape[-1]) if output else values.reshape(values.shape[0], -1)
        source = q4_1(shaped.T)
        if "output_dense" in weight.path:
            source[5, 32:64], source[6, :32] = 0.0, 0.3
        weight.assign(source.T.reshape(weight.shape))
    rows = rng.integers(1, 128, (1, 16))
    keras_logits = np.asarray(lm({"token_ids": rows, "padding_mask": np.ones_like(rows)}))[0]
    float32 = litertlm.bundle_model(litertlm.RuntimeSignatures(lm, CACHE_LENGTH), "tflite_fp32")
    with logs.captured_stderr():
        logits = litertlm_model.teacher_forced_logits(quantize.quantize(float32, quantize.INT4), rows[0])
    assert verification.max_abs_diff(logits, keras_logits) < 0.15 * np.abs(keras_logits).max()


def test_a_tied_token_table_is_stored_once_in_float32():
    # TensorFlow's converter folds a norm's scale into the weights read next: into the tied
    # table, that made the output projection a second table. Random norm scales (ones would
    # fold into the same bytes, which the converter stores once) show it.
    lm = tiny_lm(64)
    rng = np.random.default_rng(0)
    for weight in lm.weights:
        weight.assign(rng.normal(0, 0.2, weight.shape))
    flatbuffer = litertlm.bundle_model(litertlm.RuntimeSignatures(lm, CACHE_LENGTH), "tflite_fp32")
    table = 128 * 64 * 4
    assert lm.count_params() * 4 <= tensor_types(flatbuffer)["FLOAT32"] < lm.count_params() * 4 + table // 2


@pytest.mark.parametrize(
    "hidden_dim, intermediate_dim, message",
    [
        (48, 128, "hidden_dim = 48, num_heads x head_dim = 48 is not a multiple of 32"),
        (64, 100, "intermediate_dim = 100 is not a multiple of 32"),
    ],
)
def test_int4_is_refused_for_dimensions_that_are_not_multiples_of_the_block(
    tmp_path, hidden_dim, intermediate_dim, message
):
    with pytest.raises(
        export.ExportError, match=f"litertlm_int4: its weights are cut into blocks of 32, and {message}"
    ):
        export.export(tiny_lm(hidden_dim, intermediate_dim), tmp_path / "export", formats="litertlm,litertlm_int4")
    assert list(tmp_path.iterdir()) == []
