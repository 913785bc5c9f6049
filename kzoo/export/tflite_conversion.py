"""TFLite conversion of a `ServingModule`, builtin ops only, in four precisions."""

import collections
import json
import warnings

import numpy as np
import tensorflow as tf
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.tools import flatbuffer_utils

from kzoo import _compat
from kzoo import logs
from kzoo.export.serving_signatures import INFO_NAME

# Format name -> what its weights and activations are. Every format keeps a
# float32 interface (int32 token ids in, float32 logits and caches out).
TFLITE_FORMATS = {
    "tflite_fp32": "float32 weights and activations",
    "tflite_fp16": "float16 weights, float32 activations",
    "tflite_int8_dynamic": "int8 weights, activations quantized per call (dynamic range)",
    "tflite_int8": "int8 weights and activations (full integer), calibrated on representative data",
}

_OP_NAMES = {code: name for name, code in vars(schema.BuiltinOperator).items() if not name.startswith("_")}


def convert(signatures, tflite_format, representative_dataset=None, generation=True):
    """Converts a model's `ServingSignatures` to a TFLite flatbuffer with builtin ops only.

    Args:
        signatures: a `kzoo.export.ServingSignatures`; its TFLite functions
            become the file's signatures (`serving_default`, and `prefill`
            and `decode` for the generating models).
        tflite_format: a key of `TFLITE_FORMATS`.
        representative_dataset: for "tflite_int8", a callable returning an
            iterator of `(signature_key, {input_name: array})`.
        generation: bool, include `prefill` and `decode` where the model has them.

    Returns:
        The flatbuffer (bytes), with `signatures.info` as its `kzoo_model` metadata (JSON)
        unless it is None (`litertlm.RuntimeSignatures`).

    Raises:
        tf.lite's `ConverterError` when an op has no builtin TFLite kernel
        (kzoo never falls back to SELECT_TF_OPS, which needs the Flex delegate).
    """
    if tflite_format not in TFLITE_FORMATS:
        raise ValueError(f"Unknown TFLite format {tflite_format!r}; known: {sorted(TFLITE_FORMATS)}.")
    # The converter freezes what this module holds into constants: the variables alone. A
    # tokenizer's lookup tables (byte-level BPE) would become ops TFLite has no kernel for.
    variables = tf.Module(name="kzoo_tflite")
    variables.model_variables = list(signatures.variables)
    converter = tf.lite.TFLiteConverter.from_concrete_functions(signatures.tflite_functions(generation), variables)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if signatures.tied_embeddings:
        # The converter folds a norm's scale into the next layer's weights; folded into a tied
        # token table, it makes the output projection a second table beside the lookup's.
        _compat.disable_fuse_mul_and_fc(converter)
    if tflite_format != "tflite_fp32":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if signatures.tied_embeddings:
            # One int8 copy of a tied token table: per-channel scales would give
            # the output projection its own copy beside the lookup's.
            _compat.disable_per_channel_quantization(converter)
    if tflite_format == "tflite_fp16":
        converter.target_spec.supported_types = [tf.float16]
    elif tflite_format == "tflite_int8":
        if representative_dataset is None:
            raise ValueError("tflite_int8 needs a `representative_dataset`.")
        converter.representative_dataset = representative_dataset
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    # TF's calibrator still runs the deprecated tf.lite.Interpreter (kzoo runs LiteRT), and
    # prints its settings from C++.
    with warnings.catch_warnings(), logs.captured_stderr():
        warnings.filterwarnings("ignore", "(?s).*tf.lite.Interpreter is deprecated", UserWarning)
        flatbuffer = converter.convert()
    flatbuffer = shared_subgraphs(flatbuffer)
    if signatures.info is None:
        return flatbuffer
    return with_metadata(flatbuffer, INFO_NAME, json.dumps(signatures.info).encode("utf-8"))


def shared_subgraphs(flatbuffer):
    """The TFLite `flatbuffer` with each set of identical control-flow subgraphs stored once.

    The converter writes the branches of every `IF` as subgraphs of their own, also where
    they compute the same: a cached attention's branches (`kzoo.layers.cache_spans`) repeat
    in every layer of every signature, each a full table of tensors, names and ops (a
    megabyte per ten layers). Subgraphs with the same ops, tensor shapes, types and constant
    values are one; every op that names a subgraph then names the one kept. A signature's
    own subgraph is never merged.
    """
    model = schema.Model.GetRootAs(flatbuffer, 0)
    if model.SubgraphsLength() <= model.SignatureDefsLength():
        return flatbuffer
    model = schema.ModelT.InitFromPackedBuf(flatbuffer, 0)
    if any(buffer.offset > 1 for buffer in model.buffers):  # data stored after the flatbuffer: left as is
        return flatbuffer
    signed = {signature.subgraphIndex for signature in model.signatureDefs or []} | {0}
    canonical = list(range(len(model.subgraphs)))
    while True:
        first = {}
        merged = [
            i if i in signed else first.setdefault(_subgraph_key(model, model.subgraphs[i], canonical), i)
            for i in range(len(model.subgraphs))
        ]
        if merged == canonical:
            break
        canonical = merged
    kept = [i for i in range(len(model.subgraphs)) if canonical[i] == i]
    position = {old: new for new, old in enumerate(kept)}
    renumber = {old: position[canonical[old]] for old in range(len(model.subgraphs))}
    model.subgraphs = [model.subgraphs[i] for i in kept]
    for subgraph in model.subgraphs:
        for op in subgraph.operators or []:
            for options in (op.builtinOptions, op.builtinOptions2):
                for name, value in _subgraph_fields(options):
                    setattr(options, name, _renumbered(value, renumber))
    for signature in model.signatureDefs or []:
        signature.subgraphIndex = renumber[signature.subgraphIndex]
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def _subgraph_fields(options):
    """`(name, value)` of the fields of an op's options that name subgraphs (`IF`'s branches,
    `WHILE`'s body, ...)."""
    if options is None:
        return []
    return [(name, value) for name, value in vars(options).items() if "Subgraph" in name]


def _subgraph_key(model, subgraph, canonical):
    """What makes two subgraphs compute the same: ops with their options (subgraphs named by
    their current `canonical` index), tensors by shape, type and constant bytes; not names."""

    def plain(value):
        if isinstance(value, np.ndarray):
            return (value.dtype.str, value.tobytes())
        if isinstance(value, (list, tuple)):
            return tuple(plain(v) for v in value)
        if hasattr(value, "__dict__"):
            fields = dict(vars(value), **{name: _renumbered(v, canonical) for name, v in _subgraph_fields(value)})
            return (type(value).__name__, tuple(sorted((k, plain(v)) for k, v in fields.items())))
        return value

    def constant(index):
        buffer = model.buffers[index]
        return (buffer.offset, buffer.size) if buffer.data is None else np.asarray(buffer.data).tobytes()

    tensors = tuple(
        (plain(t.shape), plain(t.shapeSignature), t.type, t.isVariable, plain(t.quantization), constant(t.buffer))
        for t in subgraph.tensors or []
    )
    ops = tuple(
        (
            plain(model.operatorCodes[op.opcodeIndex]),
            plain(op.inputs),
            plain(op.outputs),
            plain(op.builtinOptions),
            plain(op.builtinOptions2),
            plain(op.customOptions),
        )
        for op in subgraph.operators or []
    )
    return tensors, ops, plain(subgraph.inputs), plain(subgraph.outputs)


def _renumbered(value, index):
    """A subgraph field's index, or list of indices, through `index` (old -> new)."""
    return [index[i] for i in value] if isinstance(value, list) else index[value]


def with_metadata(flatbuffer, name, data):
    """The TFLite `flatbuffer` with one more metadata entry, `name`, holding the bytes `data`."""
    model = flatbuffer_utils.read_model_from_bytearray(flatbuffer)
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(data, np.uint8)
    model.buffers.append(buffer)
    entry = schema.MetadataT()
    entry.name = name
    entry.buffer = len(model.buffers) - 1
    model.metadata = [*(model.metadata or []), entry]
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def op_census(flatbuffer):
    """`{op name: count}` over every subgraph of a TFLite flatbuffer; raises
    ValueError on a custom or Flex op (kzoo's files use builtin ops only)."""
    model = schema.Model.GetRootAs(flatbuffer, 0)
    counts = collections.Counter()
    for g in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(g)
        for i in range(subgraph.OperatorsLength()):
            code = model.OperatorCodes(subgraph.Operators(i).OpcodeIndex())
            # Codes above 127 live in BuiltinCode, older ones in the deprecated field.
            counts[_OP_NAMES[max(code.BuiltinCode(), code.DeprecatedBuiltinCode())]] += 1
    if counts.get("CUSTOM"):
        raise ValueError(f"The TFLite file has {counts['CUSTOM']} custom/Flex ops; kzoo exports builtin ops only.")
    return dict(counts.most_common())


def activation_types(flatbuffer):
    """`{dtype name: count}` of the non-constant tensors: shows whether a file
    computes in int8 (full integer) or in float."""
    model = schema.Model.GetRootAs(flatbuffer, 0)
    names = {code: name for name, code in vars(schema.TensorType).items() if not name.startswith("_")}
    counts = collections.Counter()
    for g in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(g)
        for i in range(subgraph.TensorsLength()):
            tensor = subgraph.Tensors(i)
            if model.Buffers(tensor.Buffer()).DataLength() == 0:
                counts[names[tensor.Type()]] += 1
    return dict(counts.most_common())
