"""Training a chat model on its replies alone: `ReplyLogits` and the batches it trains on.

A chat fine-tune's loss counts the reply's tokens and the end-of-turn token that closes it,
nothing of the prompt. A `CausalLM` trained with the prompt's targets weighted 0 gets that
loss, but computes the LM head at every position; `ReplyLogits` computes it at the reply's
positions alone (a fifth of the work per token at SmolLM2's size, where the head is a large
share of the model), for the same loss.

- `chat_examples(tokenizer, conversations, replies)`: `(prompt_ids, reply_ids)` of each
  conversation in the tokenizer's chat template.
- `reply_batches(examples, batch_size)`: the training batches of `ReplyLogits`, as
  `(inputs, targets, sample_weight)`.
- `reply_inputs(sequences, positions)`: its inputs for prediction (scoring an answer).

Example:
>>> backbone = kzoo.models.DecoderBackbone.from_preset("llama_tiny", vocabulary_size=64)
>>> model = ReplyLogits(kzoo.models.CausalLM(backbone))
>>> model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
>>> batches = reply_batches([([5, 6, 7], [8, 2]), ([9, 10], [11, 12, 2])], batch_size=2)
>>> history = model.fit(batches, epochs=1, verbose=0)
>>> inputs = reply_inputs([[5, 6, 7, 8]], [[2, 3]])  # the logits after 7 and after 8
>>> model.predict_on_batch(inputs).shape
(1, 2, 64)
"""

import keras
import numpy as np
from keras import ops

from kzoo.models.task import Task
from kzoo.tokenizers import chat_template


@keras.saving.register_keras_serializable(package="kzoo")
class ReplyLogits(Task):
    """A `CausalLM` that gives its next-token logits at the positions asked for alone.

    Inputs: the `CausalLM`'s `{"token_ids", "padding_mask"}` `(B, T)` and `"positions"` `(B, R)`,
    the positions whose logits to compute. Output: float32 logits `(B, R, V)`, those of
    `lm(inputs)[b, positions[b, r]]`. The backbone runs over every position (each attends to
    those before it) and the LM head at the `R` positions alone: training on a reply, or
    scoring an answer, needs no logits elsewhere. It shares the `lm`'s layers, so training it
    trains the `lm`: save the `lm` for serving.

    Args:
        lm: a `kzoo.models.CausalLM`.
        **kwargs: `keras.Model` arguments (`name`).
    """

    def __init__(self, lm, **kwargs):
        self.lm = lm
        self.backbone = lm.backbone
        inputs = {
            **lm.backbone.input,
            "positions": keras.Input(shape=(None,), dtype="int32", name="positions"),
        }
        hidden = lm.backbone({name: inputs[name] for name in lm.backbone.input})  # (B, T, d)
        picked = ops.take_along_axis(hidden, ops.expand_dims(inputs["positions"], -1), axis=1)  # (B, R, d)
        super().__init__(inputs=inputs, outputs=lm.logits(picked), **kwargs)

    def get_config(self):
        return {"lm": keras.layers.serialize(self.lm), "name": self.name}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["lm"] = keras.layers.deserialize(config["lm"])
        return cls(**config)


# The name files saved by recipes/chat_finetune.py name it by (its epoch checkpoints), from
# before it moved here: they load too.
keras.saving.get_custom_objects()["kzoo_recipes>ReplyLogits"] = ReplyLogits


def chat_examples(tokenizer, conversations, replies):
    """`(prompt_ids, reply_ids)` of each conversation answered with its reply, in the chat template.

    `prompt_ids` is the conversation with the header of the assistant's turn
    (`add_generation_prompt=True`); `reply_ids` the tokens that follow it in the conversation
    with the reply, up to and including the end-of-turn token that closes the reply.

    Args:
        tokenizer: a tokenizer with a chat template (`apply_chat_template`).
        conversations: a list of conversations, each a list of `{"role", "content"}` messages.
        replies: a list of str, the assistant's reply to each conversation.

    Returns:
        A list of `(prompt_ids, reply_ids)` lists of ints.

    Raises:
        ValueError: the chat template closes a reply with no token of its own, or does not
            write a conversation as its prompt followed by the reply and that token.
        kzoo.tokenizers.chat_template.ChatTemplateError: the chat template does not render a
            conversation (or goes over its bounds), naming its file.
    """
    answered = [[*messages, {"role": "assistant", "content": reply}] for messages, reply in zip(conversations, replies)]
    # Rendered one by one, tokenized in one call (the tokenizer's batch encoding is the cost).
    # Rendered before the end-of-turn lookup, so that a template that does not render is
    # reported as such, not as one without an end-of-turn token.
    prompts = tokenizer.tokenize(
        [tokenizer.apply_chat_template(messages, add_generation_prompt=True) for messages in conversations]
    )
    end_of_turn = chat_template.end_of_turn_token(tokenizer)
    if end_of_turn is None:
        raise ValueError("The tokenizer's chat template closes a reply with no token of its own.")
    end_id = tokenizer.token_to_id(end_of_turn)
    wholes = tokenizer.tokenize([tokenizer.apply_chat_template(messages) for messages in answered])
    examples = []
    for prompt, whole, messages in zip(prompts, wholes, answered):
        if whole[: len(prompt)] != prompt or end_id not in whole[len(prompt) :]:
            raise ValueError(
                "The chat template does not write a conversation as its prompt followed by the reply and "
                f"{end_of_turn}: {tokenizer.apply_chat_template(messages)!r}"
            )
        rest = whole[len(prompt) :]
        examples.append((prompt, rest[: rest.index(end_id) + 1]))
    return examples


def reply_batches(examples, batch_size, bucket_boundaries=None, shuffle=False, seed=None):
    """Training batches of `(prompt_ids, reply_ids)` examples for `ReplyLogits`: the loss counts the reply alone.

    Each example is one sequence, prompt then reply. The model reads it without its last token
    and predicts, at each position t, the token at t + 1. The reply's tokens are the targets of
    the positions from the prompt's last token on: `positions` are `len(prompt) - 1, ...,
    len(prompt) + len(reply) - 2`, the targets are `reply_ids` and their sample weights 1.
    Nothing of the prompt is a target, and padding has weight 0.

    Args:
        examples: a list of `(prompt_ids, reply_ids)` lists (`chat_examples`).
        batch_size: int.
        bucket_boundaries: None (batches in order), or increasing lengths: batches group
            sequences of lengths in `[boundaries[i-1], boundaries[i])`.
        shuffle: bool, shuffle the examples (with `seed`), reshuffled on each pass.
        seed: int or None.

    Returns:
        A `tf.data.Dataset` of `({"token_ids", "padding_mask", "positions"}, targets,
        sample_weight)`: int32 `(B, T)` twice (padded with 0 to the batch's longest sequence),
        int32 `(B, R)`, int32 `(B, R)` and float32 `(B, R)` (padded to its longest reply).

    Raises:
        ValueError: `batch_size` is not >= 1, or an example has an empty prompt or reply.

    Example:
    >>> x, y, w = next(iter(reply_batches([([5, 6, 7], [8, 2])], 1)))
    >>> x["token_ids"].numpy().tolist(), x["positions"].numpy().tolist(), y.numpy().tolist()
    ([[5, 6, 7, 8]], [[2, 3]], [[8, 2]])
    """
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be >= 1; received {batch_size}.")
    for index, (prompt, reply) in enumerate(examples):
        if not prompt or not reply:
            raise ValueError(
                f"`examples[{index}]` must have a prompt and a reply of at least one token each; received "
                f"{len(prompt)} and {len(reply)} tokens."
            )
    sequences = [prompt + reply for prompt, reply in examples]
    import tensorflow as tf  # tf.data: here, so that the model itself runs without TensorFlow

    def ragged(rows):
        return tf.RaggedTensor.from_row_lengths(
            np.concatenate([np.asarray(row, "int32") for row in rows]), [len(row) for row in rows]
        )

    dataset = tf.data.Dataset.from_tensor_slices(
        (
            ragged([sequence[:-1] for sequence in sequences]),
            ragged([np.arange(len(prompt) - 1, len(prompt) + len(reply) - 1) for prompt, reply in examples]),
            ragged([reply for _, reply in examples]),
        )
    )

    def element(token_ids, positions, targets):
        x = {"token_ids": token_ids, "padding_mask": tf.ones_like(token_ids), "positions": positions}
        return x, targets, tf.ones_like(targets, tf.float32)

    dataset = dataset.map(element)
    if shuffle:
        dataset = dataset.shuffle(len(examples), seed=seed, reshuffle_each_iteration=True)
    if bucket_boundaries is None:
        dataset = dataset.padded_batch(batch_size)
    else:
        dataset = dataset.bucket_by_sequence_length(
            element_length_func=lambda x, targets, weights: tf.size(x["token_ids"]),
            bucket_boundaries=list(bucket_boundaries),
            bucket_batch_sizes=[batch_size] * (len(bucket_boundaries) + 1),
        )
    return dataset.prefetch(tf.data.AUTOTUNE)


def reply_inputs(sequences, positions):
    """The `ReplyLogits` inputs of `sequences` (token-id lists) and the `positions` to read, right-padded.

    Args:
        sequences: a list of token-id lists.
        positions: a list (one per sequence) of lists of positions in it whose logits to compute.

    Returns:
        `{"token_ids", "padding_mask", "positions"}`, int32 NumPy arrays `(B, T)`, `(B, T)` and
        `(B, R)` (padded positions read position 0).

    Example:
    >>> reply_inputs([[5, 6, 7], [8]], [[1, 2], [0]])["positions"].tolist()
    [[1, 2], [0, 0]]
    """
    token_ids = np.zeros((len(sequences), max(map(len, sequences))), "int32")
    mask = np.zeros_like(token_ids)
    picked = np.zeros((len(sequences), max(map(len, positions))), "int32")
    for row, (sequence, read) in enumerate(zip(sequences, positions)):
        token_ids[row, : len(sequence)] = sequence
        mask[row, : len(sequence)] = 1
        picked[row, : len(read)] = read
    return {"token_ids": token_ids, "padding_mask": mask, "positions": picked}
