"""What the language-model recipes share: the data flags and defaults, and the models they train.

`gpt_lm.py` trains the GPT, `rnn_lm.py` recurrent models of as many parameters on the same
data, and `lm_compare.py` compares them.
"""

import _common
import tensorflow as tf

import kzoo
import kzoo.data

DEFAULTS = dict(
    preset="gpt_tiny",
    steps=1500,
    epochs=10,
    batch_size=32,
    learning_rate=2e-3,
    dataset="kzoo_tiny_shakespeare",
    sequence_length=128,
    dropout=0.0,
    validation_batches=None,
    prompt="ROMEO:",
    sample_length=120,
)
QUICK = dict(steps=40, epochs=2, batch_size=16, sequence_length=64, validation_batches=8, sample_length=48)

# Recurrent widths are searched in steps of this many units.
WIDTH_STEP = 8


def add_data_arguments(parser):
    """The flags of the data and model size."""
    parser.add_argument("--dataset", help="a kzoo or tensorflow-datasets dataset with a 'text' feature")
    parser.add_argument("--sequence-length", type=int, help="characters per training window")
    parser.add_argument("--dropout", type=float, help="the model's dropout")
    parser.add_argument("--validation-batches", type=int, help="validation batches per epoch, or all")


def language_model(args):
    """The `--preset` GPT with `--dropout`, and as many positions as `--sequence-length`
    (positions past the training windows would never be trained), with its character tokenizer."""
    backbone = kzoo.models.GPTBackbone.from_preset(
        args.preset, dropout=args.dropout, max_sequence_length=args.sequence_length
    )
    return kzoo.models.GPTCausalLM(backbone, tokenizer=kzoo.data.character_tokenizer(backbone.vocabulary_size))


def gpt_inputs(inputs, targets):
    """GPT inputs for full windows: no padding."""
    return {"token_ids": inputs, "padding_mask": tf.ones_like(inputs)}, targets


def rnn_language_model(vocabulary_size, embedding_dim, hidden_dim, cell, dropout):
    return kzoo.models.RNNLanguageModel(
        vocabulary_size, embedding_dim, hidden_dim, num_layers=1, cell=cell, dropout=dropout, name=f"{cell}_lm"
    )


def rnn_width_for_budget(budget, vocabulary_size, embedding_dim, cell, dropout):
    """The recurrent width, a multiple of `WIDTH_STEP`, whose model has the parameter count nearest `budget`."""

    def parameters(width):
        return rnn_language_model(vocabulary_size, embedding_dim, width, cell, dropout).count_params()

    return _common.width_for_budget(parameters, budget, WIDTH_STEP)
