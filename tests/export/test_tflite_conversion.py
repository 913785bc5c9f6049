"""TFLite conversion details: identical control-flow subgraphs stored once, a bundle's
attention branches (`kzoo.layers.cache_spans`) shared by every layer, signatures converted
one at a time and merged, and the checks' own signature, which a bundle ships without."""

import gc
import weakref

import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter

from kzoo import data
from kzoo import export
from kzoo import models
from kzoo.export import litertlm
from kzoo.export import litertlm_model
from kzoo.export.tflite import convert as convert_module
from kzoo.export.tflite import graph_passes
from kzoo.export.tflite.convert import convert
from kzoo.export.tflite.graph_passes import op_census
from kzoo.export.tflite.quantize import quantize


def counts(flatbuffer):
    """`(subgraphs, IF ops)` of a TFLite model."""
    model = schema.Model.GetRootAs(flatbuffer, 0)
    ifs = 0
    for g in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(g)
        for i in range(subgraph.OperatorsLength()):
            code = model.OperatorCodes(subgraph.Operators(i).OpcodeIndex())
            ifs += max(code.BuiltinCode(), code.DeprecatedBuiltinCode()) == schema.BuiltinOperator.IF
    return model.SubgraphsLength(), ifs


def branch_boolean_shapes(flatbuffer):
    """The shapes of the boolean tensors in the subgraphs that are not a signature's."""
    model = schema.Model.GetRootAs(flatbuffer, 0)
    signatures = {model.SignatureDefs(i).SubgraphIndex() for i in range(model.SignatureDefsLength())}
    shapes = []
    for g in set(range(model.SubgraphsLength())) - signatures:
        subgraph = model.Subgraphs(g)
        for i in range(subgraph.TensorsLength()):
            tensor = subgraph.Tensors(i)
            if tensor.Type() == schema.TensorType.BOOL:
                shapes.append(tuple(tensor.ShapeAsNumpy()) if tensor.ShapeLength() else ())
    return shapes


def run(flatbuffer, x, n):
    interpreter = Interpreter(model_content=flatbuffer)
    interpreter.allocate_tensors()
    for detail, value in zip(interpreter.get_input_details(), (x, n)):
        interpreter.set_tensor(detail["index"], value)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def test_identical_branches_are_stored_once_and_compute_the_same():
    @tf.function(input_signature=[tf.TensorSpec([4], tf.float32, name="x"), tf.TensorSpec([], tf.int32, name="n")])
    def two_layers(x, n):
        for scale in (2.0, 2.0, 3.0):  # the first two layers' branches are the same, the third's not
            x = tf.cond(n < 2, lambda x=x, s=scale: x * s, lambda x=x: tf.nn.softmax(x))
        return x

    converter = tf.lite.TFLiteConverter.from_concrete_functions([two_layers.get_concrete_function()], two_layers)
    original = converter.convert()
    shared = graph_passes.shared_subgraphs(original)
    assert counts(original) == (7, 3)
    assert counts(shared) == (4, 3)  # main, the softmax once, x * 2 once, x * 3
    x = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    for n in (0, 5):
        np.testing.assert_array_equal(run(shared, x, np.int32(n)), run(original, x, np.int32(n)))
    np.testing.assert_allclose(run(shared, x, np.int32(0)), x * 12, rtol=1e-6)


def test_a_bundles_attention_branches_are_shared_by_its_layers():
    backbone = models.DecoderBackbone(
        vocabulary_size=64, num_layers=3, num_heads=2, hidden_dim=16, intermediate_dim=32, max_sequence_length=64
    )
    lm = models.CausalLM(backbone, tokenizer=data.character_tokenizer(64))
    signatures = litertlm.RuntimeSignatures(lm, cache_length=64, lengths=[16], spans="auto")
    assert signatures.spans == [16, 32]
    flatbuffer = litertlm.bundle_model(signatures, "tflite_fp32")
    # An IF per layer choosing 16 | 32 slots or more, whose "more" branch holds an IF choosing
    # 32 | 64: per signature (decode, prefill_16) four branches, stored once, not once per layer.
    # prefill_16's last layer only writes its keys and values (its attention output is unused).
    subgraphs, ifs = counts(flatbuffer)
    assert subgraphs == 2 + 2 * 4
    assert ifs == (3 + 2) + 2
    # The causal mask is made before the branches, as an additive float bias: a branch holds no
    # boolean tensor but the scalar choosing the next span (XNNPack, LiteRT's CPU delegate, takes
    # no boolean op, and a branch with one ran 2-3x slower).
    assert set(branch_boolean_shapes(flatbuffer)) == {()}


def test_a_tflite_file_traces_only_its_own_signatures():
    backbone = models.GPTBackbone(
        vocabulary_size=32, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=16
    )
    signatures = export.ServingSignatures(models.GPTCausalLM(backbone), cache_length=16)
    flatbuffer = convert(signatures, "tflite_fp32")
    assert set(Interpreter(model_content=flatbuffer).get_signature_list()) == {"serving_default", "prefill", "decode"}
    # The SavedModel's `generate` (a whole decoding loop) is traced only when a SavedModel is made.
    generate = signatures.savedmodel_signatures()["generate"]
    assert generate.experimental_get_tracing_count() == 0
    assert len(signatures.variables) == len(backbone.weights) and generate.experimental_get_tracing_count() == 1


def test_signatures_converted_apart_and_merged_compute_what_they_do_converted_together():
    """`convert(..., apart=True)`: each signature converted alone, the files merged
    (`graph_passes.merged`): every signature's outputs are bit for bit those of the file converted at
    once (the IF branches' subgraph indices renumbered), and each weight is stored once."""
    backbone = models.DecoderBackbone(
        vocabulary_size=64, num_layers=3, num_heads=2, hidden_dim=16, intermediate_dim=32, max_sequence_length=64
    )
    lm = models.CausalLM(backbone, tokenizer=data.character_tokenizer(64))
    signatures = litertlm.RuntimeSignatures(lm, cache_length=64, spans="auto")
    together = convert(signatures, "tflite_fp32", fuse_scales=False)
    apart = convert(signatures, "tflite_fp32", fuse_scales=False, apart=True)
    assert sorted(Interpreter(model_content=apart).get_signature_list()) == ["decode", "prefill_16", "prefill_64"]
    assert counts(apart)[1] == counts(together)[1] > 0
    # Three signatures' copies of the weights (4 x 9,000 bytes of float32) would be 72,000 more bytes.
    assert len(apart) < len(together) + 8_000
    # The quantizer looks tensors up by name: each is unique in the file, as in the converter's.
    model = schema.ModelT.InitFromPackedBuf(apart, 0)
    names = [tensor.name for subgraph in model.subgraphs for tensor in subgraph.tensors]
    assert len(set(names)) == len(names)
    files = {"together": together, "apart": apart}
    files.update({f"{key} int8": quantize(flatbuffer, "int8_channelwise") for key, flatbuffer in files.items()})
    rng = np.random.default_rng(0)
    for name, length, start in [("prefill_16", 16, 8), ("prefill_64", 64, 0), ("decode", 1, 40)]:
        runner = Interpreter(model_content=together).get_signature_runner(name)
        inputs = {"tokens": rng.integers(0, 64, (1, length), dtype=np.int32)}
        inputs["input_pos"] = np.arange(start, start + length, dtype=np.int32)
        for cache, detail in runner.get_input_details().items():
            if cache.startswith("kv_cache_"):
                inputs[cache] = rng.normal(size=detail["shape"]).astype(np.float32)
        for pair in [("together", "apart"), ("together int8", "apart int8")]:
            expected, outputs = (
                Interpreter(model_content=files[key]).get_signature_runner(name)(**inputs) for key in pair
            )
            assert sorted(outputs) == sorted(expected)
            for key in expected:
                np.testing.assert_array_equal(outputs[key], expected[key])


def test_converted_apart_each_signature_is_traced_when_reached_and_let_go_once_converted(monkeypatch):
    """A traced decoder graph is hundreds of megabytes whatever the model's width: converted apart, the
    converter never holds two, and none is left once the file is made."""
    backbone = models.DecoderBackbone(
        vocabulary_size=64, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32, max_sequence_length=64
    )
    lm = models.CausalLM(backbone, tokenizer=data.character_tokenizer(64))
    signatures = litertlm.RuntimeSignatures(lm, cache_length=64)
    converted, seen = convert_module._converted, []

    def spy(functions, *args):
        gc.collect()
        assert all(graph() is None for graph in seen), "an earlier signature's graph is still held"
        seen.extend(weakref.ref(function.graph) for function in functions)
        return converted(functions, *args)

    monkeypatch.setattr(convert_module, "_converted", spy)
    convert(signatures, "tflite_fp32", fuse_scales=False, apart=True)
    gc.collect()
    assert len(seen) == 3 and all(graph() is None for graph in seen)  # prefill_16, prefill_64, decode


def test_the_checks_chunks_give_decode_s_logits_and_the_bundle_is_the_file_without_them():
    """`RuntimeSignatures(check_length=)`: the export's checks read a row's logits a chunk at a
    time (`TEACHER_FORCED`), float32 and quantized, as `decode` gives them a token at a time; the
    bundle's model is the file without that signature (`graph_passes.without_signatures`), each
    remaining signature computing bit for bit what the file converted without it does."""
    backbone = models.DecoderBackbone(
        vocabulary_size=64, num_layers=3, num_heads=2, hidden_dim=32, intermediate_dim=64, max_sequence_length=64
    )
    lm = models.CausalLM(backbone, tokenizer=data.character_tokenizer(64))
    plain = convert(litertlm.RuntimeSignatures(lm, 64, spans="auto"), "tflite_fp32", fuse_scales=False, apart=True)
    signatures = litertlm.RuntimeSignatures(lm, 64, spans="auto", check_length=16)
    checked = convert(signatures, "tflite_fp32", fuse_scales=False, apart=True)
    model = graph_passes.unpacked(checked)
    graph_passes.without_signatures(model, [litertlm.TEACHER_FORCED])
    shipped = graph_passes.packed(model, len(checked))
    names = sorted(Interpreter(model_content=plain).get_signature_list())
    assert sorted(Interpreter(model_content=checked).get_signature_list()) == sorted([*names, "teacher_forced"])
    assert sorted(Interpreter(model_content=shipped).get_signature_list()) == names
    assert counts(shipped) == counts(plain) and op_census(shipped) == op_census(plain)
    read = {tensor.buffer for subgraph in model.subgraphs for tensor in subgraph.tensors}
    read |= {0} | {entry.buffer for entry in model.metadata}
    assert read == set(range(len(model.buffers)))  # no buffer left that nothing reads
    rng = np.random.default_rng(0)
    for name in names:
        runner = Interpreter(model_content=plain).get_signature_runner(name)
        inputs = {key: rng.integers(0, 64, d["shape"], dtype=np.int32) for key, d in runner.get_input_details().items()}
        inputs["input_pos"] = np.arange(8, 8 + len(inputs["input_pos"]), dtype=np.int32)
        for cache, detail in runner.get_input_details().items():
            if cache.startswith("kv_cache_"):
                inputs[cache] = rng.normal(size=detail["shape"]).astype(np.float32)
        expected, outputs = runner(**inputs), Interpreter(model_content=shipped).get_signature_runner(name)(**inputs)
        assert sorted(outputs) == sorted(expected)
        for key in expected:
            np.testing.assert_array_equal(outputs[key], expected[key])
    rows = rng.integers(0, 64, (2, 40))  # chunks at 0, 16 and 24 (the last ends at the row's end)
    for conversion in [None, "int8_channelwise", "int4_blockwise32"]:
        one, chunked = (
            (plain, checked) if conversion is None else (quantize(plain, conversion), quantize(checked, conversion))
        )
        with litertlm_model.compiled_model(one) as a, litertlm_model.compiled_model(chunked) as b:
            for part in (rows, rows[:, :10]):  # and a row shorter than a chunk
                decoded = list(litertlm_model.decoded_rows(a, part))
                for expected, logits in zip(decoded, litertlm_model.chunked_rows(b, part, litertlm.TEACHER_FORCED)):
                    np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-5 * np.abs(expected).max())
    with pytest.raises(ValueError, match="besides"):
        graph_passes.without_signatures(graph_passes.unpacked(plain), names)
    with pytest.raises(ValueError, match=r"`check_length` must be in \[1, 64\]"):
        litertlm.RuntimeSignatures(lm, 64, check_length=65)
