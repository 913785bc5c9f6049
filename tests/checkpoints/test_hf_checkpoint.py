"""Hugging Face checkpoints in and out, checked against `transformers` on the same weights.

The checkpoints are tiny random models written by `transformers` (each architecture kzoo
reads), plus the packaged all-MiniLM-L6-v2. `transformers` and CPU `torch` (the `test` extra)
are the independent reference; kzoo itself loads without torch.
"""

import errno
import json
import os
import struct
import threading
import warnings

import keras
import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open

import kzoo
from kzoo.checkpoints.errors import CheckpointError
from kzoo.checkpoints.hf.safetensors import SafetensorsFile
from kzoo.checkpoints.tensor_maps import FAMILIES
from tests.models import hf_folders

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def bert_folders(tmp_path_factory):
    """`{architecture: (folder, transformers model)}` for every BERT architecture kzoo reads."""
    root = tmp_path_factory.mktemp("bert")
    return {name: (root / name, hf_folders.write_bert(root / name, name)) for name in hf_folders.BERT_ARCHITECTURES}


@pytest.fixture(scope="module")
def gpt2_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt2")
    return {name: (root / name, hf_folders.write_gpt2(root / name, name)) for name in hf_folders.GPT2_ARCHITECTURES}


def torch_inputs(ids, mask, segment_ids=None):
    inputs = {"input_ids": torch.tensor(ids, dtype=torch.long), "attention_mask": torch.tensor(mask, dtype=torch.long)}
    if segment_ids is not None:
        inputs["token_type_ids"] = torch.tensor(segment_ids, dtype=torch.long)
    return inputs


def max_difference(ours, theirs, mask=None):
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    if mask is not None:
        ours, theirs = ours[mask.astype(bool)], theirs[mask.astype(bool)]
    return float(np.max(np.abs(ours - theirs)))


def bert_inputs(ids, mask, segment_ids):
    return {"token_ids": ids, "segment_ids": segment_ids, "padding_mask": mask}


def load_quietly(cls, folder, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls.from_preset(str(folder), **kwargs)


# === Reading ===


def test_bert_model_matches_transformers(bert_folders):
    folder, reference = bert_folders["BertModel"]
    backbone = kzoo.models.BertBackbone.from_preset(str(folder))
    assert backbone.activation == "gelu" and backbone.layer_norm_epsilon == 1e-12
    ids, mask, segment_ids = hf_folders.random_batch(backbone.vocabulary_size)
    outputs = backbone(bert_inputs(ids, mask, segment_ids))
    with torch.no_grad():
        expected = reference(**torch_inputs(ids, mask, segment_ids))
    assert max_difference(outputs["sequence_output"], expected.last_hidden_state, mask) <= TOLERANCE
    assert max_difference(outputs["pooled_output"], expected.pooler_output) <= TOLERANCE


@pytest.mark.parametrize("architecture", ["BertForMaskedLM", "BertForPreTraining"])
def test_bert_masked_lm_matches_transformers(bert_folders, architecture):
    folder, reference = bert_folders[architecture]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = kzoo.models.BertMaskedLM.from_preset(str(folder))
    notes = " ".join(str(w.message) for w in caught)
    if architecture == "BertForPreTraining":  # its next-sentence head has no place in kzoo: named
        assert "cls.seq_relationship.weight" in notes and "cls.seq_relationship.bias" in notes
    else:  # BertForMaskedLM has no pooler: it is named as newly initialized
        assert "bert.pooler.dense.weight" in notes and "seq_relationship" not in notes
    ids, mask, segment_ids = hf_folders.random_batch(model.backbone.vocabulary_size)
    positions = np.array([[1, 4, 7], [0, 2, 5], [1, 2, 0]], "int32")
    logits = model({**bert_inputs(ids, mask, segment_ids), "mask_positions": positions})
    with torch.no_grad():
        expected = reference(**torch_inputs(ids, mask, segment_ids))
    expected = expected.logits if architecture == "BertForMaskedLM" else expected.prediction_logits
    expected = np.take_along_axis(expected.numpy(), positions[..., None], axis=1)
    assert max_difference(logits, expected) <= TOLERANCE


@pytest.mark.parametrize(
    "cls, architecture",
    [
        (kzoo.models.BertClassifier, "BertForSequenceClassification"),
        (kzoo.models.BertTokenClassifier, "BertForTokenClassification"),
    ],
)
def test_bert_classifiers_load_their_heads(bert_folders, cls, architecture):
    folder, reference = bert_folders[architecture]
    model = load_quietly(cls, folder)
    assert model.num_classes == 3  # from the checkpoint's labels
    ids, mask, segment_ids = hf_folders.random_batch(model.backbone.vocabulary_size)
    logits = model(bert_inputs(ids, mask, segment_ids))
    with torch.no_grad():
        expected = reference(**torch_inputs(ids, mask, segment_ids)).logits
    assert max_difference(logits, expected, mask if architecture.endswith("TokenClassification") else None) <= TOLERANCE


def test_a_classifier_on_a_base_checkpoint_gets_a_new_head(bert_folders):
    folder, _ = bert_folders["BertModel"]
    with pytest.warns(UserWarning, match="newly initialized"):
        classifier = kzoo.models.BertClassifier.from_preset(str(folder), num_classes=2)
    backbone = kzoo.models.BertBackbone.from_preset(str(folder))
    for ours, theirs in zip(classifier.backbone.weights, backbone.weights):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


@pytest.mark.parametrize(
    "cls, architecture", [(kzoo.models.GPTBackbone, "GPT2Model"), (kzoo.models.GPTCausalLM, "GPT2LMHeadModel")]
)
def test_gpt2_matches_transformers(gpt2_folders, cls, architecture):
    folder, reference = gpt2_folders[architecture]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every tensor has its place: nothing to report
        model = cls.from_preset(str(folder))
    backbone = getattr(model, "backbone", model)
    assert backbone.activation == "gelu_approximate" and backbone.intermediate_dim == 128
    ids, mask, _ = hf_folders.random_batch(backbone.vocabulary_size)
    outputs = model({"token_ids": ids, "padding_mask": mask})
    with torch.no_grad():
        expected = reference(**torch_inputs(ids, mask))
    expected = expected.last_hidden_state if architecture == "GPT2Model" else expected.logits
    assert max_difference(outputs, expected, mask) <= TOLERANCE


def test_a_sharded_checkpoint_loads(tmp_path, bert_folders):
    _, reference = bert_folders["BertModel"]
    reference.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and not (tmp_path / "model.safetensors").exists()
    hf_folders.write_vocabulary(tmp_path)
    sharded = kzoo.models.BertBackbone.from_preset(str(tmp_path))
    whole = kzoo.models.BertBackbone.from_preset(str(bert_folders["BertModel"][0]))
    for ours, theirs in zip(sharded.weights, whole.weights):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_the_sentence_transformers_layout_has_no_prefix():
    with safe_open(str(hf_folders.minilm_dir() / "model.safetensors"), "numpy") as file:
        names = set(file.keys())
    assert "embeddings.word_embeddings.weight" in names and not any(name.startswith("bert.") for name in names)


def expected_names(folder):
    """The tensors of a checkpoint that hold weights (not buffers)."""
    with safe_open(str(folder / "model.safetensors"), "numpy") as file:
        return {name for name in file.keys() if not name.endswith("position_ids")}


@pytest.mark.parametrize(
    "cls, architecture, prefix, unused",
    [
        (kzoo.models.BertBackbone, "BertModel", "", set()),
        (
            kzoo.models.BertMaskedLM,
            "BertForPreTraining",
            "bert.",
            {"cls.seq_relationship.weight", "cls.seq_relationship.bias"},
        ),
        (kzoo.models.BertClassifier, "BertForSequenceClassification", "bert.", set()),
        (kzoo.models.GPTBackbone, "GPT2Model", "", set()),
        (kzoo.models.GPTCausalLM, "GPT2LMHeadModel", "transformer.", set()),
    ],
)
def test_the_name_maps_cover_every_tensor_and_every_weight(
    bert_folders, gpt2_folders, cls, architecture, prefix, unused
):
    """Every tensor of the checkpoint has exactly one kzoo weight set from it, every kzoo weight
    is set from a tensor, and each map's two directions are inverses (checked on the real values)."""
    folder, _ = {**bert_folders, **gpt2_folders}[architecture]
    model = load_quietly(cls, folder)
    backbone = getattr(model, "backbone", model)
    family = FAMILIES["bert" if isinstance(backbone, kzoo.models.BertBackbone) else "gpt2"]
    maps = [(prefix, map_) for map_ in family.backbone_tensors(backbone)]
    if model is not backbone:
        maps += [("", map_) for map_ in family.heads[cls.__name__].tensors(model)]
    names = [p + name for p, map_ in maps for name in map_.names]
    assert len(names) == len(set(names))
    assert set(names) == expected_names(folder) - unused
    weights = [id(weight) for _, map_ in maps for weight in map_.weights]
    assert len(weights) == len(set(weights))
    assert set(weights) == {id(weight) for weight in model.weights}
    with safe_open(str(folder / "model.safetensors"), "numpy") as file:
        for p, map_ in maps:
            current = [w.numpy() for w in map_.weights]
            tensors = map_.to_hf(current)
            for name, tensor in zip(map_.names, tensors):
                np.testing.assert_array_equal(tensor, file.get_tensor(p + name), err_msg=name)
            for back, value in zip(map_.to_keras(tensors), current):
                np.testing.assert_array_equal(back, value)


# === Writing ===


def bert_backbone(**kwargs):
    return kzoo.models.BertBackbone(
        vocabulary_size=len(hf_folders.VOCABULARY),
        num_layers=2,
        num_heads=4,
        hidden_dim=32,
        intermediate_dim=48,
        max_sequence_length=40,
        activation="gelu",
        **kwargs,
    )


def gpt_backbone():
    return kzoo.models.GPTBackbone(
        vocabulary_size=300, num_layers=2, num_heads=4, hidden_dim=32, intermediate_dim=48, max_sequence_length=40
    )


def randomize(model, seed=0):
    """Random values in every weight (a fresh model has zero biases and unit LayerNorms)."""
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        weight.assign(rng.normal(0, 0.2, weight.shape).astype("float32"))
    return model


def word_pieces():
    from kzoo.tokenizers.bert import BertTokenizer

    return BertTokenizer(hf_folders.VOCABULARY, lowercase=True)


@pytest.mark.parametrize(
    "build, auto",
    [
        (lambda: bert_backbone(), "AutoModel"),
        (lambda: kzoo.models.BertMaskedLM(bert_backbone(), tokenizer=word_pieces()), "AutoModelForMaskedLM"),
        (
            lambda: kzoo.models.BertClassifier(bert_backbone(), 4, tokenizer=word_pieces()),
            "AutoModelForSequenceClassification",
        ),
        (lambda: kzoo.models.BertTokenClassifier(bert_backbone(), 5), "AutoModelForTokenClassification"),
        (lambda: gpt_backbone(), "AutoModel"),
        (lambda: kzoo.models.GPTCausalLM(gpt_backbone()), "AutoModelForCausalLM"),
    ],
)
def test_written_checkpoints_load_in_transformers_with_the_same_outputs(tmp_path, build, auto):
    model = randomize(build())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # BertTokenClassifier's pooler has no place in HF's: named
        model.export_to_transformers(tmp_path / "out")
    reference = getattr(transformers, auto).from_pretrained(tmp_path / "out").eval()
    backbone = getattr(model, "backbone", model)
    is_bert = isinstance(backbone, kzoo.models.BertBackbone)
    ids, mask, segment_ids = hf_folders.random_batch(backbone.vocabulary_size, segments=is_bert)
    inputs = bert_inputs(ids, mask, segment_ids) if is_bert else {"token_ids": ids, "padding_mask": mask}
    positions = np.array([[1, 4, 7], [0, 2, 5], [1, 2, 0]], "int32")
    if isinstance(model, kzoo.models.BertMaskedLM):
        inputs["mask_positions"] = positions
    outputs = model(inputs)
    with torch.no_grad():
        expected = reference(**torch_inputs(ids, mask, segment_ids if is_bert else None))
    if auto == "AutoModel":
        sequence_output = outputs["sequence_output"] if is_bert else outputs
        assert max_difference(sequence_output, expected.last_hidden_state, mask) <= TOLERANCE
        if is_bert:
            assert max_difference(outputs["pooled_output"], expected.pooler_output) <= TOLERANCE
    elif isinstance(model, kzoo.models.BertMaskedLM):
        masked = np.take_along_axis(expected.logits.numpy(), positions[..., None], 1)
        assert max_difference(outputs, masked) <= TOLERANCE
    elif isinstance(model, kzoo.models.BertClassifier):
        assert max_difference(outputs, expected.logits) <= TOLERANCE
    else:
        assert max_difference(outputs, expected.logits, mask) <= TOLERANCE
    # And back: the written folder loads into kzoo with the same weights (but the pooler, which
    # BertForMaskedLM and BertForTokenClassification do not have).
    again = load_quietly(type(model), tmp_path / "out")
    without_pooler = isinstance(model, (kzoo.models.BertMaskedLM, kzoo.models.BertTokenClassifier))
    for ours, theirs in zip(model.weights, again.weights):
        if not (without_pooler and "pooler" in ours.path):
            np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=ours.path)


def test_a_written_tokenizer_loads_in_transformers_with_the_same_ids(tmp_path):
    model = kzoo.models.BertClassifier(bert_backbone(), 2, tokenizer=word_pieces())
    model.export_to_transformers(tmp_path / "out")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    texts = ["The fine film!", "Crème brûlée, naïve café.", "un-loved 東京 movies", "HELLO world"]
    for text in texts:
        assert theirs(text)["input_ids"] == [2, *np.asarray(model.tokenizer(text)).tolist(), 3], text


def test_a_written_gpt2_tokenizer_loads_in_transformers_with_the_same_ids(tmp_path, gpt2_folders):
    folder, _ = gpt2_folders["GPT2LMHeadModel"]
    lm = load_quietly(kzoo.models.GPTCausalLM, folder)
    lm.export_to_transformers(tmp_path / "out")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    for text in ["ROMEO: But soft!", "Crème brûlée 😂 東京", "  two  spaces\nand a line"]:
        assert theirs(text)["input_ids"] == np.asarray(lm.tokenizer(text)).tolist(), text


def test_writing_refuses_a_folder_in_use(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="not an empty folder"):
        bert_backbone().export_to_transformers(tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["keep.txt"]


def test_two_concurrent_writers_to_one_folder_leave_one_whole_checkpoint(tmp_path, monkeypatch):
    """Both writers have written their weights before either moves them in (a barrier in
    the write): the folder holds one writer's checkpoint, whole, and the other is told."""
    import safetensors.numpy

    barrier, save_file = threading.Barrier(2, timeout=60), safetensors.numpy.save_file

    def save_and_wait(*args, **kwargs):
        save_file(*args, **kwargs)
        barrier.wait()

    monkeypatch.setattr(safetensors.numpy, "save_file", save_and_wait)
    backbones, results = [randomize(bert_backbone(), seed) for seed in (1, 2)], [None, None]

    def write(i):
        try:
            backbones[i].export_to_transformers(tmp_path / "out")
            results[i] = "written"
        except CheckpointError as error:
            results[i] = str(error)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results, key=len) == [
        "written",
        f"{tmp_path / 'out'} was filled by another writer while this one ran; choose a new one.",
    ]
    again = load_quietly(kzoo.models.BertBackbone, tmp_path / "out")
    for ours, theirs in zip(backbones[results.index("written")].weights, again.weights):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=ours.path)
    assert [path.name for path in tmp_path.iterdir()] == ["out"]


def test_a_full_disk_is_named_and_nothing_is_written(tmp_path, monkeypatch):
    import safetensors.numpy

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(safetensors.numpy, "save_file", no_space)
    with pytest.raises(OSError, match=f"No space left on device: nothing was written to {tmp_path / 'out'}"):
        bert_backbone().export_to_transformers(tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


# === Bad input ===


def copy_folder(source, target, skip=()):
    target.mkdir()
    for file in source.iterdir():
        if file.name not in skip:
            (target / file.name).write_bytes(file.read_bytes())
    return target


def test_an_unsupported_model_type_lists_the_supported_ones(tmp_path, bert_folders):
    folder = copy_folder(bert_folders["BertModel"][0], tmp_path / "t5")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "t5"}))
    with pytest.raises(CheckpointError, match=r"config.json has model_type 't5'.*supported: \['bert', 'gemma'.*'gpt2'"):
        kzoo.models.BertBackbone.from_preset(str(folder))


def test_a_family_loads_only_into_its_classes(bert_folders):
    with pytest.raises(CheckpointError, match="holds a 'bert' model.*not GPTCausalLM"):
        kzoo.models.GPTCausalLM.from_preset(str(bert_folders["BertModel"][0]))


def test_a_pytorch_only_folder_says_to_convert_it(tmp_path, bert_folders):
    folder = copy_folder(bert_folders["BertModel"][0], tmp_path / "pt", skip=("model.safetensors",))
    (folder / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(CheckpointError, match="pytorch_model.bin.*convert it to safetensors"):
        kzoo.models.BertBackbone.from_preset(str(folder))


@pytest.mark.parametrize("damage", ["truncate", "header"])
def test_a_damaged_safetensors_file_is_named(tmp_path, bert_folders, damage):
    folder = copy_folder(bert_folders["BertModel"][0], tmp_path / damage)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncate" else data[:8] + b"{not json" + data[17:])
    message = r"model.safetensors is not a readable safetensors file.*truncated or corrupt"
    with pytest.raises(CheckpointError, match=message):
        kzoo.models.BertBackbone.from_preset(str(folder))


def test_safetensors_whose_tensors_share_bytes_are_refused_naming_both(tmp_path):
    """Two tensors whose byte ranges overlap: a crafted or corrupt file, refused before anything is read."""
    header = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}
    header["b"] = {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}
    text = json.dumps(header).encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(24))
    with pytest.raises(CheckpointError) as raised:
        SafetensorsFile(path)
    message = f"{path} is not a readable safetensors file (tensors 'a' and 'b' share bytes: 'b' starts at byte 8, "
    assert str(raised.value).startswith(message + "before 'a' ends at 16)")


def rewrite_tensors(folder, change):
    from safetensors.numpy import save_file

    with safe_open(str(folder / "model.safetensors"), "numpy") as file:
        tensors = {name: file.get_tensor(name) for name in file.keys()}
    save_file(change(tensors), str(folder / "model.safetensors"), metadata={"format": "pt"})


def test_a_missing_tensor_is_an_error_naming_it(tmp_path, bert_folders):
    folder = copy_folder(bert_folders["BertModel"][0], tmp_path / "missing")
    rewrite_tensors(folder, lambda t: {k: v for k, v in t.items() if k != "encoder.layer.1.output.dense.bias"})
    with pytest.raises(CheckpointError, match=r"tensor 'encoder.layer.1.output.dense.bias' is missing"):
        kzoo.models.BertBackbone.from_preset(str(folder))


def test_more_layers_in_the_config_than_in_the_weights(tmp_path, bert_folders):
    folder = copy_folder(bert_folders["BertModel"][0], tmp_path / "layers")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(
        CheckpointError, match=r"'num_hidden_layers' is 3, but the weights \(model.safetensors\) hold 2"
    ):
        kzoo.models.BertBackbone.from_preset(str(folder))


def test_a_shape_that_disagrees_with_the_config(tmp_path, bert_folders):
    folder = copy_folder(bert_folders["BertModel"][0], tmp_path / "shape")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 40}))
    message = r"'encoder.layer.0.intermediate.dense.weight' has shape \[37, 32\]; the config gives \[40, 32\]"
    with pytest.raises(CheckpointError, match=message):
        kzoo.models.BertBackbone.from_preset(str(folder))


def test_a_missing_config_field_is_named(tmp_path, bert_folders):
    folder = copy_folder(bert_folders["BertModel"][0], tmp_path / "field")
    config = json.loads((folder / "config.json").read_text())
    del config["hidden_size"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config.json lacks the field 'hidden_size'"):
        kzoo.models.BertBackbone.from_preset(str(folder))


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path, bert_folders):
    folder = copy_folder(bert_folders["BertForMaskedLM"][0], tmp_path / "vocab", skip=("tokenizer.json",))
    with open(folder / "vocab.txt", "a", encoding="utf-8") as file:
        file.write("extra1\nextra2\n")
    size = len(hf_folders.VOCABULARY)
    message = rf"vocab.txt has {size + 2} tokens, but the model's vocab_size .* is {size}"
    with pytest.raises(CheckpointError, match=message):
        load_quietly(kzoo.models.BertMaskedLM, folder)


def test_a_bad_load_leaves_the_task_untouched(tmp_path, bert_folders):
    """A failed load returns nothing, so no half-loaded model exists; and the check comes
    before any weight is set (a missing last tensor, after all the good ones)."""
    folder = copy_folder(bert_folders["BertModel"][0], tmp_path / "late")
    rewrite_tensors(folder, lambda t: {k: v for k, v in t.items() if k != "pooler.dense.weight"} | {})
    calls = []
    original = keras.Variable.assign
    keras.Variable.assign = lambda self, value: calls.append(self.path) or original(self, value)
    try:
        with pytest.raises(CheckpointError, match="'pooler.dense.weight' is missing"):
            kzoo.models.BertBackbone.from_preset(str(folder))
    finally:
        keras.Variable.assign = original
    assert calls == []


# === The real encoder ===


@pytest.fixture(scope="module")
def minilm():
    return kzoo.models.BertBackbone.from_preset(str(hf_folders.minilm_dir()))


def test_minilm_matches_transformers(minilm):
    assert minilm.count_params() == 22_713_216
    assert (minilm.num_layers, minilm.hidden_dim, minilm.vocabulary_size) == (6, 384, 30522)
    reference = transformers.AutoModel.from_pretrained(hf_folders.minilm_dir()).eval()
    ids, mask, segment_ids = hf_folders.random_batch(30522, length=24)
    outputs = minilm(bert_inputs(ids, mask, segment_ids))
    with torch.no_grad():
        expected = reference(**torch_inputs(ids, mask, segment_ids))
    assert max_difference(outputs["sequence_output"], expected.last_hidden_state, mask) <= TOLERANCE
    assert max_difference(outputs["pooled_output"], expected.pooler_output) <= TOLERANCE


# === Values and files from outside: refused by name (reliability issue) ===


def edited_config(folder, target, **fields):
    folder = copy_folder(folder, target)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))
    return folder


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"layer_norm_epsilon": -1}, r"config.json field 'layer_norm_epsilon' is -1; it must be a number > 0"),
        ({"n_layer": 2.5}, r"config.json field 'n_layer' is 2.5; it must be an integer >= 1"),
        ({"n_layer": -2}, r"config.json field 'n_layer' is -2; it must be an integer >= 1"),
        ({"n_embd": 10**9}, r"'n_head' \(4\) must divide 'n_embd'|describes a model of"),
        ({"n_embd": 4 * 10**8}, r"describes a model of [\d,]+ parameters, but its weights \(model.safetensors\) hold"),
    ],
)
def test_config_values_are_checked_naming_the_field(tmp_path, gpt2_folders, fields, message):
    folder = edited_config(gpt2_folders["GPT2LMHeadModel"][0], tmp_path / "bad", **fields)
    with pytest.raises(CheckpointError, match=message):
        load_quietly(kzoo.models.GPTCausalLM, folder)


def test_a_config_that_is_not_json_is_named(tmp_path, gpt2_folders):
    folder = copy_folder(gpt2_folders["GPT2Model"][0], tmp_path / "json")
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config.json is not valid JSON"):
        kzoo.models.GPTBackbone.from_preset(str(folder))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a * np.nan, r"tensor 'h.0.ln_1.weight' holds 32 NaN or infinite values"),
        (lambda a: np.full_like(a, np.inf), r"tensor 'h.0.ln_1.weight' holds 32 NaN or infinite values"),
        (lambda a: a.astype("int64"), r"tensor 'h.0.ln_1.weight' has dtype I64; weights must be floating point"),
    ],
)
def test_bad_tensor_values_are_refused_by_name(tmp_path, gpt2_folders, change, message):
    folder = copy_folder(gpt2_folders["GPT2Model"][0], tmp_path / "values")
    rewrite_tensors(folder, lambda t: {**t, "h.0.ln_1.weight": change(t["h.0.ln_1.weight"])})
    with pytest.raises(CheckpointError, match=message):
        kzoo.models.GPTBackbone.from_preset(str(folder))


def test_a_shard_outside_the_folder_is_refused(tmp_path, bert_folders):
    _, reference = bert_folders["BertModel"]
    reference.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    hf_folders.write_vocabulary(tmp_path / "sharded")
    index = tmp_path / "sharded" / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    shard = sorted(set(data["weight_map"].values()))[0]
    (tmp_path / "outside.safetensors").write_bytes((tmp_path / "sharded" / shard).read_bytes())
    data["weight_map"] = {k: "../outside.safetensors" if v == shard else v for k, v in data["weight_map"].items()}
    index.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"lists the shard '../outside.safetensors': shards must be files in"):
        kzoo.models.BertBackbone.from_preset(str(tmp_path / "sharded"))


def test_a_bfloat16_checkpoint_loads_exactly(tmp_path, gpt2_folders):
    _, reference = gpt2_folders["GPT2LMHeadModel"]
    reference.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    reference.to(torch.float32)
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), "pt") as file:
        assert file.get_tensor("transformer.h.0.ln_1.weight").dtype == torch.bfloat16
    ours = load_quietly(kzoo.models.GPTCausalLM, tmp_path / "bf16", tokenizer=None)
    rounded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "bf16", dtype=torch.float32).eval()
    ids, mask, _ = hf_folders.random_batch(ours.backbone.vocabulary_size)
    with torch.no_grad():
        expected = rounded(**torch_inputs(ids, mask)).logits
    assert max_difference(ours({"token_ids": ids, "padding_mask": mask}), expected, mask) <= TOLERANCE


@pytest.mark.parametrize("dtype, weights", [("bfloat16", "bfloat16"), ("mixed_bfloat16", "float32")])
def test_a_task_loaded_with_a_dtype_gives_it_to_its_backbone(gpt2_folders, dtype, weights):
    folder, reference = gpt2_folders["GPT2LMHeadModel"]
    ours = load_quietly(kzoo.models.GPTCausalLM, folder, tokenizer=None, dtype=dtype)
    assert {variable.dtype for variable in ours.weights} == {weights}
    ids, mask, _ = hf_folders.random_batch(ours.backbone.vocabulary_size)
    with torch.no_grad():
        expected = reference(**torch_inputs(ids, mask)).logits.numpy()
    logits = keras.ops.convert_to_numpy(keras.ops.cast(ours({"token_ids": ids, "padding_mask": mask}), "float32"))
    # bfloat16 keeps 8 bits of each value: a few hundredths of the largest logit, not more.
    assert 1e-4 < max_difference(logits, expected, mask) / np.abs(expected).max() < 0.05


def test_a_quantized_model_is_written_with_its_dequantized_weights(tmp_path, gpt2_folders):
    folder, _ = gpt2_folders["GPT2LMHeadModel"]
    lm = load_quietly(kzoo.models.GPTCausalLM, folder, tokenizer=None)
    ids, mask, _ = hf_folders.random_batch(lm.backbone.vocabulary_size)
    inputs = {"token_ids": ids, "padding_mask": mask}
    float_logits = np.asarray(lm(inputs))
    lm.quantize("int8")
    lm.export_to_transformers(tmp_path / "int8")
    written = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "int8").eval()
    with torch.no_grad():
        theirs = written(**torch_inputs(ids, mask)).logits.numpy()
    # The int8 weights' rounding only (the raw codes would be off by hundreds of times the logits).
    scale = np.abs(float_logits).max()
    assert max_difference(theirs, float_logits, mask) <= 0.05 * scale
    assert max_difference(theirs, np.asarray(lm(inputs)), mask) <= 0.05 * scale
