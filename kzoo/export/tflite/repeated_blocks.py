"""A decoder's file from a conversion of a few of its blocks: the last converted blocks repeated.

TensorFlow's converter takes about a second per block and signature, on top of what it takes for
the weights (a 28-layer 1.5B decoder's five signatures: six minutes). Blocks of one kind convert
to the same ops, so `kzoo.export.tflite.placeholders` converts `plan(...).converted` blocks (the
first ones and the last: a prefill drops most of the last block, whose output nothing reads) and
`repeated` writes the rest into each signature's subgraph as copies of the converted blocks,
each copy reading the previous one's outputs and its own layer's cache. Every weight of a
block is a placeholder shared by its kind's blocks, so a copy uses the same constants as the
block it copies and `placeholders.resolve` gives each use its block's weights, in the order the
ops run.

An op belongs to the latest block among what it reads (a block's weights, a layer's cache,
another op's output); an op of no block (the positions' masks and rotations) is shared. The
copies follow a period of converted blocks, checked op for op against the period before it
(the same ops, options and shapes, reading the same shared tensors and the same blocks back);
a file that does not repeat (`NotRepeated`) is converted whole instead.
"""

import dataclasses
import re

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from kzoo.export.tflite import graph_passes

_CACHE_NAME = re.compile(r"^kv_cache_([kv])_(\d+)$")


class NotRepeated(ValueError):
    """The converted blocks do not repeat as `repeated` needs."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """Convert the blocks `traced` (indices of the model's blocks), repeat them to `layers` blocks.

    The blocks' kinds repeat every `period` blocks (from some block on); the converted blocks are
    the first `converted - 1` (those before the repetition, then a period to warm up with, one to
    check against and one to repeat) and the last block."""

    layers: int
    period: int
    converted: int

    @property
    def traced(self):
        return [*range(self.converted - 1), self.layers - 1]


def plan(kinds):
    """The `Plan` for blocks of `kinds` (one hashable per block, equal for blocks that convert to
    the same ops) that converts the fewest, or None where converting a few would save nothing.

    Example:

    >>> plan(["full"] * 28)  # Qwen2.5-Coder-1.5B: blocks 0-3 and 27 converted
    Plan(layers=28, period=1, converted=5)
    >>> plan(["full"] + ["sliding"] * 23).traced  # the first block of its own kind
    [0, 1, 2, 3, 4, 23]
    >>> print(plan((["sliding"] * 5 + ["full"]) * 3))  # Gemma 3 270M: every block converted
    None
    """
    layers, best = len(kinds), None
    for period in range(1, layers):
        start = layers - period  # the repetition's first block
        while start > 0 and kinds[start - 1] == kinds[start - 1 + period]:
            start -= 1
        converted = start + 3 * period + 2
        converted += (layers - converted) % period  # the last block of the same kind as the model's
        if converted < layers and (best is None or converted < best.converted):
            best = Plan(layers, period, converted)
    return best


def repeated(model, repetition, weight_blocks, block_names):
    """Repeats `model`'s converted blocks (a `schema.ModelT` of the `repetition.traced` blocks)
    to `repetition.layers` blocks in every signature's subgraph, in place.

    Args:
        model: the converted file, unpacked.
        repetition: its `Plan`.
        weight_blocks: `{buffer index: [converted block of each use, in the order the ops run]}`
            for every buffer of a block's weight (a placeholder shared by the blocks of a kind).
        block_names: the model's blocks' names: a copy's tensors take its block's name where
            they have the block's it copies.

    Raises:
        NotRepeated: where the converted blocks do not repeat (see the module docstring).
    """
    for signature in model.signatureDefs or []:
        _Subgraph(model, signature, repetition, weight_blocks, block_names).repeat()


class _Subgraph:
    """One signature's subgraph: each op's block (its label), and the copies `repeat` adds."""

    def __init__(self, model, signature, repetition, weight_blocks, block_names):
        self.model, self.signature, self.plan = model, signature, repetition
        self.subgraph = model.subgraphs[signature.subgraphIndex]
        self.names = block_names
        self.last = repetition.converted - 1  # the converted last block (with the head's ops after it)
        self.first = self.last - repetition.period  # the period repeated
        self.cache = {}  # tensor -> (k or v, converted layer)
        for entry in signature.inputs:
            match = _CACHE_NAME.match(entry.name.decode())
            if match:
                self.cache[entry.tensorIndex] = (match[1], int(match[2]))
        self.producer = {}  # tensor -> (op index, output slot)
        self.labels, uses = [], {}
        for i, op in enumerate(self.subgraph.operators):
            label = -1
            for index in op.inputs:
                if index < 0:
                    continue
                if index in self.producer:
                    label = max(label, self.labels[self.producer[index][0]])
                elif index in self.cache:
                    label = max(label, self.cache[index][1])
                else:
                    buffer = self.subgraph.tensors[index].buffer
                    if buffer in weight_blocks:
                        use = uses.get(buffer, 0)
                        uses[buffer] = use + 1
                        if use >= len(weight_blocks[buffer]):
                            raise NotRepeated("A block's weight is used more often than its kind has blocks.")
                        label = max(label, weight_blocks[buffer][use])
            self.labels.append(label)
            for slot, index in enumerate(op.outputs):
                self.producer[index] = (i, slot)
        self.weights = set(weight_blocks)
        self.segments = [[i for i, label in enumerate(self.labels) if label == s] for s in range(repetition.converted)]
        self.position = {i: r for segment in self.segments for r, i in enumerate(segment)}

    def where(self, index):
        """What the tensor `index` is: ("op", block, position in it, slot), ("cache", k/v,
        layer), ("weight", buffer), or ("shared", index)."""
        if index in self.producer:
            i, slot = self.producer[index]
            if self.labels[i] >= 0:
                return ("op", self.labels[i], self.position[i], slot)
        elif index in self.cache:
            return ("cache", *self.cache[index])
        elif self.subgraph.tensors[index].buffer in self.weights:
            return ("weight", self.subgraph.tensors[index].buffer)
        return ("shared", index)

    def repeat(self):
        plan, ops, first, last = self.plan, self.subgraph.operators, self.first, self.last
        inside = [i for i, label in enumerate(self.labels) if 0 <= label < last]
        if not inside:
            raise NotRepeated("No op of the converted blocks but the last.")
        cut = max(inside) + 1
        if any(label == last for label in self.labels[:cut]):
            raise NotRepeated("The last block's ops run among the others'.")
        for block in range(first, last):
            self._check(block, block - plan.period)
        self.tensors = {}  # (block, position, slot) -> tensor, for the copies
        # (k/v, block) -> tensor; the converted last block is the model's
        self.cache_inputs = {
            (kind, plan.layers - 1 if layer == last else layer): index for index, (kind, layer) in self.cache.items()
        }
        added_inputs, added_outputs = [], []
        outputs = {entry.tensorIndex: entry.name for entry in self.signature.outputs}
        copies = []
        for block in range(last, plan.layers - 1):
            template = first + (block - last) % plan.period
            for i in self.segments[template]:
                op = graph_passes.copied(ops[i])
                inputs = [self._input(index, template, block, added_inputs) for index in ops[i].inputs]
                op.inputs = np.array(inputs, np.int32)
                new_outputs = []
                for slot, index in enumerate(ops[i].outputs):
                    tensor = graph_passes.copied(self.subgraph.tensors[index])
                    tensor.name = self._renamed(tensor.name, template, block)
                    self.subgraph.tensors.append(tensor)
                    new = len(self.subgraph.tensors) - 1
                    self.tensors[(block, self.position[i], slot)] = new
                    new_outputs.append(new)
                    if index in outputs:
                        added_outputs.append((_renamed_layer(outputs[index], template, block), new))
                op.outputs = np.array(new_outputs, np.int32)
                copies.append(op)
        for i in range(cut, len(ops)):
            if self.labels[i] == last:
                inputs = [self._input(index, last, plan.layers - 1) for index in ops[i].inputs]
                ops[i].inputs = np.array(inputs, np.int32)
        self.subgraph.operators = [*ops[:cut], *copies, *ops[cut:]]
        for entry in [*self.signature.inputs, *self.signature.outputs]:
            match = _CACHE_NAME.match(entry.name.decode())
            if match and int(match[2]) == last:
                entry.name = _renamed_layer(entry.name, last, plan.layers - 1)
                tensor = self.subgraph.tensors[entry.tensorIndex]
                tensor.name = _renamed_layer(tensor.name, last, plan.layers - 1)
        self.subgraph.inputs = np.array([*self.subgraph.inputs, *(index for _, index in added_inputs)], np.int32)
        self.subgraph.outputs = np.array([*self.subgraph.outputs, *(index for _, index in added_outputs)], np.int32)
        self.signature.inputs = _entries(self.signature.inputs, added_inputs)
        self.signature.outputs = _entries(self.signature.outputs, added_outputs)
        _unique_names(self.subgraph)

    def _input(self, index, block, into, added_inputs=None):
        """The tensor a copy for block `into` of converted block `block`'s op reads for `index`."""
        if index < 0:
            return index
        where = self.where(index)
        if where[0] == "op":
            _, source, position, slot = where
            target = into - (block - source)
            if target == into and block == self.last:
                return index  # the last block's own ops
            if target != source and source < self.first - self.plan.period:
                # Ops are matched by their place in a block: checked for the last two periods only.
                raise NotRepeated("A block reads a block further back than the periods checked.")
            if target < self.last:
                return self.subgraph.operators[self.segments[target][position]].outputs[slot]
            return self.tensors[(target, position, slot)]
        if where[0] == "cache":
            _, kind, layer = where
            target = into - (block - layer)
            if (kind, target) not in self.cache_inputs:
                tensor = graph_passes.copied(self.subgraph.tensors[index])
                tensor.name = _renamed_layer(tensor.name, layer, target)
                self.subgraph.tensors.append(tensor)
                self.cache_inputs[(kind, target)] = len(self.subgraph.tensors) - 1
                added_inputs.append((f"kv_cache_{kind}_{target}".encode(), len(self.subgraph.tensors) - 1))
            return self.cache_inputs[(kind, target)]
        return index

    def _check(self, block, earlier):
        """Raises NotRepeated unless converted block `block`'s ops are `earlier`'s, reading the
        same shared tensors and weights and the blocks as far back."""
        ops, tensors = self.subgraph.operators, self.subgraph.tensors
        mine, theirs = self.segments[block], self.segments[earlier]
        if len(mine) != len(theirs):
            raise NotRepeated(f"Converted blocks {earlier} and {block} have {len(theirs)} and {len(mine)} ops.")
        for i, j in zip(mine, theirs):
            a, b = ops[i], ops[j]
            same = (
                a.opcodeIndex == b.opcodeIndex
                and a.builtinOptionsType == b.builtinOptionsType
                and _same(a.builtinOptions, b.builtinOptions)
                and _same(a.customOptions, b.customOptions)
                and len(a.inputs) == len(b.inputs)
                and len(a.outputs) == len(b.outputs)
                and all(_same_tensor(tensors[x], tensors[y]) for x, y in zip(a.outputs, b.outputs))
                and all(self._same_input(x, y, block, earlier) for x, y in zip(a.inputs, b.inputs))
            )
            if not same:
                raise NotRepeated(f"Converted blocks {earlier} and {block} differ at their op {self.position[i]}.")

    def _same_input(self, x, y, block, earlier):
        if x < 0 or y < 0:
            return x == y
        a, b = self.where(x), self.where(y)
        if a[0] != b[0]:
            return False
        if a[0] == "op":
            return block - a[1] == earlier - b[1] and a[2:] == b[2:]
        if a[0] == "cache":
            return a[1] == b[1] and block - a[2] == earlier - b[2]
        if a[0] == "weight":
            return a[1] == b[1]
        if x == y:
            return True
        tensors, buffers = self.subgraph.tensors, self.model.buffers
        return (
            x not in self.producer
            and y not in self.producer
            and _same_tensor(tensors[x], tensors[y])
            and buffers[tensors[x].buffer].data is not None
            and _same(buffers[tensors[x].buffer].data, buffers[tensors[y].buffer].data)
        )

    def _renamed(self, name, block, into):
        """A copy's tensor name: converted block `block`'s block name made `into`'s."""
        old, new = self.names[self.plan.traced[block]], self.names[into]
        renamed = re.sub(re.escape(old) + r"(?![0-9])", new, name.decode())
        return (renamed if renamed != name.decode() else f"{renamed};{new}").encode()


def _renamed_layer(name, layer, into):
    """`name` (bytes: a signature entry's or a tensor's) with layer `layer`'s cache made `into`'s."""
    return re.sub(rf"(kv_cache_[kv]_){layer}(?![0-9])", rf"\g<1>{into}", name.decode()).encode()


def _entries(entries, added):
    """A signature's inputs or outputs with `added` (name bytes, tensor), sorted by name as the converter's."""
    more = []
    for name, index in added:
        entry = schema.TensorMapT()
        entry.name, entry.tensorIndex = name, index
        more.append(entry)
    return sorted([*entries, *more], key=lambda entry: entry.name)


def _unique_names(subgraph):
    """Tensor names made unique within the subgraph (ai-edge-quantizer keys tensors by name)."""
    seen = set()
    for number, tensor in enumerate(subgraph.tensors):
        if tensor.name in seen:
            tensor.name = tensor.name + f";{number}".encode()
        seen.add(tensor.name)


def _same_tensor(a, b):
    return (
        a.type == b.type
        and _same(a.shape, b.shape)
        and _same(a.shapeSignature, b.shapeSignature)
        and _same(a.quantization, b.quantization)
    )


def _same(a, b):
    """Equal schema values: options objects field by field, arrays element by element."""
    if a is None or b is None:
        return a is b
    if isinstance(a, (list, np.ndarray)) or isinstance(b, (list, np.ndarray)):
        return np.array_equal(np.asarray(a), np.asarray(b))
    if hasattr(a, "__dict__"):
        return type(a) is type(b) and all(_same(value, getattr(b, name)) for name, value in vars(a).items())
    return a == b
