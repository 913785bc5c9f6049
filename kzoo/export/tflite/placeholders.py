"""Conversion without the weights: a decoder's TFLite file whose converter never held them.

TensorFlow's converter holds about ten copies of the weights it folds into constants (the
SavedModel it writes, its importer's constants, their optimized and exported forms: measured in
BENCHMARKS.md, "Export memory"), so a 1.5B model would need about 100 GB. Here it converts a stand-in:

- the weights of each transformer block (its vectors too: norm scales, biases) are swapped,
  while tracing, for placeholders of the same shape, and every block of the same configuration
  uses its first block's placeholders (one set per kind of block: a Gemma 3 model has two, its
  sliding and its global layers);
- every weight with a dimension of the vocabulary (the token table, an untied head) is swapped
  for a placeholder of `stand_in_vocabulary` rows, a prime no other dimension of the graph has;
- everything else (the final norm, position tables) is converted as it is.

Each placeholder element holds a float32 value no other element of the model's placeholders holds
(bit patterns above 2^20, consecutive in a matrix, a stride of its own apart in a vector), so that
each constant of the converted file tells which placeholder elements it holds, in which order: the
converter's transposes and reshapes are read off the file, not assumed, and so are the scalars it
folds in (a soft cap, Gemma's `1 + w`). Where a model's blocks repeat, the converter sees a few of
them and the file holds copies of the others (`repeated_blocks`). `resolve` then gives each use of
a shared placeholder, in the order the ops run (block 0 before block 1), its own buffer of the real
weights, sets the vocabulary back, and `converted` writes the file, each weight read from its Keras
variable one at a time: inside the flatbuffer, or for a file past 2 GB, after it at an offset
(TFLite's layout, which lets a file pass the 2 GB a flatbuffer can address: `graph_passes.write`).
"""

import dataclasses
import io

import keras
import numpy as np
from ai_edge_litert import schema_py_generated as schema

from kzoo import _compat
from kzoo import files
from kzoo.export import memory
from kzoo.export.tflite import graph_passes
from kzoo.export.tflite import repeated_blocks
from kzoo.export.tflite.convert import convert

# Placeholder values: consecutive float32 bit patterns from 2^20 up, far from any constant a
# decoder computes (masks, rotary tables, scales are at most a few thousand in magnitude).
_FIRST_BITS = np.uint32(0x49800000)
# Bit patterns left unused after each placeholder: a scalar the converter adds to one (Gemma's
# `1 + w`) moves its values by fewer patterns than this (at 2^20, 1.0 is 8), so that they fall
# partly outside it, never wholly inside a placeholder where they would read as other elements.
_GAP = 1 << 16
# A float32 constant of 16 or more values, nine in ten of them at least this in magnitude (and below
# 1e20), is taken for a placeholder's fold: a decoder's own constants (rotary tables, scales) are
# far smaller, its masks' fill values far larger.
_FOLDED_FLOOR = 1024.0


@dataclasses.dataclass
class _Placeholder:
    variable: keras.Variable  # the stand-in
    first_bits: int
    sources: list  # the real variables it stands for, in the order the blocks run
    vocabulary_axes: tuple = ()  # axes of the real variables that are the vocabulary
    kind: str = None  # its blocks' kind, None for a weight of no block
    stride: int = 1  # bit patterns between consecutive elements


class Placeholders:
    """While entered, `model`'s large weights are placeholders (see the module docstring).

    Args:
        model: a causal LM with `backbone.transformer_blocks`.
        sizes: ints the converted graph may have as dimensions (cache and prefill lengths);
            the stand-in vocabulary is a prime above all of them and the model's own sizes.

    While entered, the backbone's blocks are also only those `repetition` (a
    `repeated_blocks.Plan`, or None for all) converts.
    """

    def __init__(self, model, sizes=()):
        backbone = model.backbone
        self.backbone = backbone
        self.vocabulary_size = int(backbone.vocabulary_size)
        self.stand_in_vocabulary = _stand_in_vocabulary(model, sizes)
        self._swaps = []  # (layer, attribute, placeholder variable, real variable)
        self.placeholders = []
        self._next_bits = int(_FIRST_BITS)
        self.blocks = list(backbone.transformer_blocks)
        self.kinds = [repr(_without_names(block.get_config())) for block in self.blocks]
        # Each kind's vectors first: the lowest placeholder values, where a scalar the converter
        # adds (Gemma's `1 + w`) changes every value (below 2^24, float32's spacing is at most 1).
        layers_of = {id(block): [block, *_compat.sublayers(block)] for block in self.blocks}
        references = {}
        for rank in ("vectors", "matrices"):
            for block, kind in zip(self.blocks, self.kinds):
                if (kind, rank) in references:
                    continue
                references[(kind, rank)] = [
                    (layer, name, self._placeholder(variable.shape, (), kind))
                    for layer in layers_of[id(block)]
                    for name, variable in _variables(layer)
                    if _rank(variable) == rank
                ]
        for block, kind in zip(self.blocks, self.kinds):
            wanted = [(layer, name, variable) for layer in layers_of[id(block)] for name, variable in _variables(layer)]
            wanted = [item for rank in ("vectors", "matrices") for item in wanted if _rank(item[2]) == rank]
            reference = references[(kind, "vectors")] + references[(kind, "matrices")]
            if len(wanted) != len(reference):
                raise ValueError(f"Block {block.name} has another structure than its kind's first block.")
            for (layer, name, variable), (_, _, placeholder) in zip(wanted, reference):
                if tuple(variable.shape) != tuple(placeholder.variable.shape):
                    raise ValueError(f"Block {block.name}'s {variable.path} has another shape than its placeholder.")
                placeholder.sources.append(variable)
                self._swaps.append((layer, name, placeholder.variable, variable))
        in_blocks = {id(layer) for layers in layers_of.values() for layer in layers}
        for layer in _compat.sublayers(model):
            if id(layer) in in_blocks:
                continue
            for name, variable in _variables(layer):
                axes = tuple(axis for axis, size in enumerate(variable.shape) if size == self.vocabulary_size)
                if not axes:
                    continue
                if self.stand_in_vocabulary is None:  # a vocabulary no larger than the stand-in's
                    axes = ()
                shape = [self.stand_in_vocabulary if axis in axes else size for axis, size in enumerate(variable.shape)]
                placeholder = self._placeholder(shape, axes)
                placeholder.sources.append(variable)
                self._swaps.append((layer, name, placeholder.variable, variable))
        # Converted: a few blocks, the others their copies (`repeated_blocks`), or every block (a
        # block's scalar weight is no placeholder: copies would hold the copied block's value).
        weights = [variable for layers in layers_of.values() for layer in layers for _, variable in _variables(layer)]
        scalars = any(_rank(variable) is None for variable in weights)
        self.repetition = None if scalars else repeated_blocks.plan(self.kinds)

    def weight_blocks(self, sources):
        """`{buffer: [converted block of each use]}` for the buffers of `sources` (`_sources`) that
        are blocks' weights, as `repeated_blocks.repeated` takes them."""
        traced = self.repetition.traced
        return {
            buffer: [t for t, block in enumerate(traced) if self.kinds[block] == source.placeholder.kind]
            for buffer, source in sources.items()
            if source.placeholder.kind is not None
        }

    def _placeholder(self, shape, vocabulary_axes, kind=None):
        count = int(np.prod(shape))
        # A vector's values step by a stride of its own: the converter folds a scalar into a
        # vector (Gemma's `1 + w`), and vectors of one length and the same step would be one
        # another plus a scalar. An odd stride never divides the patterns an added 1 moves by.
        stride = 1 if len(shape) > 1 else 3 + 2 * sum(len(p.variable.shape) == 1 for p in self.placeholders)
        bits = self._next_bits + stride * np.arange(count, dtype=np.uint32)
        variable = keras.Variable(bits.view(np.float32).reshape(shape), dtype="float32", trainable=False)
        placeholder = _Placeholder(variable, self._next_bits, [], vocabulary_axes, kind, stride)
        self._next_bits += stride * count + _GAP
        self.placeholders.append(placeholder)
        return placeholder

    def __enter__(self):
        for layer, name, stand_in, _ in self._swaps:
            object.__setattr__(layer, name, stand_in)
        if self.repetition is not None:
            traced = [self.blocks[i] for i in self.repetition.traced]
            object.__setattr__(self.backbone, "transformer_blocks", traced)
        return self

    def __exit__(self, *exc):
        for layer, name, _, real in self._swaps:
            object.__setattr__(layer, name, real)
        object.__setattr__(self.backbone, "transformer_blocks", self.blocks)
        return False

    def placeholder_of(self, values):
        """`(placeholder, flat indices)` when every element of the float32 array `values` is one
        placeholder's, else None."""
        bits = np.ascontiguousarray(values, np.float32).view(np.uint32).ravel()
        if bits.size == 0:
            return None
        low, high = int(bits.min()), int(bits.max())
        for placeholder in self.placeholders:
            first, stride = placeholder.first_bits, placeholder.stride
            if first <= low and high < first + stride * int(np.prod(placeholder.variable.shape)):
                steps = bits.astype(np.int64) - first
                if stride > 1 and np.any(steps % stride):
                    return None
                return placeholder, steps // stride
        return None


def _variables(layer):
    """`(attribute, variable)` of the Keras variables `layer` holds as its own attributes."""
    return [(name, value) for name, value in vars(layer).items() if isinstance(value, keras.Variable)]


def _rank(variable):
    """Which of a block's weights, all placeholders, `variable` is: "vectors", "matrices" (two or
    more dimensions), or None (a scalar: converted as it is, so every block is converted)."""
    return {0: None, 1: "vectors"}.get(len(variable.shape), "matrices")


def _without_names(config):
    """A layer's config without its own or its sublayers' names: the same for every block of a kind."""
    if isinstance(config, dict):
        return {key: _without_names(value) for key, value in sorted(config.items()) if key != "name"}
    if isinstance(config, (list, tuple)):
        return [_without_names(value) for value in config]
    return config


def _stand_in_vocabulary(model, sizes):
    """A prime above twice every size of the model but its vocabulary and context (and twice each
    of `sizes`), or None where the vocabulary is no larger.

    The graph's dimensions are those sizes, their products (never prime) and sums of two (below
    the floor), so the prime is the stand-in's alone. The context is left out: a 32,768-position
    model exported with a 4,096-slot cache has no dimension of it but a position table's rows
    (only that exact number is avoided), and counting it would make the stand-in table, which the
    converter copies about ten times, seven times larger."""
    backbone = model.backbone
    context = getattr(backbone, "max_sequence_length", None)
    known = [
        int(value)
        for name, value in vars(backbone).items()
        if isinstance(value, int)
        and not isinstance(value, bool)
        and name not in ("vocabulary_size", "max_sequence_length")
    ]
    candidate = 2 * max([*known, *sizes, 64]) + 1
    while candidate == context or any(candidate % d == 0 for d in range(2, int(candidate**0.5) + 1)):
        candidate += 1
    return candidate if candidate < backbone.vocabulary_size else None


def _layouts(ndim):
    """The ways a converter lays a weight out as a constant: as it is, or one reshape to a
    matrix (the first `k` axes its rows) transposed. `(name, function of an array)`."""
    yield "as is", lambda array: array
    for k in range(1, ndim):
        yield f"rows {k}, transposed", lambda array, k=k: array.reshape(int(np.prod(array.shape[:k])), -1).T


@dataclasses.dataclass
class _Source:
    """How one constant buffer of the converted file comes from a placeholder."""

    placeholder: _Placeholder
    index: np.ndarray = None  # flat indices into the placeholder (the same shape)
    layout: object = None  # a `_layouts` function (where the vocabulary differs or a scalar was folded)
    fold: tuple = None  # `(np.divide or np.multiply, float32 scalar)` the converter applied (a soft cap)

    def values(self, real):
        """The constant's values for the real variable `real` (a NumPy array)."""
        if self.layout is None:
            return real.reshape(-1)[self.index]
        values = self.layout(real)
        return values if self.fold is None else self.fold[0](values, self.fold[1])


def _source(values, placeholders):
    """The `_Source` of the float32 constant `values` (flat), or None for a constant of no placeholder."""
    hit = placeholders.placeholder_of(values)
    if hit is not None:
        placeholder, index = hit
        if not placeholder.vocabulary_axes:
            return _Source(placeholder, index=index)
        stand_in = keras.ops.convert_to_numpy(placeholder.variable)
        for _, layout in _layouts(stand_in.ndim):
            if np.array_equal(layout(stand_in).reshape(-1), values):
                return _Source(placeholder, layout=layout)
        raise ValueError("The converter laid a vocabulary-sized weight out in a way kzoo cannot map.")
    if values.size < 2 or not np.all(values > 0):
        return None
    for placeholder in placeholders.placeholders:
        if int(np.prod(placeholder.variable.shape)) != values.size:
            continue
        stand_in = keras.ops.convert_to_numpy(placeholder.variable)
        for _, layout in _layouts(stand_in.ndim):
            laid = layout(stand_in).reshape(-1)
            # A scalar the converter added (Gemma's `1 + w`), divided or multiplied by (a soft cap):
            # the float32 nearest the difference or ratio or a neighbour, reproducing every value
            # exactly. Exactness is what tells a fold from a constant merely close to proportional.
            # Placeholder values are near each other, so that adding 1 to one is also dividing it
            # by a scalar near 1: the sum is tried first.
            for operation in (np.add, np.divide, np.multiply):
                if operation is np.add:
                    ratio = values.astype(np.float64) - laid
                else:
                    ratio = laid.astype(np.float64) / values if operation is np.divide else values / laid
                nearest = np.float32(np.median(ratio))
                for scalar in (
                    nearest,
                    np.nextafter(nearest, np.float32(0)),
                    np.nextafter(nearest, np.float32(np.inf)),
                ):
                    if np.array_equal(operation(laid, scalar), values):
                        return _Source(placeholder, layout=layout, fold=(operation, scalar))
    magnitudes = np.abs(values)
    if values.size >= 16 and np.mean((magnitudes >= _FOLDED_FLOOR) & (magnitudes <= 1e20)) >= 0.9:
        raise ValueError(
            "The converter folded a weight into a constant in a way kzoo cannot map back to the weights "
            "(not a transpose or reshape, or one divided or multiplied by a scalar)."
        )
    return None


def resolve(flatbuffer, placeholders):
    """The converted stand-in `flatbuffer` as a `schema.ModelT` whose constants of placeholders
    are the real weights' buffers (without their data), and `{buffer index: values}`, a function
    per such buffer that reads its real values (float32 NumPy) from the Keras variables.

    Each use of a placeholder shared by several blocks, in the order each subgraph's ops run, is
    the next block's: block k's output feeds block k + 1, so its ops run first. A signature may
    use it fewer times (a prefill, whose result is the cache alone, has no use for the last
    block's query, output projection and feed-forward: the converter drops them), never more
    (ValueError). Where `placeholders.repetition` converted a few blocks, the others are their
    copies first (`repeated_blocks.repeated`, which raises `NotRepeated` where they do not repeat).
    A constant the converter folded from a placeholder in a way that is not a layout
    (a transpose or reshape), or one divided or multiplied by a scalar, is refused too (ValueError).
    """
    model = schema.ModelT.InitFromPackedBuf(flatbuffer, 0)
    sources = {}
    for subgraph in model.subgraphs:
        for tensor in subgraph.tensors:
            data = model.buffers[tensor.buffer].data
            if tensor.buffer in sources or data is None or tensor.type != schema.TensorType.FLOAT32:
                continue
            source = _source(np.frombuffer(np.asarray(data, np.uint8).tobytes(), np.float32), placeholders)
            if source is not None:
                sources[tensor.buffer] = source
    if placeholders.repetition is not None:
        names = [block.name for block in placeholders.blocks]
        repeated_blocks.repeated(model, placeholders.repetition, placeholders.weight_blocks(sources), names)
    stand_in, vocabulary = placeholders.stand_in_vocabulary, placeholders.vocabulary_size
    readers, buffer_of = {}, {}
    signed = {signature.subgraphIndex for signature in model.signatureDefs or []}
    for number, subgraph in enumerate(model.subgraphs):
        original = [tensor.buffer for tensor in subgraph.tensors]  # before any is given a new buffer
        uses = {}  # placeholder buffer -> uses so far in this subgraph
        for op in subgraph.operators or []:
            inputs = list(op.inputs)
            for position, index in enumerate(inputs):
                if index < 0 or index >= len(original) or original[index] not in sources:
                    continue
                buffer = original[index]
                source = sources[buffer]
                blocks = len(source.placeholder.sources)
                if blocks > 1 and number not in signed:
                    # A branch subgraph may stand for several blocks' (`graph_passes.shared_subgraphs`).
                    raise ValueError("A weight of several blocks is used outside a signature's own subgraph.")
                block = uses.get(buffer, 0) if blocks > 1 else 0
                uses[buffer] = uses.get(buffer, 0) + 1
                if block >= blocks:
                    raise ValueError(f"A weight of {blocks} blocks is used more often in one subgraph.")
                key = (buffer, block)
                if key not in buffer_of:
                    buffer_of[key] = len(model.buffers)
                    model.buffers.append(schema.BufferT())
                    real = source.placeholder.sources[block]
                    readers[buffer_of[key]] = lambda source=source, real=real: source.values(
                        keras.ops.convert_to_numpy(real)
                    )
                tensor = subgraph.tensors[index]
                if tensor.buffer != original[index] and tensor.buffer != buffer_of[key]:
                    tensor = graph_passes.copied(tensor)  # another block's use of the same tensor: one of its own
                    tensor.name = tensor.name + f";block {block}".encode()  # names are unique in a file
                    subgraph.tensors.append(tensor)
                    inputs[position] = len(subgraph.tensors) - 1
                tensor.buffer = buffer_of[key]
            op.inputs = inputs
    for index in sources:
        model.buffers[index] = schema.BufferT()  # the placeholders' values: no longer referenced
    if stand_in is not None:
        _restore_vocabulary(model, stand_in, vocabulary)
    return model, readers


def _restore_vocabulary(model, stand_in, vocabulary):
    """Every dimension `stand_in` of the file's tensors, and every int32 constant of that value
    (shapes of reshapes), back to `vocabulary`."""
    for subgraph in model.subgraphs:
        for tensor in subgraph.tensors:
            for field in ("shape", "shapeSignature"):
                shape = getattr(tensor, field)
                if shape is not None and len(shape) and stand_in in list(shape):
                    setattr(tensor, field, np.where(np.asarray(shape) == stand_in, vocabulary, shape).astype(np.int32))
            data = model.buffers[tensor.buffer].data
            if tensor.type == schema.TensorType.INT32 and data is not None and len(data) <= 64:
                values = np.frombuffer(np.asarray(data, np.uint8).tobytes(), np.int32)
                if stand_in in values:
                    values = np.where(values == stand_in, vocabulary, values).astype(np.int32)
                    model.buffers[tensor.buffer].data = np.frombuffer(values.tobytes(), np.uint8)


def converted(model, trace, sizes=(), path=None):
    """The float32 TFLite flatbuffer of the signatures `trace()` makes of `model` (e.g. a
    `kzoo.export.litertlm.RuntimeSignatures`), converted with placeholders for its weights and
    then given them (see the module docstring): the same file as `convert.convert(trace(),
    "tflite_fp32", fuse_scales=False)`, made without the converter's copies of the weights.

    The weights are inside the flatbuffer where it stays under 2 GB, else stored after it at
    offsets (`graph_passes.write`).

    Args:
        model: a causal LM with `backbone.transformer_blocks`.
        trace: a function of no arguments returning the signatures of `model` to convert.
        sizes: ints the graph may have as dimensions (cache and prefill lengths, spans).
        path: None to return the file's bytes, or where to write it (whole or not at all,
            `kzoo.files.atomic_file`), its weights one at a time from the Keras variables.

    Returns:
        The bytes, or None when written to `path`.
    """
    stand_ins = Placeholders(model, sizes)
    try:
        resolved, readers = _resolved(stand_ins, trace)
    except repeated_blocks.NotRepeated:
        stand_ins.repetition = None  # every block converted
        resolved, readers = _resolved(stand_ins, trace)
    total = memory.float32_weight_bytes(model)
    if total < graph_passes.FLATBUFFER_LIMIT:
        for index, read in readers.items():
            resolved.buffers[index].data = np.frombuffer(np.ascontiguousarray(read(), np.float32), np.uint8)
        flatbuffer = graph_passes.packed(resolved, total)
        if path is None:
            return flatbuffer
        with files.atomic_file(path) as file:
            file.write(flatbuffer)
    elif path is None:
        file = io.BytesIO()
        graph_passes.write(file, resolved, readers)
        return file.getvalue()
    else:
        with files.atomic_file(path) as file:
            graph_passes.write(file, resolved, readers)
    return None


def _resolved(stand_ins, trace):
    """`resolve` of the signatures `trace()` makes, converted with `stand_ins`."""
    with stand_ins:
        signatures = trace()
        # A norm's scale folded into the next weights would make each of them a product of two
        # weights, which no placeholder stands for; as its own MUL it costs one multiply per value.
        # A few blocks convert at once; every block a signature at a time, each traced as it is
        # converted (the converter's memory grows with the graph).
        small = convert(signatures, "tflite_fp32", fuse_scales=False, apart=stand_ins.repetition is None)
    del signatures
    return resolve(small, stand_ins)
