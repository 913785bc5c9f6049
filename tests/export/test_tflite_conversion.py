"""TFLite conversion details: identical control-flow subgraphs stored once, and a bundle's
attention branches (`kzoo.layers.cache_spans`) shared by every layer."""

import numpy as np
import tensorflow as tf
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter

from kzoo import data
from kzoo import export
from kzoo import models
from kzoo.export import litertlm
from kzoo.export.tflite import graph_passes
from kzoo.export.tflite.convert import convert


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
