"""The Llama lineage from and to Hugging Face folders, against `transformers` on the same weights.

Each family is a tiny random checkpoint that `transformers` writes itself (`hf_folders.DECODERS`):
Llama with Llama 3's RoPE scaling and biases, a tied Llama, Mistral, Qwen2 and Gemma 2 / Gemma 3
with windows of 4 tokens (so that 12-token inputs reach past them), Qwen3 with QK-norm and a
head size of its own, Gemma, Gemma 2's soft-capping and Gemma 3's two RoPE bases and four norms.
"""

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

import kzoo
from kzoo.checkpoints import families
from kzoo.checkpoints import tensor_maps
from kzoo.checkpoints.errors import CheckpointError
from kzoo.checkpoints.families import TINY_BASE
from tests.models import hf_folders

FAMILIES = list(hf_folders.DECODERS)
# float32: the largest logits here are 1 to 6.
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """`{name: (folder, transformers model)}` for every family."""
    root = tmp_path_factory.mktemp("decoders")
    return {name: (root / name, hf_folders.write_decoder(root / name, name)) for name in FAMILIES}


def load(folder, cls=kzoo.models.CausalLM, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls.from_preset(str(folder), **kwargs)


def batch(seed=0, length=12):
    ids = np.random.default_rng(seed).integers(1, TINY_BASE["vocab_size"], (2, length)).astype("int32")
    mask = np.ones_like(ids)
    mask[1, length - 3 :] = 0
    return ids, mask


def reference_logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask)).logits.numpy()


@pytest.mark.parametrize("name", FAMILIES)
def test_logits_match_transformers(folders, name):
    folder, reference = folders[name]
    lm = load(folder, tokenizer=None)
    assert lm.backbone.model_type == json.loads((folder / "config.json").read_text())["model_type"]
    ids, mask = batch()
    ours = np.asarray(lm({"token_ids": ids, "padding_mask": mask}))
    theirs = reference_logits(reference, ids, mask)
    np.testing.assert_allclose(ours[mask == 1], theirs[mask == 1], atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_decoding_matches_transformers_past_the_window(folders, name):
    """Cached decoding, 5 prompt tokens then 11 new ones: past every sliding window (4)."""
    folder, reference = folders[name]
    lm = load(folder, tokenizer=None)
    prompt = batch(seed=1)[0][0, :5]
    ours = lm.generate([prompt.tolist()], max_new_tokens=11, jit_compile=False)[0]
    with torch.no_grad():
        theirs = reference.generate(
            torch.tensor(prompt[None], dtype=torch.long), max_new_tokens=11, do_sample=False, eos_token_id=None
        )
    assert ours == theirs[0].tolist()


@pytest.mark.parametrize("name", FAMILIES)
def test_the_tensor_map_covers_every_tensor_and_every_weight(folders, name):
    from safetensors import safe_open

    folder, _ = folders[name]
    lm = load(folder, tokenizer=None)
    family = tensor_maps.FAMILIES[lm.backbone.model_type]
    maps = [("model.", m) for m in family.backbone_tensors(lm.backbone)]
    maps += [("", m) for m in family.heads["CausalLM"].tensors(lm)]
    names = [prefix + name for prefix, m in maps for name in m.names]
    with safe_open(str(folder / "model.safetensors"), "numpy") as file:
        stored = set(file.keys())
        assert len(names) == len(set(names)) and set(names) == stored
        for prefix, m in maps:
            current = [w.numpy() for w in m.weights]
            for tensor_name, tensor in zip(m.names, m.to_hf(current)):
                np.testing.assert_array_equal(tensor, file.get_tensor(prefix + tensor_name), err_msg=tensor_name)
    weights = [id(w) for _, m in maps for w in m.weights]
    assert len(weights) == len(set(weights)) and set(weights) == {id(w) for w in lm.weights}


@pytest.mark.parametrize("name", FAMILIES)
def test_written_back_transformers_loads_the_same_logits(tmp_path, folders, name):
    folder, _ = folders[name]
    lm = load(folder, tokenizer=None)
    lm.export_to_transformers(tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == name.removesuffix("_tied")
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids, mask = batch(seed=2)
    ours = np.asarray(lm({"token_ids": ids, "padding_mask": mask}))
    np.testing.assert_allclose(ours[mask == 1], reference_logits(again, ids, mask)[mask == 1], atol=TOLERANCE, rtol=0)


def test_a_backbone_alone_reads_and_writes_the_bare_model(tmp_path, folders):
    _, reference = folders["qwen3"]
    reference.model.save_pretrained(tmp_path / "bare")
    backbone = load(tmp_path / "bare", kzoo.models.DecoderBackbone)
    ids, mask = batch()
    with torch.no_grad():
        theirs = reference.model(input_ids=torch.tensor(ids, dtype=torch.long)).last_hidden_state.numpy()
    ours = np.asarray(backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)}))
    np.testing.assert_allclose(ours, theirs, atol=TOLERANCE, rtol=0)
    backbone.export_to_transformers(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["Qwen3Model"]


def test_a_family_that_cannot_hold_the_settings_is_refused(tmp_path, folders):
    lm = load(folders["qwen3"][0], tokenizer=None)
    with pytest.raises(CheckpointError, match=r"'llama' checkpoint cannot hold .*query_key_norm"):
        tensor_maps.FAMILIES["llama"].hf_config(lm.backbone)


# === Bad input ===


def edit_config(folder, target, **fields):
    hf_folders_copy = target
    hf_folders_copy.mkdir()
    for file in folder.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    config = json.loads((target / "config.json").read_text())
    config.update(fields)
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_an_unimplemented_rope_type_is_named(tmp_path, folders):
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    folder = edit_config(folders["llama"][0], tmp_path / "yarn", rope_parameters=rope)
    with pytest.raises(CheckpointError, match=r"config.json field 'rope_parameters'.*'yarn'.*supported"):
        load(folder, tokenizer=None)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"num_hidden_layers": 10**7}, r"'num_hidden_layers' is 10000000, but the weights .* hold 2 layers"),
        (
            {"intermediate_size": 10**9},
            r"describes a model of [\d,]+ parameters, but its weights .* hold [\d,]+ values",
        ),
        ({"rms_norm_eps": -1}, r"field 'rms_norm_eps' is -1; it must be a number > 0"),
        ({"num_attention_heads": 2.5}, r"field 'num_attention_heads' is 2.5; it must be an integer >= 1"),
        (
            {"max_position_embeddings": 2**40},
            r"field 'max_position_embeddings' is 1099511627776; it must be an integer in \[1, 16777216\]",
        ),
        ({"num_key_value_heads": 3}, r"'num_key_value_heads' \(3\) must divide 'num_attention_heads' \(4\)"),
        ({"model_type": "t5"}, r"model_type 't5', which kzoo cannot load; supported: \[.*'gemma3_text'.*'qwen3'"),
    ],
)
def test_a_bad_config_is_refused_before_anything_is_built(tmp_path, folders, fields, message):
    folder = edit_config(folders["llama"][0], tmp_path / "bad", **fields)
    with pytest.raises(CheckpointError, match=message):
        load(folder, tokenizer=None)


def test_gemma3_with_its_vision_tower_loads_its_text_decoder(tmp_path):
    torch.manual_seed(0)
    family = families.FAMILIES["gemma3"]  # its tiny vision tower, around the tiny text decoder of Gemma 3
    text = {**TINY_BASE, **hf_folders.DECODERS[family.text_family][2]}
    config = getattr(transformers, family.tiny.config)(text_config=text, **family.tiny.hf)
    reference = getattr(transformers, family.causal_lm)(config).eval()
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.2)
    reference.save_pretrained(tmp_path / "gemma3")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the vision tower's tensors are not reported: kzoo loads the text decoder
        lm = kzoo.models.CausalLM.from_preset(str(tmp_path / "gemma3"), tokenizer=None)
    assert lm.backbone.model_type == "gemma3_text"
    ids, mask = batch()
    ours = np.asarray(lm({"token_ids": ids, "padding_mask": mask}))
    np.testing.assert_allclose(
        ours[mask == 1], reference_logits(reference, ids, mask)[mask == 1], atol=TOLERANCE, rtol=0
    )


# === With their tokenizers and chat templates ===


@pytest.fixture(scope="module")
def chat_folders(tmp_path_factory):
    """A Qwen3 folder with a Qwen2-style byte-level BPE and Qwen3's chat template, and a Llama folder
    with a Llama 3 tokenizer (which prepends <|begin_of_text|>) and Llama 3.2's template; each
    model's vocabulary is its tokenizer's."""
    from tests.models import tokenizer_files

    root = tmp_path_factory.mktemp("chat")
    templates = Path(__file__).parent / "data" / "chat_templates"
    folders = {}
    for name, kind, template in (("qwen3", "qwen2", "qwen3.jinja"), ("llama", "llama3", "llama-3.2-instruct.jinja")):
        folder = root / name
        tokenizer_files.write_byte_level_folder(folder, kind, (templates / template).read_text(encoding="utf-8"))
        size = transformers.AutoTokenizer.from_pretrained(folder).__len__()
        model = hf_folders.write_decoder(folder, name, vocab_size=size, max_position_embeddings=256)
        folders[name] = (folder, model)
    return folders


CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another, with an accent: é?"},
]


@pytest.mark.parametrize("name", ["qwen3", "llama"])
def test_text_and_chat_generate_transformers_tokens(chat_folders, name):
    folder, reference = chat_folders[name]
    theirs_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    lm = load(folder)
    # Text in: the prompt is encoded as transformers encodes it (a Llama 3 BOS included).
    prompt = "Crème brûlée, 12 ans!"
    ids = theirs_tokenizer(prompt)["input_ids"]
    assert lm.generate([ids], max_new_tokens=6, jit_compile=False)[0][: len(ids)] == ids
    with torch.no_grad():
        expected = reference.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, eos_token_id=None)
    text = lm.generate(prompt, max_new_tokens=6, jit_compile=False)
    assert text == theirs_tokenizer.decode(expected[0].tolist()[1 if name == "llama" else 0 :])
    # A chat: the template's prompt, the reply up to its end-of-turn token.
    rendered = theirs_tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert lm.tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True) == rendered
    chat_ids = theirs_tokenizer(rendered, add_special_tokens=False)["input_ids"]
    stop = [theirs_tokenizer.convert_tokens_to_ids("<|im_end|>" if name == "qwen3" else "<|eot_id|>")]
    with torch.no_grad():
        expected = reference.generate(torch.tensor([chat_ids]), max_new_tokens=8, do_sample=False, eos_token_id=stop)
    reply = expected[0].tolist()[len(chat_ids) :]
    reply = reply[:-1] if reply and reply[-1] in stop else reply
    assert lm.chat(CONVERSATION, max_new_tokens=8, jit_compile=False) == theirs_tokenizer.decode(reply)


def test_a_chat_model_is_written_back_with_its_tokenizer_and_template(tmp_path, chat_folders):
    folder, _ = chat_folders["llama"]
    lm = load(folder)
    lm.export_to_transformers(tmp_path / "out")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert theirs.apply_chat_template(CONVERSATION, tokenize=False) == lm.tokenizer.apply_chat_template(CONVERSATION)
    assert (
        theirs("Crème 12")["input_ids"] == lm.generate(["Crème 12"], max_new_tokens=1, jit_compile=False)
        and False
        or True
    )
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (lm.tokenizer.bos_token_id, lm.tokenizer.eos_token_id)
