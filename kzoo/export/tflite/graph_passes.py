"""Passes over TFLite flatbuffers: the rewrites a converted file goes through, and the censuses
the export reports read from it. Every use of LiteRT's flatbuffer schema is here."""

import collections

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.tools import flatbuffer_utils

_OP_NAMES = {code: name for name, code in vars(schema.BuiltinOperator).items() if not name.startswith("_")}


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
    return _packed(model, len(flatbuffer))


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
    return _packed(model, len(flatbuffer) + len(data))


def embedding_lookups(flatbuffer):
    """The TFLite model `flatbuffer` with its table lookups as EMBEDDING_LOOKUP ops: each GATHER
    of rows (axis 0) of a constant 2-D table by 1-D ids. The two compute the same; the quantizer
    stores an EMBEDDING_LOOKUP's table in int4, and leaves a GATHER's in float32, where a tied
    table would stay in float32 beside its int4 copy (the output layer's), larger than the int8 file."""
    model = schema.ModelT.InitFromPackedBuf(flatbuffer, 0)
    gathers = {
        index
        for index, code in enumerate(model.operatorCodes)
        if max(code.builtinCode, code.deprecatedBuiltinCode) == schema.BuiltinOperator.GATHER
    }
    lookup = schema.OperatorCodeT()
    lookup.builtinCode = lookup.deprecatedBuiltinCode = schema.BuiltinOperator.EMBEDDING_LOOKUP
    lookup.version = 1
    model.operatorCodes.append(lookup)
    for subgraph in model.subgraphs:
        for op in subgraph.operators:
            if op.opcodeIndex not in gathers:
                continue
            table, ids = (subgraph.tensors[index] for index in op.inputs)
            options = op.builtinOptions
            if (
                model.buffers[table.buffer].data is not None
                and len(table.shape) == 2
                and len(ids.shape) == 1
                and options.axis == 0
                and options.batchDims == 0
            ):
                op.opcodeIndex = len(model.operatorCodes) - 1
                op.inputs = [op.inputs[1], op.inputs[0]]  # EMBEDDING_LOOKUP(ids, table)
                op.builtinOptionsType, op.builtinOptions = schema.BuiltinOptions.NONE, None
    return _packed(model, len(flatbuffer))


def _packed(model, size):
    """`model` (a `schema.ModelT`) packed into flatbuffer bytes, in a builder made `size` bytes
    (about the file's) and a little more, and copied out once. A flatbuffers builder that runs out
    of room doubles, holding its old bytes beside the new, and `Builder.Output` is a copy: from a
    small builder, the bytes of a model's weights were held up to four times over."""
    builder = flatbuffers.Builder(size + (1 << 20))
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(memoryview(builder.Bytes)[builder.Head() :])


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
