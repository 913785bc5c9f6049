"""tf.data pipelines from text datasets to model batches, for any tokenizer.

A tokenizer is any callable mapping a string tensor of shape `[n]` to token ids of shape
`[n, None]`, ragged, or dense with trailing padding 0 (every keras-hub tokenizer does this); the
pipelines call it inside tf.data. The padding id is 0 (`PAD_ID`); the start, end, separator and
mask ids default to kzoo's WordPiece layout (see `kzoo.tokenizers.word_piece`); pass others for
another vocabulary. Sequences longer than `sequence_length` are truncated.

The text pipelines tokenize in parallel with the order kept, cache the tokenized examples in
memory (`cache=True`), shuffle when `shuffle_buffer_size` is given, batch and prefetch;
`lm_windows` starts from token ids. With the same `seed` a pipeline yields the same batches in
the same order on every run; each new pass (epoch) is reshuffled, reproducibly. `seed=None`
gives a fresh order each run.
"""

import math

import keras_hub
import tensorflow as tf
import tensorflow_text as tf_text

from kzoo import _compat
from kzoo.tokenizers.word_piece import BOS_ID
from kzoo.tokenizers.word_piece import CLS_ID
from kzoo.tokenizers.word_piece import EOS_ID
from kzoo.tokenizers.word_piece import MASK_ID
from kzoo.tokenizers.word_piece import PAD_ID
from kzoo.tokenizers.word_piece import SEP_ID

_AUTOTUNE = tf.data.AUTOTUNE
_BERT_INPUTS = ("token_ids", "segment_ids", "padding_mask")


def lm_windows(
    token_ids,
    sequence_length,
    batch_size,
    *,
    stride=None,
    shuffle_buffer_size=None,
    seed=None,
    drop_remainder=True,
):
    """Next-token prediction batches `(inputs, targets)` cut from one long token sequence.

    Window `i` holds tokens `[i * stride, i * stride + sequence_length + 1)`; `inputs` are its
    first `sequence_length` tokens and `targets` the last `sequence_length`, so
    `targets[:, t] == inputs[:, t + 1]` and the last target is the token after the window.
    Windows are cut by index from the tensor, so shuffling them is cheap: pass
    `shuffle_buffer_size` >= the number of windows for a full shuffle.

    Args:
        token_ids: the token sequence: a 1-D tensor, array or list of ints, or a
            `tf.data.Dataset` of token ids (scalars or sequences, concatenated in order).
        sequence_length: int, tokens per example.
        batch_size: int.
        stride: int, the offset between window starts; defaults to `sequence_length`
            (consecutive windows, each token a target once).
        shuffle_buffer_size: int or None; None keeps the windows in text order.
        seed: int or None, the shuffle seed.
        drop_remainder: bool, drop a last, smaller batch (keeps shapes static).

    Returns:
        A `tf.data.Dataset` of `(inputs, targets)`, both int32 `[batch_size, sequence_length]`.

    Example:
    >>> inputs, targets = next(iter(lm_windows(tf.range(10), sequence_length=4, batch_size=2)))
    >>> inputs.numpy().tolist(), targets.numpy().tolist()
    ([[0, 1, 2, 3], [4, 5, 6, 7]], [[1, 2, 3, 4], [5, 6, 7, 8]])
    """
    token_ids = _token_vector(token_ids)
    stride = stride or sequence_length
    window_length = sequence_length + 1
    num_windows = (int(tf.size(token_ids)) - window_length) // stride + 1
    if num_windows < 1:
        raise ValueError(
            f"`token_ids` has {int(tf.size(token_ids))} tokens; a window needs sequence_length + 1 = {window_length}."
        )

    def window(start):
        tokens = tf.reshape(token_ids[start : start + window_length], [window_length])
        return tokens[:-1], tokens[1:]

    # A strided range, not a map over range(num_windows): a map runs a function per element
    # while the shuffle buffer fills, a cost that grows with the buffer; the range has none.
    starts = tf.data.Dataset.range(0, num_windows * stride, stride)
    starts = _cache_and_shuffle(starts, cache=False, shuffle_buffer_size=shuffle_buffer_size, seed=seed)
    windows = starts.map(window, num_parallel_calls=_AUTOTUNE, deterministic=True)
    return windows.batch(batch_size, drop_remainder=drop_remainder).prefetch(_AUTOTUNE)


def masked_lm_batches(
    texts,
    tokenizer,
    sequence_length,
    batch_size,
    *,
    vocabulary_size=None,
    mask_selection_rate=0.15,
    mask_selection_length=None,
    start_token_id=CLS_ID,
    end_token_id=SEP_ID,
    mask_token_id=MASK_ID,
    pack=False,
    shuffle_buffer_size=None,
    seed=None,
    cache=True,
    drop_remainder=False,
):
    """BERT masked-LM batches in the input format of keras-hub's `BertMaskedLM`.

    Each text becomes `[CLS] tokens [SEP]`, padded. With `pack=True` the texts are instead
    packed as RoBERTa's full sentences: the (shuffled) texts, each followed by `[SEP]`, run on
    as one stream cut into rows `[CLS]` + `sequence_length - 1` tokens, so no row is padded and
    a long text continues on the next row (a last, partial row of each pass is dropped). For
    corpora of short texts this puts several times more tokens, and masked targets, into each
    step. `keras_hub.layers.MaskedLMMaskGenerator`
    then selects `mask_selection_rate` of the tokens (never padding, `[CLS]` or `[SEP]`) and
    replaces 80% of them with `[MASK]`, 10% with a random token and leaves 10%. Masks are
    drawn after caching and shuffling, on every pass. Without a `seed` each pass draws new
    masks. With a `seed` the masks are reproducible: every pass replays the same random draws
    over that pass's order, so give a `shuffle_buffer_size` for masks that differ between
    epochs. Masks are drawn a whole batch at a time (seeded, sequentially: the generator's
    random ops are stateful, and its row shuffles are made stateless to be reproducible).

    Args:
        texts: a `tf.data.Dataset` of strings.
        tokenizer: a keras-hub tokenizer or a callable, see the module docstring.
        sequence_length: int, tokens per example including `[CLS]` and `[SEP]`.
        batch_size: int.
        vocabulary_size: int, the range of random replacement ids; defaults to
            `tokenizer.vocabulary_size()`.
        mask_selection_rate: float, the fraction of tokens selected for prediction.
        mask_selection_length: int, the most selections per example (the length of
            `mask_positions`); defaults to `ceil(sequence_length * mask_selection_rate)`,
            which never drops a selection.
        start_token_id: int or None (no start token).
        end_token_id: int or None (no end token).
        mask_token_id: int.
        pack: bool, pack texts into full rows (needs `start_token_id` and `end_token_id`).
        shuffle_buffer_size: int or None (no shuffling); with `pack`, the texts are shuffled
            before packing, so each pass packs them differently.
        seed: int or None; fixes the shuffle and the masks.
        cache: bool, keep tokenized texts in memory after the first pass.
        drop_remainder: bool, drop a last, smaller batch.

    Returns:
        A `tf.data.Dataset` of `(x, mask_ids, mask_weights)`: `x` holds the BERT inputs
        `"token_ids"` (masked), `"segment_ids"` (zeros) and `"padding_mask"` (True on real
        tokens), all `[batch, sequence_length]`, and `"mask_positions"`
        `[batch, mask_selection_length]`; `mask_ids` are the original ids at those positions
        (the targets) and `mask_weights` 1.0 on real selections, 0.0 on padding (the sample
        weights).

    Example:
    >>> texts = tf.data.Dataset.from_tensor_slices(["the cat sat", "the hat"])
    >>> tokenizer = kzoo.data.word_piece_tokenizer(kzoo.data.train_word_piece_vocabulary(texts, 40))
    >>> x, mask_ids, mask_weights = next(iter(masked_lm_batches(texts, tokenizer, 8, 2, seed=0)))
    >>> x["token_ids"].shape, x["mask_positions"].shape
    (TensorShape([2, 8]), TensorShape([2, 2]))
    """
    if vocabulary_size is None:
        vocabulary_size = _vocabulary_size(tokenizer)
    mask_selection_length = mask_selection_length or math.ceil(sequence_length * mask_selection_rate)
    special_ids = [PAD_ID] + [i for i in (start_token_id, end_token_id) if i is not None]
    if pack and (start_token_id is None or end_token_id is None):
        raise ValueError("`pack=True` needs a `start_token_id` and an `end_token_id` to mark the rows and the texts.")
    # A row holds a token and [CLS] (packed: [SEP]s come in the stream), or [CLS] and [SEP].
    specials_per_row = 1 if pack else len(special_ids) - 1
    if sequence_length < specials_per_row + 1:
        raise ValueError(
            f"`sequence_length` must be >= {specials_per_row + 1} (room for {specials_per_row} special "
            f"token(s) and a token); received {sequence_length}."
        )
    masker = keras_hub.layers.MaskedLMMaskGenerator(
        vocabulary_size=vocabulary_size,
        mask_selection_rate=mask_selection_rate,
        mask_token_id=mask_token_id,
        mask_selection_length=mask_selection_length,
        unselectable_token_ids=special_ids,
    )

    def encode(text):
        if pack:
            return _wrap(_tokenize_one(tokenizer, text), None, end=end_token_id)
        return _wrap(_tokenize_one(tokenizer, text), sequence_length, start_token_id, end_token_id)

    def mask(token_ids):
        if seed is not None:
            # Sets the seed of this tf.data function's graph only (it is traced, not eager),
            # which fixes the op seeds of the masker's random ops.
            tf.compat.v1.set_random_seed(seed)
            _shuffle_rows_statelessly(masker, token_ids)
        masked = masker(token_ids)
        x = {
            "token_ids": masked["token_ids"],
            "segment_ids": tf.zeros_like(token_ids),
            # From the ids before masking: a random replacement may draw the padding id.
            "padding_mask": token_ids != PAD_ID,
            "mask_positions": tf.cast(masked["mask_positions"], tf.int32),
        }
        return x, tf.cast(masked["mask_ids"], tf.int32), masked["mask_weights"]

    dataset = texts.map(encode, num_parallel_calls=_AUTOTUNE, deterministic=True)
    dataset = _cache_and_shuffle(dataset, cache, shuffle_buffer_size, seed)
    if pack:
        dataset = _pack(dataset, sequence_length - 1, start_token_id)
    # Whole batches are masked in one call, which costs the CPU a fraction of one call per row.
    dataset = dataset.padded_batch(batch_size, padded_shapes=[sequence_length], drop_remainder=drop_remainder)
    dataset = dataset.map(mask, num_parallel_calls=None if seed is not None else _AUTOTUNE)
    return dataset.prefetch(_AUTOTUNE)


def classification_batches(
    examples,
    tokenizer,
    sequence_length,
    batch_size,
    *,
    start_token_id=CLS_ID,
    end_token_id=SEP_ID,
    bucket_boundaries=None,
    shuffle_buffer_size=None,
    seed=None,
    cache=True,
    drop_remainder=False,
):
    """Sequence classification batches: `[CLS] tokens [SEP]` padded with 0, and the label.

    The inputs are those of kzoo's (and keras-hub's) `BertClassifier`; a model that reads only
    token ids takes `x["token_ids"]`.

    Args:
        examples: a `tf.data.Dataset` of `(text, label)`, e.g.
            `kzoo.data.load("kzoo_rt_polarity", "train", as_supervised=True)`.
        tokenizer: a keras-hub tokenizer or a callable, see the module docstring.
        sequence_length: int, tokens per example including the start and end tokens.
        batch_size: int.
        start_token_id: int or None (no start token).
        end_token_id: int or None (no end token).
        bucket_boundaries: None to pad every batch to `sequence_length`, or a list of
            increasing lengths: examples are grouped into buckets by length, and each batch is
            padded to its bucket's length (the first boundary at or above its longest example,
            else `sequence_length`). Short texts then spend little compute on padding, while the
            batches keep a few shapes, each compiled once (XLA compiles per shape).
        shuffle_buffer_size: int or None (no shuffling).
        seed: int or None, the shuffle seed.
        cache: bool, keep tokenized examples in memory after the first pass.
        drop_remainder: bool, drop a last, smaller batch.

    Returns:
        A `tf.data.Dataset` of `(x, label)`: `x` holds the BERT inputs `"token_ids"`,
        `"segment_ids"` (zeros) and `"padding_mask"` (True on real tokens), all
        `[batch, sequence_length]` (with buckets, `[batch, longest]`); the labels are `[batch]`.

    Example:
    >>> examples = tf.data.Dataset.from_tensor_slices((["a fine film", "dull"], [1, 0]))
    >>> x, label = next(iter(classification_batches(examples, kzoo.data.character_tokenizer(), 8, 2)))
    >>> x["token_ids"].shape, label.numpy().tolist()
    (TensorShape([2, 8]), [1, 0])
    """

    def encode(text, label):
        token_ids = _wrap(_tokenize_one(tokenizer, text), sequence_length, start_token_id, end_token_id)
        return _bert_inputs(token_ids), label

    dataset = examples.map(encode, num_parallel_calls=_AUTOTUNE, deterministic=True)
    dataset = _cache_and_shuffle(dataset, cache, shuffle_buffer_size, seed)
    padded_shapes = ({key: [sequence_length] for key in _BERT_INPUTS}, [])
    dataset = _batch_or_bucket(
        dataset,
        batch_size,
        padded_shapes,
        bucket_boundaries,
        lambda x, _: tf.size(x["token_ids"]),
        drop_remainder,
        bucket_lengths=sequence_length,
    )
    return dataset.prefetch(_AUTOTUNE)


def tagging_batches(
    examples,
    tokenizer,
    sequence_length,
    batch_size,
    *,
    start_token_id=CLS_ID,
    end_token_id=SEP_ID,
    ignore_label=0,
    label_piece="first",
    bucket_boundaries=None,
    shuffle_buffer_size=None,
    seed=None,
    cache=True,
    drop_remainder=False,
):
    """Token tagging batches with word labels aligned to sub-word tokens.

    Each word is tokenized on its own; its label goes on its first piece (or its last, with
    `label_piece="last"`: where the suffix is, which tells more of a part of speech). Its other pieces,
    `[CLS]`, `[SEP]` and padding get `ignore_label` and sample weight 0, so a weighted loss
    and metrics count each word once. A word the tokenizer turns into no piece at all (only
    possible with a tokenizer that drops characters) loses its label, and words past
    `sequence_length` are truncated with theirs.

    Args:
        examples: a `tf.data.Dataset` of `(words, tags)`: a 1-D string tensor and a 1-D int
            tensor of the same length, e.g.
            `kzoo.data.load("kzoo_wnut17", "train", as_supervised=True)`.
        tokenizer: a keras-hub tokenizer or a callable, see the module docstring.
        sequence_length: int, tokens per example including the start and end tokens.
        batch_size: int.
        start_token_id: int or None (no start token).
        end_token_id: int or None (no end token).
        ignore_label: int, the label of positions that are not a word's labelled piece; a
            valid class id by default (0), so a plain sparse cross-entropy accepts it, weighted 0.
        label_piece: "first" or "last", the piece of each word that carries its label.
        bucket_boundaries: None, or increasing lengths to batch by (each batch padded to
            its bucket's length); see `classification_batches`.
        shuffle_buffer_size: int or None (no shuffling).
        seed: int or None, the shuffle seed.
        cache: bool, keep tokenized examples in memory after the first pass.
        drop_remainder: bool, drop a last, smaller batch.

    Returns:
        A `tf.data.Dataset` of `(x, labels, sample_weight)`, all `[batch, sequence_length]`:
        `x` holds the BERT inputs `"token_ids"`, `"segment_ids"` (zeros) and `"padding_mask"`
        (True on real tokens); int32 labels; float32 weights, 1.0 on each word's labelled piece,
        else 0.0.

    Example:
    >>> words, tags = tf.ragged.constant([["Hi", "Bo"]]), tf.ragged.constant([[0, 9]])
    >>> examples = tf.data.Dataset.from_tensor_slices((words, tags))
    >>> characters = kzoo.data.character_tokenizer()
    >>> batches = tagging_batches(examples, characters, 6, 1, start_token_id=None, end_token_id=None)
    >>> x, labels, weights = next(iter(batches))
    >>> labels.numpy().tolist(), weights.numpy().tolist()
    ([[0, 0, 9, 0, 0, 0]], [[1.0, 0.0, 1.0, 0.0, 0.0, 0.0]])
    """

    def special(value):
        # The values of one tensor at the start and end positions, where those exist.
        return (None if start_token_id is None else value, None if end_token_id is None else value)

    if label_piece not in ("first", "last"):
        raise ValueError(f'`label_piece` must be "first" or "last"; received label_piece={label_piece!r}.')

    def encode(words, tags):
        pieces = tokenize(tokenizer, words)
        lengths = pieces.row_lengths()
        index = tf.ragged.range(lengths).flat_values
        labelled = index == (0 if label_piece == "first" else tf.repeat(lengths - 1, lengths))
        word_labels = tf.repeat(tf.cast(tags, tf.int32), lengths)
        labels = tf.where(labelled, word_labels, ignore_label)
        token_ids = _wrap(pieces.flat_values, sequence_length, start_token_id, end_token_id)
        x = _bert_inputs(token_ids)
        labels = _wrap(labels, sequence_length, *special(ignore_label))
        sample_weight = _wrap(tf.cast(labelled, tf.float32), sequence_length, *special(0.0))
        return x, labels, sample_weight

    dataset = examples.map(encode, num_parallel_calls=_AUTOTUNE, deterministic=True)
    dataset = _cache_and_shuffle(dataset, cache, shuffle_buffer_size, seed)
    shape = [sequence_length]
    padding_values = ({"token_ids": PAD_ID, "segment_ids": 0, "padding_mask": False}, ignore_label, 0.0)
    dataset = _batch_or_bucket(
        dataset,
        batch_size,
        ({key: shape for key in _BERT_INPUTS}, shape, shape),
        bucket_boundaries,
        lambda x, *_: tf.size(x["token_ids"]),
        drop_remainder,
        padding_values,
        bucket_lengths=sequence_length,
    )
    return dataset.prefetch(_AUTOTUNE)


def seq2seq_batches(
    pairs,
    source_tokenizer,
    target_tokenizer,
    source_length,
    target_length,
    batch_size,
    *,
    start_token_id=BOS_ID,
    end_token_id=EOS_ID,
    bucket_boundaries=None,
    shuffle_buffer_size=None,
    seed=None,
    cache=True,
    drop_remainder=False,
):
    """Encoder-decoder batches for teacher forcing.

    For a pair `(x, y)`: the encoder reads `x`, the decoder reads `[BOS] y` and predicts
    `y [EOS]`, one position ahead. Padding is 0 with sample weight 0. `y` is truncated to
    `target_length - 1` tokens, so both decoder sequences fit `target_length`.

    Without `bucket_boundaries` every batch is padded to `source_length` / `target_length`.
    With them, pairs are grouped by length (the longer of encoder input and decoder target)
    with `tf.data.Dataset.bucket_by_sequence_length` and each batch is padded to its longest
    sequence, which wastes less compute on padding.

    Args:
        pairs: a `tf.data.Dataset` of `(source_text, target_text)`, e.g.
            `kzoo.data.load("kzoo_spa_eng", "train", as_supervised=True)`.
        source_tokenizer: tokenizer of the source texts, see the module docstring.
        target_tokenizer: tokenizer of the target texts (may be the same object).
        source_length: int, the most encoder tokens.
        target_length: int, the most decoder tokens, `[BOS]`/`[EOS]` included.
        batch_size: int.
        start_token_id: int, the `[BOS]` id in the target vocabulary.
        end_token_id: int, the `[EOS]` id in the target vocabulary.
        bucket_boundaries: list of increasing ints or None: bucket `i` holds lengths in
            `[boundaries[i-1], boundaries[i])`, the last bucket everything longer.
        shuffle_buffer_size: int or None (no shuffling).
        seed: int or None, the shuffle seed.
        cache: bool, keep tokenized pairs in memory after the first pass.
        drop_remainder: bool, drop smaller last batches.

    Returns:
        A `tf.data.Dataset` of `({"encoder_token_ids", "decoder_token_ids"}, targets,
        sample_weight)`: int32 `[batch, source_length]`, int32 `[batch, target_length]` twice,
        and float32 `[batch, target_length]` (1.0 on `y [EOS]`, 0.0 on padding); with
        buckets the lengths are those of each batch's longest pair.

    Example:
    >>> pairs = tf.data.Dataset.from_tensor_slices((["Go."], ["Ve."]))
    >>> characters = kzoo.data.character_tokenizer()  # [BOS], [EOS]: code points 2 and 3 (STX, ETX)
    >>> batches = seq2seq_batches(pairs, characters, characters, 4, 5, 1, start_token_id=2, end_token_id=3)
    >>> x, y, w = next(iter(batches))
    >>> x["decoder_token_ids"].numpy().tolist(), y.numpy().tolist()
    ([[2, 86, 101, 46, 0]], [[86, 101, 46, 3, 0]])
    """

    def encode(source, target):
        source_ids = _tokenize_one(source_tokenizer, source)[:source_length]
        target_ids = _tokenize_one(target_tokenizer, target)
        decoder_ids = _wrap(target_ids, target_length, start_token_id, None)
        targets = _wrap(target_ids, target_length, None, end_token_id)
        x = {"encoder_token_ids": source_ids, "decoder_token_ids": decoder_ids}
        return x, targets, tf.ones_like(targets, tf.float32)

    dataset = pairs.map(encode, num_parallel_calls=_AUTOTUNE, deterministic=True)
    dataset = _cache_and_shuffle(dataset, cache, shuffle_buffer_size, seed)
    padded_shapes = (
        {"encoder_token_ids": [source_length], "decoder_token_ids": [target_length]},
        [target_length],
        [target_length],
    )
    dataset = _batch_or_bucket(
        dataset,
        batch_size,
        padded_shapes,
        bucket_boundaries,
        lambda x, targets, _: tf.maximum(tf.size(x["encoder_token_ids"]), tf.size(targets)),
        drop_remainder,
    )
    return dataset.prefetch(_AUTOTUNE)


def conditional_lm_batches(
    pairs,
    tokenizer,
    sequence_length,
    batch_size,
    *,
    separator_token_id=SEP_ID,
    end_token_id=EOS_ID,
    bucket_boundaries=None,
    shuffle_buffer_size=None,
    seed=None,
    cache=True,
    drop_remainder=False,
):
    """Decoder-only batches for P(y | x): each pair is one sequence `x [SEP] y [EOS]`.

    A causal language model (`kzoo.models.GPTCausalLM`) trained on these batches learns to
    continue `x [SEP]` with `y [EOS]`: translation (or any conditional generation) without an
    encoder. The inputs are the sequence without its last token and the targets the sequence
    without its first, so `targets[t] == inputs[t + 1]`. Only `y [EOS]` is supervised: the
    sample weight is 1.0 where the target is a token of `y` or the final `[EOS]`, which starts
    at the position of `[SEP]` (its target is the first token of `y`), and 0.0 where the target
    is a token of `x` or the `[SEP]` itself (the source is read, never predicted) and on
    padding. The weighted loss of kzoo's `compile()` is then the cross-entropy of the target
    tokens alone, the quantity a seq2seq model's loss measures.

    Pairs longer than `sequence_length` are truncated, never dropped and never misaligned:
    beside `[SEP]` and `[EOS]` there is room for `r = sequence_length - 2` tokens; `x` keeps its
    first `min(len(x), max(r // 2, r - len(y)))` tokens and `y` its first tokens that fit in
    the rest, still followed by `[EOS]` (as `seq2seq_batches` cuts targets). A pair that fits
    is untouched; otherwise each side keeps at least half the room if it needs it.
    `conditional_lm_prompts` cuts sources at inference by the same rule.

    Without `bucket_boundaries` every batch is padded to `sequence_length - 1`. With them,
    sequences are grouped by length with `tf.data.Dataset.bucket_by_sequence_length` and each
    batch is padded to its longest, which wastes less compute on padding.

    Args:
        pairs: a `tf.data.Dataset` of `(source_text, target_text)`, e.g.
            `kzoo.data.load("kzoo_spa_eng", "train", as_supervised=True)`.
        tokenizer: one tokenizer for both sides, see the module docstring.
        sequence_length: int >= 3, the most tokens of `x [SEP] y [EOS]`: the model needs this
            many positions to generate `y [EOS]` after a prompt; inputs and targets have one
            fewer.
        batch_size: int.
        separator_token_id: int, the `[SEP]` id between source and target.
        end_token_id: int, the `[EOS]` id ending the target.
        bucket_boundaries: list of increasing ints or None: bucket `i` holds input lengths in
            `[boundaries[i-1], boundaries[i])`, the last bucket everything longer.
        shuffle_buffer_size: int or None (no shuffling).
        seed: int or None, the shuffle seed.
        cache: bool, keep tokenized pairs in memory after the first pass.
        drop_remainder: bool, drop smaller last batches.

    Returns:
        A `tf.data.Dataset` of `({"token_ids", "padding_mask"}, targets, sample_weight)`, the
        inputs of `GPTCausalLM`: int32 `[batch, sequence_length - 1]` thrice (the mask 1 on
        real tokens) and float32 weights of the same shape; with buckets the length is that
        of each batch's longest sequence.

    Example:
    >>> pairs = tf.data.Dataset.from_tensor_slices((["Hi"], ["Ola"]))
    >>> characters = kzoo.data.character_tokenizer()  # [SEP], [EOS]: code points 3 and 4 (ETX, EOT)
    >>> batches = conditional_lm_batches(pairs, characters, 8, 1, separator_token_id=3, end_token_id=4)
    >>> x, y, w = next(iter(batches))
    >>> x["token_ids"].numpy().tolist(), y.numpy().tolist(), w.numpy().tolist()
    ([[72, 105, 3, 79, 108, 97, 0]], [[105, 3, 79, 108, 97, 4, 0]], [[0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    """
    if sequence_length < 3:
        raise ValueError(
            f"`sequence_length` must be >= 3 (room for [SEP], [EOS] and a token); received {sequence_length}."
        )

    def encode(source, target):
        source_ids = _tokenize_one(tokenizer, source)
        target_ids = _tokenize_one(tokenizer, target)
        kept = _kept_source_length(tf.size(source_ids), tf.size(target_ids), sequence_length)
        target_part = _wrap(target_ids, sequence_length - kept, separator_token_id, end_token_id)
        tokens = tf.concat([source_ids[:kept], target_part], axis=0)  # x [SEP] y [EOS]
        inputs, targets = tokens[:-1], tokens[1:]
        # targets[t] is tokens[t + 1]: from t = kept on, [SEP]'s position, it is y or [EOS].
        sample_weight = tf.cast(tf.range(tf.size(targets)) >= kept, tf.float32)
        return {"token_ids": inputs, "padding_mask": tf.ones_like(inputs)}, targets, sample_weight

    dataset = pairs.map(encode, num_parallel_calls=_AUTOTUNE, deterministic=True)
    dataset = _cache_and_shuffle(dataset, cache, shuffle_buffer_size, seed)
    shape = [sequence_length - 1]
    padded_shapes = ({"token_ids": shape, "padding_mask": shape}, shape, shape)
    dataset = _batch_or_bucket(
        dataset, batch_size, padded_shapes, bucket_boundaries, lambda x, targets, _: tf.size(targets), drop_remainder
    )
    return dataset.prefetch(_AUTOTUNE)


def conditional_lm_prompts(sources, tokenizer, sequence_length, *, separator_token_id=SEP_ID):
    """The prompts `x [SEP]` from which a model trained on `conditional_lm_batches` generates `y [EOS]`.

    Each source is cut as `conditional_lm_batches` cuts a source whose target is long: to its
    first `(sequence_length - 2) // 2` tokens, which leaves the target at least as much room.

    Args:
        sources: a list of strings.
        tokenizer: the tokenizer the model was trained with.
        sequence_length: int, the `sequence_length` of the training batches: generate up to it.
        separator_token_id: int, the `[SEP]` id.

    Returns:
        A list of token-id lists (ragged), for `GPTCausalLM.generate`.

    Example:
    >>> conditional_lm_prompts(["Hi"], kzoo.data.character_tokenizer(), 8, separator_token_id=3)
    [[72, 105, 3]]
    """

    def prompt(source):
        source_ids = _tokenize_one(tokenizer, source)
        # The target is unknown: cut as for a target that fills the sequence.
        kept = _kept_source_length(tf.size(source_ids), sequence_length, sequence_length)
        return tf.concat([source_ids[:kept], [separator_token_id]], axis=0)

    sources = tf.data.Dataset.from_tensor_slices(tf.constant(sources, tf.string))
    prompts = sources.map(prompt, num_parallel_calls=_AUTOTUNE, deterministic=True)
    return [token_ids.tolist() for token_ids in prompts.as_numpy_iterator()]


def _kept_source_length(source_length, target_length, sequence_length):
    """How many source tokens `x [SEP] y [EOS]` keeps; see `conditional_lm_batches`."""
    room = sequence_length - 2
    return tf.minimum(source_length, tf.maximum(room // 2, room - target_length))


def _token_vector(token_ids):
    """A 1-D int32 tensor of all tokens in `token_ids` (a tensor, array, list or dataset)."""
    if isinstance(token_ids, tf.data.Dataset):
        # Unbatching in tf.data then concatenating large chunks is far faster than one
        # Python step per token or per line.
        chunks = list(token_ids.map(lambda ids: tf.reshape(ids, [-1])).unbatch().batch(1 << 16))
        if not chunks:
            raise ValueError("`token_ids` is an empty dataset.")
        token_ids = tf.concat(chunks, axis=0)
    token_ids = tf.convert_to_tensor(token_ids)
    if token_ids.shape.rank != 1 or not token_ids.dtype.is_integer:
        raise ValueError(
            f"`token_ids` must be a 1-D sequence of integer ids; received {token_ids.dtype.name} "
            f"of shape {token_ids.shape}."
        )
    return tf.cast(token_ids, tf.int32)


def _pack(token_ids, row_length, start_token_id, texts_per_chunk=256):
    """The 1-D sequences of `token_ids` run on as one stream, cut into `[start] + row_length`
    token rows; the last, partial row is dropped.

    The stream is cut a chunk of texts at a time, carrying the cut-off tail into the next
    chunk: a fraction of the CPU time of unbatching it one token at a time.
    """

    def cut(tail, texts):
        stream = tf.concat([tail, texts.flat_values], axis=0)
        rows = tf.size(stream) // row_length
        full_rows = tf.reshape(stream[: rows * row_length], [rows, row_length])
        return stream[rows * row_length :], tf.pad(full_rows, [[0, 0], [1, 0]], constant_values=start_token_id)

    tail = tf.zeros([0], token_ids.element_spec.dtype)
    return token_ids.ragged_batch(texts_per_chunk).scan(tail, cut).unbatch()


def _shuffle_rows_statelessly(masker, token_ids):
    """Makes `masker` (keras-hub's `MaskedLMMaskGenerator`) select reproducibly on a batch.

    Its tf-text item selector shuffles the positions of each row with a stateful op inside a
    parallel `map_fn`, whose iterations take their draws in any order, so a graph seed alone
    does not fix which row gets which draw. This swaps in the same selector with a stateless
    shuffle, keyed by a pair of numbers drawn per row outside the loop. Call it in the traced
    function, before `masker`.
    """
    row_keys = tf.random.uniform([tf.shape(token_ids)[0], 2], maxval=tf.int32.max, dtype=tf.int32)
    row_length = tf.shape(token_ids)[1]

    def shuffle(positions):  # the selectable flat positions of one row of `token_ids`
        row = tf.reduce_max(tf.concat([positions[:1], [0]], axis=0)) // row_length  # 0 if none
        noise = tf.random.stateless_uniform(tf.shape(positions), seed=row_keys[row])
        return tf.gather(positions, tf.argsort(noise))

    selector = tf_text.RandomItemSelector(
        max_selections_per_batch=masker.mask_selection_length,
        selection_rate=masker.mask_selection_rate,
        unselectable_ids=masker.unselectable_token_ids,
        shuffle_fn=shuffle,
    )
    _compat.replace_masker_selector(masker, selector)


def _bert_inputs(token_ids):
    """The BERT input dict of one unpadded sequence (one segment); padding comes at batching."""
    return {
        "token_ids": token_ids,
        "segment_ids": tf.zeros_like(token_ids),
        "padding_mask": tf.ones_like(token_ids, tf.bool),
    }


def tokenize(tokenizer, strings):
    """Ragged int32 token ids `[n, None]` of a string tensor of shape `[n]`, eagerly or in a graph.

    Args:
        tokenizer: a keras-hub tokenizer or a callable, see the module docstring; a dense
            result is read as trailing padding 0.
        strings: a string tensor of shape `[n]`.

    Example:
    >>> tokenize(kzoo.data.character_tokenizer(), tf.constant(["Hi", "a"])).to_list()
    [[72, 105], [97]]
    """
    token_ids = tokenizer(strings)
    if isinstance(token_ids, list):  # keras-hub tokenizers give Python lists in eager mode
        token_ids = tf.ragged.constant(token_ids, dtype=tf.int32, ragged_rank=1)
    if not isinstance(token_ids, tf.RaggedTensor):
        token_ids = tf.RaggedTensor.from_tensor(token_ids, padding=PAD_ID)
    return tf.cast(token_ids, tf.int32)


def _tokenize_one(tokenizer, string):
    """1-D int32 token ids of a scalar string."""
    return tokenize(tokenizer, string[tf.newaxis])[0]


def _wrap(values, max_length, start=None, end=None):
    """`[start] values [end]`, without the `None` ones, with `values` cut to fit `max_length`
    (None: not cut)."""
    prefix = [] if start is None else [tf.constant([start], values.dtype)]
    suffix = [] if end is None else [tf.constant([end], values.dtype)]
    if max_length is not None:
        values = values[: max_length - len(prefix) - len(suffix)]
    return tf.concat([*prefix, values, *suffix], axis=0)


def _batch_or_bucket(
    dataset,
    batch_size,
    padded_shapes,
    bucket_boundaries,
    element_length,
    drop_remainder,
    padding_values=None,
    bucket_lengths=None,
):
    """Batches padded to `padded_shapes`, or, with `bucket_boundaries`, batches of similar
    `element_length(*element)`, each padded to its longest element or, given the longest
    possible length `bucket_lengths`, to its bucket's length: bucket `i` holds lengths up to
    `bucket_boundaries[i]`, the last one up to `bucket_lengths`."""
    if bucket_boundaries is None:
        return dataset.padded_batch(
            batch_size, padded_shapes=padded_shapes, padding_values=padding_values, drop_remainder=drop_remainder
        )
    boundaries = list(bucket_boundaries)
    if bucket_lengths is not None:
        # tf.data pads to a boundary minus one: the boundaries just above each length.
        boundaries = [b + 1 for b in boundaries if b < bucket_lengths] + [bucket_lengths + 1]
    return dataset.bucket_by_sequence_length(
        element_length_func=element_length,
        bucket_boundaries=boundaries,
        bucket_batch_sizes=[batch_size] * (len(boundaries) + 1),
        padding_values=padding_values,
        pad_to_bucket_boundary=bucket_lengths is not None,
        drop_remainder=drop_remainder,
    )


def _cache_and_shuffle(dataset, cache, shuffle_buffer_size, seed):
    if cache:
        dataset = dataset.cache()
    if shuffle_buffer_size:
        dataset = dataset.shuffle(shuffle_buffer_size, seed=seed, reshuffle_each_iteration=True)
    return dataset


def _vocabulary_size(tokenizer):
    if not hasattr(tokenizer, "vocabulary_size"):
        raise ValueError("Pass `vocabulary_size`: the tokenizer has no `vocabulary_size()` method.")
    return int(tokenizer.vocabulary_size())
