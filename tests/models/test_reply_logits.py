"""kzoo.models.ReplyLogits and its batches: the reply-only loss equals the full sequence's loss
masked by hand, a saved model reloads (also under the name recipes/chat_finetune.py saved it by),
and bad batching arguments are named."""

import json
import zipfile

import keras
import numpy as np
import pytest

import kzoo
from kzoo.models.cross_entropy import TokenCrossEntropy
from kzoo.models.decoder.reply_logits import reply_batches
from kzoo.models.decoder.reply_logits import reply_inputs

EXAMPLES = [([5, 6, 7], [8, 2]), ([9, 10, 11, 12, 13], [14, 15, 2])]


def tiny_lm(vocabulary_size=64):
    keras.utils.set_random_seed(0)
    backbone = kzoo.models.DecoderBackbone.from_preset("llama_tiny", vocabulary_size=vocabulary_size)
    return kzoo.models.CausalLM(backbone)


def test_reply_batches_weight_the_reply_tokens_alone():
    """Prompt [5, 6, 7] with reply [8, 2] (2: end of turn): the model reads 5 6 7 8 and the targets
    are the tokens after positions 2 and 3; nothing of the prompt is a target."""
    x, targets, weights = next(iter(reply_batches(EXAMPLES, batch_size=2)))
    assert x["token_ids"].numpy().tolist() == [[5, 6, 7, 8, 0, 0, 0], [9, 10, 11, 12, 13, 14, 15]]
    assert x["padding_mask"].numpy().tolist() == [[1, 1, 1, 1, 0, 0, 0], [1] * 7]
    assert x["positions"].numpy().tolist() == [[2, 3, 0], [4, 5, 6]]
    assert targets.numpy().tolist() == [[8, 2, 0], [14, 15, 2]]
    assert weights.numpy().tolist() == [[1, 1, 0], [1, 1, 1]]


def test_the_reply_loss_is_the_full_sequence_loss_masked_by_hand():
    """`ReplyLogits` on `reply_batches` gives the loss of the whole `CausalLM` on the next-token
    targets, with the mask written by hand: 1 where the target is a reply token or the end of
    turn, 0 on the prompt's targets and on padding."""
    lm = tiny_lm()
    x, targets, weights = next(iter(reply_batches(EXAMPLES, batch_size=2)))
    loss = TokenCrossEntropy()
    reply_loss = loss(targets, kzoo.models.ReplyLogits(lm)(x), sample_weight=weights)

    full = {"token_ids": x["token_ids"], "padding_mask": x["padding_mask"]}
    next_tokens = [[6, 7, 8, 2, 0, 0, 0], [10, 11, 12, 13, 14, 15, 2]]
    mask = [[0, 0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1]]
    full_loss = loss(np.array(next_tokens), lm(full), sample_weight=np.array(mask, "float32"))
    assert float(reply_loss) == pytest.approx(float(full_loss), rel=1e-6)


def test_reply_inputs_pad_and_pick_the_positions_asked_for():
    lm = tiny_lm()
    inputs = reply_inputs([[5, 6, 7, 8], [9, 10]], [[1, 3], [0]])
    assert inputs["padding_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    logits = kzoo.models.ReplyLogits(lm).predict_on_batch(inputs)
    full = lm.predict_on_batch({"token_ids": inputs["token_ids"], "padding_mask": inputs["padding_mask"]})
    np.testing.assert_allclose(logits[0], full[0, [1, 3]], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits[1, 0], full[1, 0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("registered_name", ["kzoo>ReplyLogits", "kzoo_recipes>ReplyLogits"])
def test_a_saved_reply_model_reloads_also_under_its_recipe_name(tmp_path, registered_name):
    """A `.keras` file of the model, and one saved when it lived in recipes/chat_finetune.py
    (registered as "kzoo_recipes>ReplyLogits", module chat_finetune), load to the same logits."""
    model = kzoo.models.ReplyLogits(tiny_lm())
    model.save(tmp_path / "saved.keras")
    path = tmp_path / "renamed.keras"
    with zipfile.ZipFile(tmp_path / "saved.keras") as source, zipfile.ZipFile(path, "w") as target:
        for item in source.infolist():
            data = source.read(item.filename)
            if item.filename == "config.json":
                config = json.loads(data)
                assert config["registered_name"] == "kzoo>ReplyLogits"
                config["registered_name"] = registered_name
                if registered_name.startswith("kzoo_recipes"):
                    config["module"] = "chat_finetune"
                data = json.dumps(config)
            target.writestr(item, data)
    loaded = keras.saving.load_model(path, compile=False)
    assert isinstance(loaded, kzoo.models.ReplyLogits)
    inputs = reply_inputs([[5, 6, 7, 8]], [[2, 3]])
    np.testing.assert_allclose(loaded.predict_on_batch(inputs), model.predict_on_batch(inputs), rtol=1e-6)


@pytest.mark.parametrize(
    "examples, batch_size, message",
    [
        (EXAMPLES, 0, "`batch_size` must be >= 1; received 0."),
        ([([5], [8]), ([], [2])], 2, r"`examples\[1\]` must have a prompt and a reply .* received 0 and 1 tokens."),
        ([([5], [])], 2, r"`examples\[0\]` must have .* received 1 and 0 tokens."),
    ],
)
def test_bad_batching_arguments_are_named(examples, batch_size, message):
    with pytest.raises(ValueError, match=message):
        reply_batches(examples, batch_size)
