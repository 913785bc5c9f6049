"""A decoder converted from placeholders (`kzoo.export.tflite.placeholders`) is the file the
converter makes from the weights themselves: LiteRT's logits agree bit for bit, in every family,
while the converter holds one block's weights per kind of block and a small vocabulary."""

import io

import keras
import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter

from kzoo import models
from kzoo.checkpoints.families import FAMILIES
from kzoo.export import litertlm_model
from kzoo.export import memory
from kzoo.export.litertlm import RuntimeSignatures
from kzoo.export.tflite import graph_passes
from kzoo.export.tflite import placeholders
from kzoo.export.tflite import quantize
from kzoo.export.tflite import repeated_blocks
from kzoo.export.tflite.convert import convert
from tests.export.tiny_models import build
from tests.export.tiny_models import redraw
from tests.models.tiny_models import decoder_backbone

CACHE_LENGTH = 16
# Gemma 3: two kinds of block (sliding and global), QK-norm, a logit soft cap the converter
# divides the head's table by; Qwen 2: biases, three blocks of one kind.
FAST = ("gemma3_text", "qwen2")


def decoder(family, vocabulary_size, layers=None, **sizes):
    """A tiny decoder of `family` (three blocks, Gemma's two, or `layers`), every weight drawn: the
    norms' scales too, which the converter would fold into the next weights if it were let (a
    product no placeholder stands for)."""
    layers = layers or (2 if family.startswith("gemma") else 3)
    tied = family == "gemma3_text"  # a tied table, the others an untied head
    backbone = decoder_backbone(family, layers, vocab_size=vocabulary_size, tie_word_embeddings=tied, **sizes)
    lm = redraw(models.CausalLM(backbone))
    rng = np.random.default_rng(1)
    for weight in lm.weights:
        if len(weight.shape) == 1:
            weight.assign(1.0 + rng.normal(0.0, 0.2, weight.shape).astype("float32"))
    return lm


def weights_converted(lm):
    """The file the converter makes from the weights themselves, its norms' scales kept as ops."""
    return convert(RuntimeSignatures(lm, CACHE_LENGTH), "tflite_fp32", fuse_scales=False)


def decode_logits(flatbuffer, vocabulary_size):
    row = np.random.default_rng(0).integers(1, vocabulary_size, 12)
    return litertlm_model.teacher_forced_logits(flatbuffer, row, 2)


def converted(lm, record=None):
    """`placeholders.converted` of `lm`'s runtime signatures; `record` gets the converter's file size."""
    original = placeholders.convert

    def spy(signatures, tflite_format, **kwargs):
        flatbuffer = original(signatures, tflite_format, **kwargs)
        if record is not None:
            record.append(len(flatbuffer))
        return flatbuffer

    placeholders.convert = spy
    try:
        return placeholders.converted(lm, lambda: RuntimeSignatures(lm, CACHE_LENGTH), (CACHE_LENGTH,))
    finally:
        placeholders.convert = original


@pytest.mark.parametrize(
    "family", [pytest.param(family, marks=[] if family in FAST else pytest.mark.slow) for family in FAMILIES]
)
@pytest.mark.parametrize("vocabulary_size", [300, 5000])  # the second above the stand-in vocabulary
def test_the_file_is_the_one_converted_from_the_weights(family, vocabulary_size):
    if FAMILIES[family].text_family is not None:
        pytest.skip("a multimodal family exports its text decoder (the text family's test)")
    lm = decoder(family, vocabulary_size)
    expected = decode_logits(weights_converted(lm), vocabulary_size)
    sizes = []
    logits = decode_logits(converted(lm, sizes), vocabulary_size)
    np.testing.assert_array_equal(logits, expected)
    if vocabulary_size == 5000:  # the converter held the stand-in vocabulary, not 5,000 rows
        assert placeholders.Placeholders(lm, (CACHE_LENGTH,)).stand_in_vocabulary < 1000


def test_the_converter_holds_one_block_per_kind_and_a_small_table():
    lm = redraw(models.CausalLM(decoder_backbone("llama", num_hidden_layers=6, vocab_size=20_000)))
    stand_ins = placeholders.Placeholders(lm, (CACHE_LENGTH,))
    block = sum(int(np.prod(v.shape)) for v in lm.backbone.transformer_blocks[0].weights)
    table = stand_ins.stand_in_vocabulary * lm.backbone.hidden_dim
    held = sum(int(np.prod(p.variable.shape)) for p in stand_ins.placeholders)
    assert held == block + table
    sizes = []
    flatbuffer = converted(lm, sizes)
    assert sizes[0] < len(flatbuffer) / 5  # the converter's file, beside the one written
    assert len(flatbuffer) > 4 * lm.count_params()  # every weight in float32


def test_weights_after_the_flatbuffer_at_offsets_load_in_litert():
    lm = build("gpt", vocabulary_size=128, max_sequence_length=32)
    stand_ins = placeholders.Placeholders(lm, (CACHE_LENGTH,))
    with stand_ins:  # the signatures are traced when converted
        small = convert(RuntimeSignatures(lm, CACHE_LENGTH), "tflite_fp32", fuse_scales=False)
    model, readers = placeholders.resolve(small, stand_ins)
    file = io.BytesIO()
    written = graph_passes.write(file, model, readers)
    data = file.getvalue()
    assert written == len(data) and all(model.buffers[i].offset % 64 == 0 for i in readers)
    assert min(model.buffers[i].offset for i in readers) > 1
    expected = decode_logits(weights_converted(lm), 128)
    np.testing.assert_array_equal(decode_logits(data, 128), expected)


def test_a_fold_it_cannot_map_is_refused():
    lm = decoder("llama", 300)
    stand_ins = placeholders.Placeholders(lm, (CACHE_LENGTH,))
    blocks = [p for p in stand_ins.placeholders if p.kind is not None]
    matrix = max(blocks, key=lambda p: int(np.prod(p.variable.shape)))
    stand_in = np.asarray(matrix.variable.numpy()).reshape(-1)
    assert placeholders._source(stand_in, stand_ins).index.tolist() == list(range(stand_in.size))
    assert placeholders._source(stand_in / np.float32(6.0), stand_ins).fold[1] == np.float32(6.0)
    # Gemma's norms scale by `1 + w`, which the converter folds: the vectors' values are the
    # lowest, where adding 1 changes every one of them.
    vector = np.asarray(stand_ins.placeholders[0].variable.numpy())
    assert vector.ndim == 1 and vector.max() < 2.0**21
    source = placeholders._source(vector + np.float32(1.0), stand_ins)
    assert source.fold == (np.add, np.float32(1.0)) and source.placeholder is stand_ins.placeholders[0]
    with pytest.raises(ValueError, match="cannot map back"):
        placeholders._source(np.sqrt(stand_in), stand_ins)  # no transpose, reshape or scalar
    ones = np.ones(stand_in.size, np.float32)  # close to proportional, yet no fold
    assert placeholders._source(ones, stand_ins) is None


@pytest.mark.parametrize("conversion", [quantize.INT8, quantize.INT4])
def test_a_file_with_weights_at_offsets_quantizes_as_one_without(conversion):
    # Past 2 GB (a float32 0.5B model) the weights can only be stored after the flatbuffer: the
    # quantizer and kzoo's passes before it read them there.
    lm = decoder("qwen2", 300, hidden_size=64, intermediate_size=64)  # int4 blocks of 32 inputs
    inline = weights_converted(lm)
    model = graph_passes.unpacked(inline)
    large = {i: (lambda d=b.data: d) for i, b in enumerate(model.buffers) if b.data is not None and len(b.data) >= 1024}
    file = io.BytesIO()
    graph_passes.write(file, model, large)
    outside = file.getvalue()
    assert len(large) > 10 and graph_passes.unpacked(outside).buffers[max(large)].data is not None
    expected = decode_logits(quantize.quantize(inline, conversion), 300)
    np.testing.assert_array_equal(decode_logits(quantize.quantize(outside, conversion), 300), expected)


def test_the_stand_in_vocabulary_is_a_prime_above_the_graph_s_sizes_not_the_context():
    lm = models.CausalLM(decoder_backbone("llama", vocab_size=50_000, max_position_embeddings=32_768))
    stand_in = placeholders.Placeholders(lm, (64, 16)).stand_in_vocabulary
    sizes = [lm.backbone.hidden_dim, lm.backbone.intermediate_dim, 64]
    assert 2 * max(sizes) < stand_in < 4 * max(sizes)
    assert all(stand_in % d for d in range(2, stand_in))


@pytest.mark.parametrize("at_offsets", [False, True])
def test_a_file_written_to_a_path_is_the_one_returned(tmp_path, monkeypatch, at_offsets):
    lm = build("gpt", vocabulary_size=128, max_sequence_length=32)
    if at_offsets:  # a limit the weights reach: they are stored after the flatbuffer
        monkeypatch.setattr(graph_passes, "FLATBUFFER_LIMIT", memory.float32_weight_bytes(lm))
    trace = lambda: RuntimeSignatures(lm, CACHE_LENGTH)  # noqa: E731
    flatbuffer = placeholders.converted(lm, trace, (CACHE_LENGTH,))
    assert placeholders.converted(lm, trace, (CACHE_LENGTH,), path=tmp_path / "model.tflite") is None
    assert (tmp_path / "model.tflite").read_bytes() == flatbuffer
    model = schema.Model.GetRootAs(flatbuffer, 0)
    offsets = [model.Buffers(i).Offset() > 1 for i in range(model.BuffersLength())]
    assert any(offsets) == at_offsets


def signature_outputs(flatbuffer, vocabulary_size):
    """Every signature's outputs on the same drawn inputs: `{signature: {output: array}}`."""
    rng, outputs = np.random.default_rng(0), {}
    interpreter = Interpreter(model_content=flatbuffer)
    for name in sorted(interpreter.get_signature_list()):
        runner = interpreter.get_signature_runner(name)
        details = runner.get_input_details()
        inputs = {"tokens": rng.integers(0, vocabulary_size, details["tokens"]["shape"], dtype=np.int32)}
        inputs["input_pos"] = np.arange(8, 8 + details["input_pos"]["shape"][0], dtype=np.int32)
        for cache in sorted(details):
            if cache.startswith("kv_cache_"):
                inputs[cache] = rng.normal(size=details[cache]["shape"]).astype(np.float32)
        outputs[name] = runner(**inputs)
    return outputs


@pytest.mark.parametrize(
    "family",
    [pytest.param(family, marks=[] if family == "qwen2" else pytest.mark.slow) for family in FAMILIES],
)
def test_a_deep_decoder_converts_a_few_blocks_and_repeats_them(family, monkeypatch):
    """Twelve blocks (SmolLM3, whose kinds repeat every four, twenty): the converter sees a few
    (`repeated_blocks.plan`), the file holds their copies, and every signature (the cache's spans and
    the checks' one included) computes bit for bit what the file converted from every block's
    weights does."""
    if FAMILIES[family].text_family is not None:
        pytest.skip("a multimodal family exports its text decoder (the text family's test)")
    layers = 12 if family != "smollm3" else 20
    lm = decoder(family, 300, layers=layers, max_position_embeddings=64)
    stand_ins = placeholders.Placeholders(lm, (64,))
    assert stand_ins.repetition is not None and stand_ins.repetition.converted < layers
    trace = lambda: RuntimeSignatures(lm, 64, spans="auto", check_length=16)  # noqa: E731
    seen, original = [], placeholders.convert

    def spy(signatures, tflite_format, **kwargs):
        flatbuffer = original(signatures, tflite_format, **kwargs)
        seen.append(Interpreter(model_content=flatbuffer).get_signature_runner("decode").get_input_details())
        return flatbuffer

    monkeypatch.setattr(placeholders, "convert", spy)
    repeated = placeholders.converted(lm, trace, (64, 16, 32))
    assert len(seen) == 1 and len([n for n in seen[0] if n.startswith("kv_cache_")]) < 2 * layers
    whole = convert(trace(), "tflite_fp32", fuse_scales=False)
    assert graph_passes.op_census(repeated) == graph_passes.op_census(whole)
    expected, outputs = signature_outputs(whole, 300), signature_outputs(repeated, 300)
    assert sorted(outputs) == sorted(expected) == ["decode", "prefill_16", "prefill_64", "teacher_forced"]
    for name in expected:
        assert sorted(outputs[name]) == sorted(expected[name])
        for key in expected[name]:
            np.testing.assert_array_equal(outputs[name][key], expected[name][key], err_msg=f"{name} {key}")
    model = schema.ModelT.InitFromPackedBuf(repeated, 0)
    for subgraph in model.subgraphs:  # the quantizer keys tensors by name
        names = [tensor.name for tensor in subgraph.tensors]
        assert len(set(names)) == len(names)


def test_blocks_that_do_not_repeat_are_converted_whole(monkeypatch):
    """Told that Gemma 3's sliding and global blocks are of one kind, the copies would be of the
    wrong blocks: the converted blocks fail their check against the period before (another mask),
    and every block is converted instead."""
    lm = decoder("gemma3_text", 300, layers=6, max_position_embeddings=64)
    monkeypatch.setattr(placeholders, "_without_names", lambda config: "one kind")
    assert placeholders.Placeholders(lm, (64,)).repetition.period == 1
    raised, original = [], repeated_blocks.repeated

    def spy(*args):
        try:
            return original(*args)
        except repeated_blocks.NotRepeated as error:
            raised.append(error)
            raise

    monkeypatch.setattr(repeated_blocks, "repeated", spy)
    trace = lambda: RuntimeSignatures(lm, 64)  # noqa: E731
    flatbuffer = placeholders.converted(lm, trace, (64,))
    assert len(raised) == 1
    expected, outputs = (
        signature_outputs(convert(trace(), "tflite_fp32", fuse_scales=False), 300),
        signature_outputs(flatbuffer, 300),
    )
    for name in expected:
        for key in expected[name]:
            np.testing.assert_array_equal(outputs[name][key], expected[name][key])


def test_blocks_with_a_scalar_weight_are_all_converted():
    """A scalar weight is converted as it is, not as a placeholder: copies of a block would hold
    its value in every block, so no block is copied."""
    lm = decoder("llama", 300, layers=12)
    assert placeholders.Placeholders(lm, (CACHE_LENGTH,)).repetition is not None
    for block in lm.backbone.transformer_blocks:  # as a layer built with one would hold it
        object.__setattr__(block.feed_forward, "gain", keras.Variable(1.0))
    assert placeholders.Placeholders(lm, (CACHE_LENGTH,)).repetition is None
