"""Passes over TFLite flatbuffers: the rewrites a converted file goes through, and the censuses
the export reports read from it. Every use of LiteRT's flatbuffer schema is here."""

import collections
import hashlib
import io
import mmap

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

# A flatbuffer addresses at most 2 GB; a file about that large or larger keeps its buffers of
# `_OUTSIDE_BYTES` or more after it (`write`), at offsets aligned to `_ALIGNMENT` bytes.
FLATBUFFER_LIMIT = (1 << 31) - (64 << 20)
_OUTSIDE_BYTES = 1024
_ALIGNMENT = 64
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
    model = unpacked(flatbuffer)
    share_subgraphs(model)
    return packed(model, len(flatbuffer))


def share_subgraphs(model):
    """`shared_subgraphs` on a `schema.ModelT`, in place."""
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
    _keep_subgraphs(model, kept, {old: position[canonical[old]] for old in range(len(model.subgraphs))})


def _keep_subgraphs(model, kept, renumber):
    """`model`'s subgraphs `kept` (indices, in order), every op's subgraph field and every signature
    renumbered through `renumber` (old index -> new)."""
    model.subgraphs = [model.subgraphs[i] for i in kept]
    for subgraph in model.subgraphs:
        for op in subgraph.operators or []:
            for options in (op.builtinOptions, op.builtinOptions2):
                for name, value in _subgraph_fields(options):
                    setattr(options, name, _renumbered(value, renumber))
    for signature in model.signatureDefs or []:
        signature.subgraphIndex = renumber[signature.subgraphIndex]


def without_signatures(model, keys):
    """`model` (a `schema.ModelT`) in place without the signatures `keys`, the subgraphs no other
    signature reaches (through the ops' subgraph fields: `IF`'s branches, ...) and the buffers
    only those read. The subgraphs kept keep their order; every index into the subgraphs and
    the buffers is renumbered."""
    keys = {key.encode() if isinstance(key, str) else key for key in keys}
    model.signatureDefs = [s for s in model.signatureDefs or [] if s.signatureKey not in keys]
    if not model.signatureDefs:
        raise ValueError(f"A model needs a signature besides {sorted(keys)}.")
    reached, todo = set(), [signature.subgraphIndex for signature in model.signatureDefs]
    while todo:
        index = todo.pop()
        if index not in reached:
            reached.add(index)
            for op in model.subgraphs[index].operators or []:
                for options in (op.builtinOptions, op.builtinOptions2):
                    for _, value in _subgraph_fields(options):
                        todo.extend(value if isinstance(value, list) else [value])
    kept = sorted(reached)
    _keep_subgraphs(model, kept, {old: new for new, old in enumerate(kept)})
    read = {0} | {entry.buffer for entry in model.metadata or []} | set(model.metadataBuffer or [])
    read |= {tensor.buffer for subgraph in model.subgraphs for tensor in subgraph.tensors or []}
    buffers = sorted(read)
    position = {old: new for new, old in enumerate(buffers)}
    model.buffers = [model.buffers[i] for i in buffers]
    for subgraph in model.subgraphs:
        for tensor in subgraph.tensors or []:
            tensor.buffer = position[tensor.buffer]
    for entry in model.metadata or []:
        entry.buffer = position[entry.buffer]
    if model.metadataBuffer is not None:
        model.metadataBuffer = [position[i] for i in model.metadataBuffer]


class Merge:
    """One TFLite model made of files converted one signature each from the same weights, each
    file added as it comes (`add`), so that only the model so far and one file are held: their
    subgraphs one after another, each operator code and each constant buffer of equal bytes
    stored once (a weight every signature reads is one buffer, as when the converter converts
    them together), every tensor name unique in the model (the quantizer looks tensors up by
    name). The metadata is the first file's, with the entries of another name the others add.
    Constants under `_OUTSIDE_BYTES` stay each file's own: a pass that rewrites a small constant
    in place (a shape) then rewrites one tensor's.

    `model` is the `schema.ModelT` so far (None before the first file)."""

    def __init__(self):
        self.model = None
        self._codes, self._constants, self._names, self._metadata = {}, {}, set(), set()

    def add(self, flatbuffer, key=None):
        """Adds the signatures of the TFLite `flatbuffer`; `key` names its single signature (the
        converter names a function converted alone `serving_default`, and its inputs and outputs
        `serving_default_<name>`)."""
        other = unpacked(flatbuffer)
        if self.model is None:
            self.model = _empty_model(other.version, other.description)
        model = self.model
        code_of = [self._code(code) for code in other.operatorCodes]
        metadata = {entry.buffer for entry in other.metadata or []}
        buffer_of = [0]  # buffer 0: the empty buffer every file starts with
        for index, buffer in enumerate(other.buffers[1:], 1):
            buffer_of.append(None if index in metadata else self._buffer(buffer))
        for entry in other.metadata or []:
            if entry.name not in self._metadata:
                self._metadata.add(entry.name)
                model.buffers.append(other.buffers[entry.buffer])
                entry.buffer = len(model.buffers) - 1
                model.metadata.append(entry)
        offset = len(model.subgraphs)
        renumber = [offset + i for i in range(len(other.subgraphs))]
        for signature in other.signatureDefs or []:
            signature.subgraphIndex = renumber[signature.subgraphIndex]
            signature.signatureKey = key if key is not None else signature.signatureKey
        prefix, tag = b"serving_default_", (key or str(offset)).encode()
        for subgraph in other.subgraphs:
            for tensor in subgraph.tensors or []:
                tensor.buffer = buffer_of[tensor.buffer]
                name = tensor.name
                if key is not None and name.startswith(prefix):
                    name = key.encode() + b"_" + name[len(prefix) :]
                if name in self._names:
                    name = name + b";" + tag
                self._names.add(name)
                tensor.name = name
            for op in subgraph.operators or []:
                op.opcodeIndex = code_of[op.opcodeIndex]
                for options in (op.builtinOptions, op.builtinOptions2):
                    for name, value in _subgraph_fields(options):
                        setattr(options, name, _renumbered(value, renumber))
            model.subgraphs.append(subgraph)
        for signature in other.signatureDefs or []:
            model.subgraphs[signature.subgraphIndex].name = signature.signatureKey
            model.signatureDefs.append(signature)

    def _code(self, code):
        key = (code.builtinCode, code.deprecatedBuiltinCode, code.customCode, code.version)
        if key not in self._codes:
            self._codes[key] = len(self.model.operatorCodes)
            self.model.operatorCodes.append(code)
        return self._codes[key]

    def _buffer(self, buffer):
        """The model's index of a buffer equal to `buffer`, added if it has none."""
        buffers = self.model.buffers
        if buffer.data is not None and len(buffer.data) >= _OUTSIDE_BYTES:
            data = memoryview(np.ascontiguousarray(buffer.data)).cast("B")
            key = (len(data), hashlib.blake2b(data, digest_size=16).digest())
            for index in self._constants.get(key, []):
                if np.array_equal(buffers[index].data, buffer.data):
                    return index
            self._constants.setdefault(key, []).append(len(buffers))
        buffers.append(buffer)
        return len(buffers) - 1


def _empty_model(version, description):
    """A `schema.ModelT` with nothing in it but the empty buffer 0."""
    model = schema.ModelT()
    model.version, model.description = version, description
    model.operatorCodes, model.subgraphs, model.signatureDefs, model.metadata = [], [], [], []
    model.buffers = [schema.BufferT()]
    return model


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
    model = unpacked(flatbuffer)
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(data, np.uint8)
    model.buffers.append(buffer)
    entry = schema.MetadataT()
    entry.name = name
    entry.buffer = len(model.buffers) - 1
    model.metadata = [*(model.metadata or []), entry]
    return packed(model, len(flatbuffer) + len(data))


def embedding_lookups(flatbuffer):
    """The TFLite model `flatbuffer` with its table lookups as EMBEDDING_LOOKUP ops: each GATHER
    of rows (axis 0) of a constant 2-D table by 1-D ids. The two compute the same; the quantizer
    stores an EMBEDDING_LOOKUP's table in int4, and leaves a GATHER's in float32, where a tied
    table would stay in float32 beside its int4 copy (the output layer's), larger than the int8 file."""
    model = unpacked(flatbuffer)
    make_embedding_lookups(model)
    return packed(model, len(flatbuffer))


def make_embedding_lookups(model):
    """`embedding_lookups` on a `schema.ModelT`, in place."""
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


class Deferred:
    """A constant buffer's bytes made only when they are read (`np.asarray(deferred)`, 1-D uint8):
    a rewrite can hold each new weight in a compact form (int4 codes as int8 integers and a step
    per block: a quarter of their float32 bytes) until the file is written a buffer at a time
    (`write`), instead of every one in float32 at once. `len()` is the bytes it makes."""

    def __init__(self, nbytes, make):
        self.nbytes, self._make = int(nbytes), make

    def __len__(self):
        return self.nbytes

    def __array__(self, dtype=None, copy=None):
        data = np.ascontiguousarray(self._make()).view(np.uint8).ravel()
        if data.nbytes != self.nbytes:
            raise AssertionError(f"A deferred buffer made {data.nbytes} bytes, not {self.nbytes}.")
        return data if dtype is None else data.astype(dtype, copy=False)


def split_fully_connected(model, split, residual_tag, offsets_tag, sums_tag):
    """`model` (a `schema.ModelT`, changed in place) with each FULLY_CONNECTED op whose constant
    float32 weights W (out, in) `split` cuts into `(residual, offsets, block)` computing

        y = x @ residual^T + sums(x) @ offsets^T,   sums(x)[j] = x[j * block : (j + 1) * block].sum()

    the sums an FC of 0/1 weights (one per input tensor), the offsets an FC on them, both in
    float32, added to the residual FC's output; `split` returns None to leave an op as it is,
    and may return the residual as a `Deferred` of its float32 bytes.
    The residual FCs' outputs are named with `residual_tag`, the sums FCs' with `sums_tag` and
    the offsets FCs' with `offsets_tag` (the quantizer's recipe picks ops by these names). Weights also read by
    another kind of op (a tied table's lookup) are left alone. Returns `(bytes added, ops split)`."""
    builtin = {max(code.builtinCode, code.deprecatedBuiltinCode): i for i, code in enumerate(model.operatorCodes)}
    fc = builtin.get(schema.BuiltinOperator.FULLY_CONNECTED)
    if fc is None:
        return 0, 0
    if schema.BuiltinOperator.ADD not in builtin:
        code = schema.OperatorCodeT()
        code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.ADD
        code.version = 1
        model.operatorCodes.append(code)
        builtin[schema.BuiltinOperator.ADD] = len(model.operatorCodes) - 1
    add = builtin[schema.BuiltinOperator.ADD]
    # Buffers read by anything but an FC's weights input keep their values.
    shared = {
        subgraph.tensors[index].buffer
        for subgraph in model.subgraphs
        for op in subgraph.operators
        for position, index in enumerate(op.inputs)
        if index >= 0 and not (op.opcodeIndex == fc and position == 1)
    }

    def constant(array):
        buffer = schema.BufferT()
        buffer.data = np.ascontiguousarray(array, np.float32).view(np.uint8).ravel()
        model.buffers.append(buffer)
        return len(model.buffers) - 1

    splits, sum_buffers, added, count = {}, {}, 0, 0
    for number, subgraph in enumerate(model.subgraphs):

        def tensor(name, shape, signature=None, buffer=None):
            t = schema.TensorT()
            t.name, t.type = name, schema.TensorType.FLOAT32
            t.shape = np.asarray(shape, np.int32)
            t.shapeSignature = None if signature is None else np.asarray(signature, np.int32)
            if buffer is None:
                model.buffers.append(schema.BufferT())
                buffer = len(model.buffers) - 1
            t.buffer = buffer
            subgraph.tensors.append(t)
            return len(subgraph.tensors) - 1

        def op(code, inputs, outputs, options_type, options):
            o = schema.OperatorT()
            o.opcodeIndex, o.inputs, o.outputs = code, list(inputs), list(outputs)
            o.builtinOptionsType, o.builtinOptions = options_type, options
            return o

        operators, sums, weight_tensors = [], {}, {}
        for original in subgraph.operators:
            operators.append(original)
            if original.opcodeIndex != fc or len(original.inputs) < 2:
                continue
            weights = subgraph.tensors[original.inputs[1]]
            options = original.builtinOptions
            if weights.buffer in shared or options.fusedActivationFunction != schema.ActivationFunctionType.NONE:
                continue
            if weights.buffer not in splits:
                array = _constant_matrix(model, weights)
                parts = None if array is None else split(array)
                if parts is not None:
                    residual, offsets, block = parts
                    model.buffers[weights.buffer].data = (
                        residual
                        if isinstance(residual, Deferred)
                        else np.ascontiguousarray(residual, np.float32).view(np.uint8).ravel()
                    )
                    inputs = int(weights.shape[1])
                    if (inputs, block) not in sum_buffers:
                        ones = np.arange(inputs) // block == np.arange(inputs // block)[:, None]
                        sum_buffers[inputs, block] = constant(ones)
                        added += ones.size * 4
                    parts = (constant(offsets), offsets.shape, sum_buffers[inputs, block])
                    added += offsets.size * 4
                splits[weights.buffer] = parts
            parts = splits[weights.buffer]
            if parts is None:
                continue
            offsets_buffer, offsets_shape, sum_buffer = parts
            output = subgraph.tensors[original.outputs[0]]
            output_name = output.name.decode() if isinstance(output.name, bytes) else output.name
            signature = None if output.shapeSignature is None else list(output.shapeSignature)
            key = (original.inputs[0], bool(options.keepNumDims), sum_buffer)
            if key not in sums:
                sum_shape = [offsets_shape[1], int(weights.shape[1])]
                if sum_buffer not in weight_tensors:
                    weight_tensors[sum_buffer] = tensor(
                        f"{offsets_tag}/block_sums_{number}_{sum_buffer}", sum_shape, buffer=sum_buffer
                    )
                sums[key] = tensor(
                    f"{output_name};{sums_tag}",
                    [*list(output.shape)[:-1], offsets_shape[1]],
                    None if signature is None else [*signature[:-1], offsets_shape[1]],
                )
                operators.insert(
                    len(operators) - 1,
                    op(
                        fc,
                        [original.inputs[0], weight_tensors[sum_buffer], -1],
                        [sums[key]],
                        original.builtinOptionsType,
                        _fc_options(options),
                    ),
                )
            if offsets_buffer not in weight_tensors:
                weight_tensors[offsets_buffer] = tensor(
                    f"{offsets_tag}/offsets_{number}_{offsets_buffer}", offsets_shape, buffer=offsets_buffer
                )
            from_offsets = tensor(f"{output_name};{offsets_tag}", output.shape, signature)
            from_residual = tensor(f"{output_name};{residual_tag}", output.shape, signature)
            operators.insert(
                len(operators) - 1,
                op(
                    fc,
                    [sums[key], weight_tensors[offsets_buffer], -1],
                    [from_offsets],
                    original.builtinOptionsType,
                    _fc_options(options),
                ),
            )
            final = original.outputs[0]
            original.outputs = [from_residual]
            add_options = schema.AddOptionsT()
            add_options.fusedActivationFunction = schema.ActivationFunctionType.NONE
            operators.append(
                op(add, [from_residual, from_offsets], [final], schema.BuiltinOptions.AddOptions, add_options)
            )
            count += 1
        subgraph.operators = operators
    return added, count


def tag_weighted_ops(model, choose, tag, unless=()):
    """`model` (a `schema.ModelT`, changed in place) with `tag` added to the output names of the
    FULLY_CONNECTED and EMBEDDING_LOOKUP ops whose constant float32 2-D weights (a lookup's table) `choose` accepts;
    the quantizer's recipe picks ops by these names. Ops whose output carries a tag of `unless`
    already are passed over (`choose` is never asked about their weights). Returns the ops tagged."""
    weighted = {
        i
        for i, code in enumerate(model.operatorCodes)
        if max(code.builtinCode, code.deprecatedBuiltinCode)
        in (schema.BuiltinOperator.FULLY_CONNECTED, schema.BuiltinOperator.EMBEDDING_LOOKUP)
    }
    chosen, count = {}, 0
    for subgraph in model.subgraphs:
        for op in subgraph.operators:
            if op.opcodeIndex not in weighted or len(op.inputs) < 2:
                continue
            output = subgraph.tensors[op.outputs[0]]
            name = output.name.decode() if isinstance(output.name, bytes) else output.name
            if any(f";{other}" in name for other in unless):
                continue
            weights = subgraph.tensors[op.inputs[1]]
            if weights.buffer not in chosen:
                array = _constant_matrix(model, weights)
                chosen[weights.buffer] = array is not None and bool(choose(array))
            if chosen[weights.buffer]:
                output.name = f"{name};{tag}"
                count += 1
    return count


def _constant_matrix(model, tensor):
    """The float32 2-D constant `tensor` of `model` as a NumPy array (a copy), or None."""
    data = model.buffers[tensor.buffer].data
    if tensor.type != schema.TensorType.FLOAT32 or data is None or len(tensor.shape) != 2:
        return None
    return np.frombuffer(np.asarray(data, np.uint8).tobytes(), np.float32).reshape(tensor.shape)


def _fc_options(options):
    """A float FULLY_CONNECTED's options with the same output rank as `options`' op."""
    new = schema.FullyConnectedOptionsT()
    new.fusedActivationFunction = schema.ActivationFunctionType.NONE
    new.keepNumDims = options.keepNumDims
    return new


def copied(value):
    """A copy of a schema object (a `TensorT`, an `OperatorT`) whose lists and arrays are its own."""
    copy = type(value)()
    for name, field in vars(value).items():
        setattr(copy, name, field.copy() if isinstance(field, (list, np.ndarray)) else field)
    return copy


def unpacked(flatbuffer):
    """The TFLite `flatbuffer` as a `schema.ModelT`, the data of buffers stored after the
    flatbuffer (at offsets: `write`) read in place, as views of `flatbuffer`."""
    model = schema.ModelT.InitFromPackedBuf(flatbuffer, 0)
    for buffer in model.buffers:
        if buffer.offset > 1:
            buffer.data = np.frombuffer(flatbuffer, np.uint8, buffer.size, buffer.offset)
            buffer.offset = buffer.size = 0
    return model


def packed(model, size):
    """`model` (a `schema.ModelT`) as TFLite bytes: one flatbuffer where `size` (about the file's
    bytes) leaves room under the 2 GB a flatbuffer can address, else the flatbuffer followed by
    the data of its larger buffers at offsets (`write`).

    The flatbuffer is packed in a builder made `size` bytes and a little more, and copied out
    once. A flatbuffers builder that runs out of room doubles, holding its old bytes beside the
    new, and `Builder.Output` is a copy: from a small builder, the bytes of a model's weights
    were held up to four times over."""
    if size >= FLATBUFFER_LIMIT:
        file = io.BytesIO()
        write_outside(file, model)
        return file.getvalue()
    return _inline(model, size)


def packed_size(model):
    """About the bytes of `model` (a `schema.ModelT`) packed: its buffers' data and a little per
    tensor and op (`packed`'s builder size)."""
    data = sum(len(buffer.data) for buffer in model.buffers if buffer.data is not None)
    items = sum(len(subgraph.tensors or []) + len(subgraph.operators or []) for subgraph in model.subgraphs)
    return data + 256 * items


def write_outside(file, model):
    """Writes `model` (a `schema.ModelT`) to the binary `file` with its buffers of
    `_OUTSIDE_BYTES` or more after the flatbuffer (`write`), whatever its size. Returns the
    bytes written."""
    large = {
        index: (lambda data=buffer.data: data)
        for index, buffer in enumerate(model.buffers)
        if buffer.data is not None and len(buffer.data) >= _OUTSIDE_BYTES
    }
    return write(file, model, large)


def rewrite_file(source, destination, rewrite):
    """Writes the TFLite file `source` to `destination` as `rewrite` changes it (a function of a
    `schema.ModelT`, changing it in place), holding no copy of its weights: the source is read
    through a mapping (the unpacked model's arrays are views of it, unmapped with the last of
    them) and written a buffer at a time (`write_outside`)."""
    with open(source, "rb") as file:
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    model = unpacked(mapped)
    del mapped
    rewrite(model)
    with open(destination, "wb") as out:
        write_outside(out, model)


def _inline(model, size):
    """`model` packed as one flatbuffer, in a builder made `size` bytes and a little more (its
    `Deferred` buffers made here: the packer takes arrays)."""
    for buffer in model.buffers:
        if isinstance(buffer.data, Deferred):
            buffer.data = np.asarray(buffer.data)
    builder = flatbuffers.Builder(size + (1 << 20))
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(memoryview(builder.Bytes)[builder.Head() :])


def write(file, model, readers):
    """Writes `model` (a `schema.ModelT`) to the binary `file` as a TFLite file whose buffers
    `readers` names are stored after the flatbuffer, at 64-byte aligned offsets (TFLite's layout
    for files past 2 GB), each read by its function (its bytes or a NumPy array) only when it is
    written, one at a time. Returns the bytes written."""
    order = sorted(readers)
    lengths = {}
    for index in order:
        data = model.buffers[index].data
        lengths[index] = len(data) if data is not None else _byte_length(model, index)
        model.buffers[index].data = None
    # The offsets take eight bytes each once set: packed first with offsets past 2^32 to learn the
    # flatbuffer's size, then with the real ones.
    for index in order:
        model.buffers[index].offset, model.buffers[index].size = 1 << 40, lengths[index]
    head = len(_inline(model, 0))
    offset = _aligned(head)
    for index in order:
        model.buffers[index].offset = offset
        offset = _aligned(offset + lengths[index])
    flatbuffer = _inline(model, head)
    if len(flatbuffer) != head:
        raise AssertionError("The flatbuffer's size changed with its offsets.")
    file.write(flatbuffer)
    position = head
    for index in order:
        data = memoryview(np.ascontiguousarray(readers[index]())).cast("B")
        if data.nbytes != lengths[index]:
            raise AssertionError(f"Buffer {index} has {data.nbytes} bytes, its tensor {lengths[index]}.")
        file.write(b"\0" * (model.buffers[index].offset - position))
        file.write(data)
        position = model.buffers[index].offset + data.nbytes
        del data
    return position


def _byte_length(model, buffer_index):
    """The bytes of the tensor that reads `buffer_index` (its shape's elements x its type's size)."""
    sizes = {schema.TensorType.FLOAT32: 4, schema.TensorType.INT32: 4, schema.TensorType.INT8: 1}
    for subgraph in model.subgraphs:
        for tensor in subgraph.tensors:
            if tensor.buffer == buffer_index:
                return sizes[tensor.type] * int(np.prod(tensor.shape))
    raise AssertionError(f"No tensor reads buffer {buffer_index}.")


def _aligned(offset):
    return -(-offset // _ALIGNMENT) * _ALIGNMENT


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
