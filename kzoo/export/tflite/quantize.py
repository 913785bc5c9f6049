"""Quantized TFLite models by Google's ai-edge-quantizer, as litert-torch quantizes its bundles.

A float32 file (`kzoo.export.tflite.convert`) goes in, the recipe named comes out. Its int8
is also the more exact: on SmolLM2, TensorFlow's dynamic-range int8 raised the held-out
cross-entropy far more (BENCHMARKS.md).

int4 keeps a 4-bit source's own blocks. A weight read from a GGUF in Q4_1 or Q4_K holds, in
each block of 32 inputs, at most 16 evenly spaced values `offset + step * k` (k in 0..15): an
asymmetric grid, which LiteRT's symmetric int4 blocks (a scale per block, no zero point) cannot
hold, so that re-rounding it would cost about as much again as the source's own rounding. Such
a weight is cut (`source_blocks`) into codes `step * (k - 8)`, which int4 holds exactly, and one
offset per block, which the file applies in float32 to the sums of the input over each block,
summed from the input as the codes' FC rounds it (`graph_passes.split_fully_connected`): an
eighth more bytes than int4 alone. A weight of a
finer source (Q5_0, Q6_K, Q8_0: `finer_source`) stays in int8 (Gemma 3 270M, whose "Q4_K_M" file
is mostly Q5_0 and Q8_0, lost most of a nat with its finer projections cut to int4), unless the
export is asked to measure which groups cost the model next to nothing in int4 blocks
(`rerounding.choose`). Every weight of a model trained in Keras gets
ai-edge-quantizer's int4 blocks. BENCHMARKS.md ("int4 that keeps a 4-bit source") has the
measurements that chose this: SmolLM2, Qwen2.5-Coder-0.5B, Gemma 3 270M.
"""

import contextlib
import dataclasses
import io
from pathlib import Path

import ml_dtypes
import numpy as np

from kzoo import files
from kzoo import logs
from kzoo.export.tflite import graph_passes

INT8, INT4 = "int8_channelwise", "int4_blockwise32"
INT4_BLOCK = 32
# What each quantization makes of the weights and activations.
QUANTIZATIONS = {
    INT8: "int8 weights with a scale per output channel, float32 activations quantized per call "
    "(ai-edge-quantizer's dynamic_wi8_afp32)",
    INT4: f"int4 weights in blocks of {INT4_BLOCK} along each input dimension, float32 activations quantized per "
    "call (ai-edge-quantizer's dynamic_wi4b32_afp32); a 4-bit source's blocks kept exactly (int4 codes, "
    "float32 block offsets), a 5- to 8-bit source's weights in int8 per channel (in int4 blocks where "
    "`int4_rerounding` measured a group to move the model's predictions by no more than it allows)",
}
# Values of a weight `_grid` fits at a time (`_row_chunks`): its float64 temporaries (2 MB) stay
# under glibc's threshold for mapping an allocation of its own (32 MB at most), so they are
# reused, not mapped and faulted in afresh by every operation (which took most of its time).
_CHUNK_VALUES = 1 << 18

# The share of the blocks `_source_blocks` fits at a time (a chunk of a weight's rows, `_row_chunks`)
# whose codes it may round (a step at most) where no shift makes them recoverable exactly.
_MOST_UNRECOVERABLE = 1e-3

# The names the int4 recipe picks ops by (`graph_passes.split_fully_connected` and
# `graph_passes.tag_weighted_ops` write them).
SOURCE_BLOCKS, BLOCK_OFFSETS, FINER_SOURCE = "kzoo_source_blocks", "kzoo_block_offsets", "kzoo_finer_source"
BLOCK_SUMS = "kzoo_block_sums"


def quantize(flatbuffer, conversion, rerounded=()):
    """The float32 TFLite model `flatbuffer` quantized by ai-edge-quantizer as `conversion` says
    (`INT8` or `INT4`), its table lookups first made EMBEDDING_LOOKUP ops (`embedding_lookups`)
    and, for `INT4`, its 4-bit source weights cut into codes and block offsets (`source_blocks`)
    and its finer source weights in int8, but those of `rerounded` (`Fingerprint`s:
    the weights `rerounding.choose` measured) in int4 blocks. `quantize_file` makes the same
    file without holding the model in memory."""
    model = graph_passes.unpacked(flatbuffer)
    added = _prepare(model, conversion, rerounded)
    prepared = graph_passes.packed(model, len(flatbuffer) + added)
    del model
    return _quantized(prepared, conversion)


def quantize_file(source, conversion, destination, rerounded=()):
    """`quantize` from the float32 TFLite file `source` to the file `destination` (written whole
    or not at all), holding neither model in memory. Returns how many of `rerounded` it found
    (a weight the converter folded a scale into is not found, and stays int8).

    The source is read through a mapping and its rewrites (`_prepare`) are made on one unpacked
    model whose weights are views of it; the rewritten model goes to a file beside
    `destination`, its weights one at a time (`graph_passes.rewrite_file`), which ai-edge-quantizer
    maps and quantizes into `destination`, also through a mapping. Reading the source into
    bytes and packing each rewrite held three or four copies of its weights: 6 GB over a
    2.5 GB model."""
    source, destination = Path(source), Path(destination)
    with files.atomic_file(destination, None) as staged:
        prepared = staged.with_name(staged.name + ".float32")
        staged.touch()  # with the usual permissions: the quantizer creates its file executable
        found = set()
        try:
            graph_passes.rewrite_file(source, prepared, lambda model: _prepare(model, conversion, rerounded, found))
            _quantized(prepared, conversion, str(staged))
        finally:
            prepared.unlink(missing_ok=True)
    return len(found)


def _prepare(model, conversion, rerounded=(), found=None):
    """The rewrites `quantize` makes before the quantizer, on a `schema.ModelT` in place: table
    lookups as EMBEDDING_LOOKUP, and for `INT4` the 4-bit sources split and the finer ones
    tagged, but those `rerounded` names (the indices of those found added to the set `found`).
    Returns the bytes the rewrites added."""
    found = set() if found is None else found
    graph_passes.make_embedding_lookups(model)
    if conversion != INT4:
        return 0
    tags = (SOURCE_BLOCKS, BLOCK_OFFSETS, BLOCK_SUMS)
    added, _ = graph_passes.split_fully_connected(model, _deferred_source_blocks, *tags)

    # The split ops' own configurations win over FINER_SOURCE's: their weights are not tested.
    def kept_finer(weights):
        if not finer_source(weights):
            return False
        if rerounded:
            fingerprint = Fingerprint.of(weights)
            matched = [i for i, other in enumerate(rerounded) if fingerprint.matches(other)]
            found.update(matched)
            return not matched
        return True

    graph_passes.tag_weighted_ops(model, kept_finer, FINER_SOURCE, unless=tags)
    return added


def _quantized(model, conversion, path=None):
    """ai-edge-quantizer's quantization of `model` (bytes, or a file's Path, which it maps) by the
    recipe of `conversion`: its bytes, or None once written to the file `path` (through a mapping)."""
    import ai_edge_quantizer

    quantizer = ai_edge_quantizer.Quantizer(model, _recipe(conversion))
    # It prints a size summary and progress bars.
    with logs.captured_stderr(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        result = quantizer.quantize(serialize_to_path=path)
    return None if path is not None else bytes(result.quantized_model)


def _recipe(conversion):
    """ai-edge-quantizer's recipe: int8 per channel, or int4 in blocks of 32 (both with
    activations quantized per call) with the codes of a 4-bit source recovered exactly (its
    dequantized-weight recovery), their block offsets left in float32, and the weights of a
    source of 5 to 8 bits (`finer_source`) in int8 per channel."""
    from ai_edge_quantizer import algorithm_manager
    from ai_edge_quantizer import qtyping
    from ai_edge_quantizer import recipe_manager

    operations, algorithms = qtyping.TFLOperationName, algorithm_manager.AlgorithmName
    manager = recipe_manager.RecipeManager()
    if conversion == INT8:
        manager.add_dynamic_config(".*", operations.ALL_SUPPORTED, num_bits=8)
        return manager.get_quantization_recipe()
    blocks = qtyping.QuantGranularity.BLOCKWISE_32
    # Later entries win where several names match.
    manager.add_dynamic_config(".*", operations.ALL_SUPPORTED, num_bits=4, granularity=blocks)
    manager.add_dynamic_config(FINER_SOURCE, operations.ALL_SUPPORTED, num_bits=8)
    manager.add_dynamic_config(
        SOURCE_BLOCKS,
        operations.FULLY_CONNECTED,
        num_bits=4,
        granularity=blocks,
        algorithm_key=algorithms.DEQUANTIZED_WEIGHT_RECOVERY,
    )
    manager.add_quantization_config(BLOCK_OFFSETS, operations.FULLY_CONNECTED, algorithm_key=algorithms.NO_QUANTIZE)
    # The block sums read the input as the codes' FC does, quantized per call (their 0/1 weights
    # are exact in int8): summed from the float input instead, the offsets keep what the codes'
    # FC loses of it to the rounding (next to a large activation, most of its small values), and
    # the two no longer cancel.
    manager.add_dynamic_config(BLOCK_SUMS, operations.FULLY_CONNECTED, num_bits=8)
    return manager.get_quantization_recipe()


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """A weight's values as a multiset: the same for any transpose or reshape of it, and for two
    different weights of a model as good as never (`matches` allows the sums' float64 rounding)."""

    size: int
    total: float
    magnitude: float
    square: float

    @classmethod
    def of(cls, values):
        """The fingerprint of a float array's values."""
        values = np.asarray(values, np.float32).ravel()
        total = magnitude = square = 0.0
        for start in range(0, values.size, 1 << 22):  # float64 copies of a chunk at a time
            chunk = values[start : start + (1 << 22)].astype(np.float64)
            total += chunk.sum()
            magnitude += np.abs(chunk).sum()
            square += np.square(chunk).sum()
        return cls(values.size, float(total), float(magnitude), float(square))

    def matches(self, other):
        """Whether `other` is the fingerprint of the same values (summed in another order)."""
        scales = (self.magnitude, self.magnitude, self.square)
        pairs = zip((self.total, self.magnitude, self.square), (other.total, other.magnitude, other.square), scales)
        return self.size == other.size and all(abs(a - b) <= 1e-9 * max(scale, 1e-30) for a, b, scale in pairs)


def source_blocks(weights, tolerance=1e-5):
    """`(codes, offsets, INT4_BLOCK)` of FC weights `(out, in)` whose every block of
    `INT4_BLOCK` inputs holds at most 16 evenly spaced values (a 4-bit source: GGUF's Q4_0, Q4_1,
    Q4_K), so that `weights ~= codes + offsets` repeated over each block; else None.

    The codes are `step * c` with c an integer in [-8, 7] and the step rounded to bfloat16 (as
    LiteRT's int4 blocks store it; `weights` then move by at most 8 x 2^-8 of a step); each
    block's c are shifted so that ai-edge-quantizer's recovery (the smallest gap between the
    block's magnitudes, 0 included) finds a step that divides them all. Where no shift does (a
    block in a thousand of each chunk of rows at most), the block's c are rounded to even
    integers: a step off at most."""
    parts = _source_block_parts(weights, tolerance)
    return None if parts is None else (_codes(*parts[:2]), parts[2], INT4_BLOCK)


def _deferred_source_blocks(weights):
    """`source_blocks` with the codes a `graph_passes.Deferred` of their integers and steps: a
    rewrite of a 1.5B model held every weight's float32 codes at once, 5 GB."""
    parts = _source_block_parts(weights)
    if parts is None:
        return None
    integers, steps, offsets = parts
    return graph_passes.Deferred(4 * integers.size, lambda: _codes(integers, steps)), offsets, INT4_BLOCK


def _codes(integers, steps):
    """The float32 codes `(out, in)` of `_source_block_parts`' integers and steps (each product
    of a 4-bit integer and a bfloat16 step is exact in float32)."""
    rows = integers.shape[0]
    return (integers.reshape(rows, -1, INT4_BLOCK) * steps[..., None]).reshape(integers.shape)


def _source_block_parts(weights, tolerance=1e-5):
    """`(integers, steps, offsets)` of `source_blocks`: the codes' integers (int8, `(out, in)`),
    each block's step (float32, `(out, in / INT4_BLOCK)`) and offset (float32, the same), or None."""
    parts = []
    for rows in _row_chunks(weights):  # stops at the first chunk that is no grid
        part = _source_blocks(rows, tolerance)
        if part is None:
            return None
        parts.append(part)
    if not parts:  # no rows
        return None
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))


def _source_blocks(weights, tolerance):
    """`_source_block_parts` of some rows of a weight, or None."""
    grid = _grid(weights, INT4_BLOCK, 15, tolerance)
    if grid is None:
        return None
    blocks, low, levels, step, flat = grid
    # A block of one value (Qwen2.5-Coder-0.5B's feed-forward has some) as code -8 on a power of
    # two, exact in bfloat16: codes of 0 get the int4 scale 0, which LiteRT's XNNPACK refuses
    # (the whole model fails to load).
    magnitude = np.abs(low) / 8
    power = np.exp2(np.floor(np.log2(np.where(magnitude > 0, magnitude, 1.0))))
    step = np.where(flat, np.where(magnitude > 0, power, 2.0**-10), step)
    stored = step.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    levels = levels.astype(np.int64)
    shift = np.full(step.shape, 8)
    # Shifts that keep the codes in [-8, 7], tried from 8 (the middle of a full block) outwards.
    bad = ~_recoverable(levels - shift)
    for candidate in (7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15, 0):
        if not bad.any():
            break
        codes = levels - candidate
        fixed = bad & (codes.min(-1, keepdims=True) >= -8) & (codes.max(-1, keepdims=True) <= 7) & _recoverable(codes)
        shift = np.where(fixed, candidate, shift)
        bad &= ~fixed
    codes = levels - shift
    if bad.any():
        # A block the recovery cannot read at any shift (one in 430,080 of two of Qwen2.5-Coder-1.5B's
        # Q4_K projections: levels 0, 11 and 14) gets its codes rounded to even integers, which it
        # reads back (every even magnitude is a multiple of the smallest gap between them), each
        # value at most a step off: far closer to the source than the whole weight in int8. More
        # than a few such blocks: no 4-bit source.
        if bad.sum() > _MOST_UNRECOVERABLE * bad.size:
            return None
        codes = np.where(bad, np.clip(2 * np.rint(codes / 2), -8, 6), codes)
    integers = codes.astype(np.int8).reshape(weights.shape)
    offsets = low + shift * step
    return integers, stored[..., 0].astype(np.float32), offsets[..., 0].astype(np.float32)


def four_bit_source(weights, tolerance=1e-5):
    """Whether every block of `INT4_BLOCK` along the last axis of `weights` holds at most 16
    evenly spaced values: a GGUF source of 4 bits (Q4_0, Q4_1, Q4_K), whose blocks int4 keeps."""
    return _every_row_a_grid(weights, INT4_BLOCK, 15, tolerance)


def finer_source(weights, tolerance=1e-5):
    """Whether every block of 16 along the last axis of `weights` holds at most 256 evenly
    spaced values: a GGUF source of up to 8 bits (Q5_0, Q6_K, Q8_0; the 4-bit ones too). Float
    weights, bfloat16 ones included, hold no such grid."""
    return _every_row_a_grid(weights, 16, 255, tolerance)


def _every_row_a_grid(weights, block, most, tolerance):
    """Whether `_grid` fits every block of `block` values of `weights`, a chunk of rows at a time."""
    chunks = _row_chunks(weights)
    return bool(chunks) and all(_grid(rows, block, most, tolerance) is not None for rows in chunks)


def _row_chunks(weights):
    """`weights` `(rows, inputs)` cut into consecutive rows of about `_CHUNK_VALUES` values:
    `_grid` holds several float64 arrays of its input's size, gigabytes for a whole token table."""
    rows = max(1, _CHUNK_VALUES // max(1, weights.shape[-1]))
    return [weights[start : start + rows] for start in range(0, len(weights), rows)]


def _grid(weights, block, most, tolerance):
    """`(blocks, low, levels, step, flat)` when every block of `block` along the last axis of
    `weights` is `low + step * levels` with integer levels in [0, most] (float64, `(rows, n,
    block)`, the rest `(rows, n, 1)`; `flat`: blocks of one value); else None."""
    rows, inputs = weights.shape
    if inputs % block or rows == 0:
        return None
    # C order: the loop below writes through flat views of `levels` and `step`.
    blocks = np.ascontiguousarray(weights, np.float64).reshape(rows, inputs // block, block)
    low = blocks.min(-1, keepdims=True)
    span = blocks.max(-1, keepdims=True) - low
    scale = np.maximum(np.abs(blocks).max(-1, keepdims=True), np.finfo(np.float32).tiny)
    flat = span == 0
    levels, step = np.zeros(blocks.shape), np.ones(span.shape)
    flat_blocks, flat_low, flat_span, flat_scale = (x.reshape(-1, x.shape[-1]) for x in (blocks, low, span, scale))
    flat_levels, flat_step = levels.reshape(-1, block), step.reshape(-1, 1)
    todo = np.flatnonzero(~flat.ravel())
    # Most blocks of a 4-bit source use all 16 levels: their step is the span over them, found
    # without sorting every block (most of the time this took, at 1.5B parameters). A finer
    # source's blocks seldom span all their levels.
    if most <= 15 and todo.size:
        values, lows, candidate_step = flat_blocks[todo], flat_low[todo], flat_span[todo] / most
        candidate = np.rint((values - lows) / candidate_step)
        fits = np.all(np.abs(values - (lows + candidate * candidate_step)) <= tolerance * flat_scale[todo], -1)
        fitted, candidate = candidate[fits], None
        # The coarsest grid, as below: levels 0, 6 and 15 are 0, 2 and 5 of a step 3 times larger.
        coarsest = fitted / np.gcd.reduce(fitted.astype(np.int64), axis=-1, keepdims=True)
        flat_levels[todo[fits]] = coarsest
        flat_step[todo[fits]] = flat_span[todo[fits]] / coarsest.max(-1, keepdims=True)
        todo = todo[~fits]
        del values, lows, fitted, coarsest
    if not todo.size:
        return blocks, low, levels, step, flat
    # The rest: the step is the smallest gap, or a fraction of it where no two values are
    # neighbours, tried on the blocks not yet fitted.
    values = flat_blocks[todo]
    gaps = np.diff(np.sort(values, -1), axis=-1)
    gaps[gaps <= tolerance * flat_span[todo]] = np.inf
    flat_gap = np.ones((len(flat_blocks), 1))
    flat_gap[todo] = gaps.min(-1, keepdims=True)
    del gaps, values
    for parts in range(1, most + 1):
        if not todo.size:
            break
        values, lows = flat_blocks[todo], flat_low[todo]
        candidate = np.rint((values - lows) / (flat_gap[todo] / parts))
        # The span over the most levels holds one float32 rounding; the smallest gap, two.
        candidate_step = flat_span[todo] / np.maximum(candidate.max(-1, keepdims=True), 1)
        fits = (candidate.max(-1) <= most) & np.all(
            np.abs(values - (lows + candidate * candidate_step)) <= tolerance * flat_scale[todo], -1
        )
        flat_levels[todo[fits]], flat_step[todo[fits]] = candidate[fits], candidate_step[fits]
        todo = todo[~fits]
        if parts == 1 and todo.size > max(16, len(flat_blocks) // 2):  # no grid: most grids have neighbours
            return None
    if todo.size:
        return None
    return blocks, low, levels, step, flat


def _recoverable(codes):
    """Per block of integer `codes`, whether ai-edge-quantizer's dequantized-weight recovery gets
    them back exactly: it takes the smallest positive gap between the sorted magnitudes, 0
    included, as the step. Which depends only on the set of magnitudes: looked up by its bit mask
    where every magnitude is under 16 (`source_blocks`' codes), instead of sorting each block."""
    magnitudes = np.abs(codes)
    if magnitudes.size and magnitudes.max() < 16:
        masks = np.bitwise_or.reduce(np.left_shift(1, magnitudes, dtype=np.int32), axis=-1, keepdims=True)
        return _RECOVERABLE_MASKS[masks]
    return _recoverable_sorted(magnitudes)


def _recoverable_sorted(magnitudes):
    """`_recoverable` of the magnitudes of blocks of integer codes, by sorting each block."""
    magnitudes = np.sort(np.concatenate([magnitudes, np.zeros_like(magnitudes[..., :1])], -1), -1)
    gaps = np.diff(magnitudes, axis=-1).astype(np.float64)
    gaps[gaps == 0] = np.inf
    step = gaps.min(-1, keepdims=True)
    step[~np.isfinite(step)] = 1
    return np.all(magnitudes % step == 0, -1, keepdims=True)


# `_recoverable` of every set of magnitudes under 16, by its bit mask (bit m: magnitude m present).
_RECOVERABLE_MASKS = _recoverable_sorted(
    np.where((np.arange(1 << 16)[:, None] >> np.arange(16)) & 1, np.arange(16), 0)
)[:, 0]


def int4_problem(model):
    """Why `model`'s weights cannot be cut into int4 blocks, or None: every input dimension of
    its weight matrices (the width, the feed-forward width and the heads' width) must be a
    multiple of `INT4_BLOCK`."""
    backbone = model.backbone
    dimensions = {
        "hidden_dim": backbone.hidden_dim,
        "intermediate_dim": backbone.intermediate_dim,
        "num_heads x head_dim": backbone.num_heads * backbone.head_dim,
    }
    bad = {name: size for name, size in dimensions.items() if size % INT4_BLOCK}
    if not bad:
        return None
    sizes = ", ".join(f"{name} = {size}" for name, size in bad.items())
    return f"its weights are cut into blocks of {INT4_BLOCK}, and {sizes} is not a multiple of {INT4_BLOCK}"
