"""tf.data pipelines: shifted, masked, aligned and teacher-forced batches on hand-made examples."""

import numpy as np
import pytest
import tensorflow as tf

from kzoo import models
from kzoo.data import character_tokenizer
from kzoo.data import classification_batches
from kzoo.data import conditional_lm_batches
from kzoo.data import conditional_lm_prompts
from kzoo.data import lm_windows
from kzoo.data import masked_lm_batches
from kzoo.data import seq2seq_batches
from kzoo.data import tagging_batches
from kzoo.data import word_piece_tokenizer
from kzoo.tokenizers.word_piece import CLS_ID
from kzoo.tokenizers.word_piece import EOS_ID
from kzoo.tokenizers.word_piece import MASK_ID
from kzoo.tokenizers.word_piece import SEP_ID
from kzoo.tokenizers.word_piece import SPECIAL_TOKENS
from kzoo.tokenizers.word_piece import UNK_ID

# A hand-made WordPiece vocabulary: "the"=7, "cat"=8, "##s"=9, "new"=10, "york"=11.
VOCABULARY = [*SPECIAL_TOKENS, "the", "cat", "##s", "new", "york"]


def as_lists(dataset):
    return [tf.nest.map_structure(lambda t: t.numpy().tolist(), batch) for batch in dataset]


def test_lm_windows_targets_are_inputs_shifted_by_one():
    batches = as_lists(lm_windows(tf.range(100, 121), sequence_length=4, batch_size=2))
    assert batches == [
        ([[100, 101, 102, 103], [104, 105, 106, 107]], [[101, 102, 103, 104], [105, 106, 107, 108]]),
        ([[108, 109, 110, 111], [112, 113, 114, 115]], [[109, 110, 111, 112], [113, 114, 115, 116]]),
    ]  # 5 windows of 5 tokens fit in 21; the fifth is dropped with the incomplete batch


def test_lm_windows_stride_and_a_dataset_of_lines():
    lines = tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[0, 1, 2], [3, 4, 5, 6], [7, 8, 9]]))
    inputs, targets = next(iter(lm_windows(lines, sequence_length=3, batch_size=4, stride=2)))
    assert inputs.numpy().tolist() == [[0, 1, 2], [2, 3, 4], [4, 5, 6], [6, 7, 8]]
    assert targets.numpy().tolist() == [[1, 2, 3], [3, 4, 5], [5, 6, 7], [7, 8, 9]]
    assert inputs.dtype == tf.int32


def test_lm_windows_shuffle_is_seeded_and_keeps_every_window():
    def windows(seed):
        dataset = lm_windows(np.arange(401), 4, 10, shuffle_buffer_size=100, seed=seed)
        return [inputs for batch_inputs, _ in as_lists(dataset) for inputs in batch_inputs]

    first = windows(seed=1)
    assert first == windows(seed=1)
    assert first != windows(seed=2)
    assert sorted(first) == [[i, i + 1, i + 2, i + 3] for i in range(0, 400, 4)]


def test_lm_windows_rejects_too_few_or_non_integer_tokens():
    with pytest.raises(ValueError, match="a window needs sequence_length \\+ 1 = 9"):
        lm_windows(tf.range(8), sequence_length=8, batch_size=1)
    with pytest.raises(ValueError, match="integer ids"):
        lm_windows(tf.constant([0.5, 1.5, 2.5]), sequence_length=1, batch_size=1)


def test_classification_pads_truncates_and_keeps_labels():
    examples = tf.data.Dataset.from_tensor_slices((["the cats", "new york the cat the cat"], [1, 0]))
    ((x, labels),) = as_lists(classification_batches(examples, word_piece_tokenizer(VOCABULARY), 6, 2))
    assert x["token_ids"] == [[CLS_ID, 7, 8, 9, SEP_ID, 0], [CLS_ID, 10, 11, 7, 8, SEP_ID]]
    assert x["padding_mask"] == [[True] * 5 + [False], [True] * 6]
    assert x["segment_ids"] == [[0] * 6] * 2
    assert labels == [1, 0]


def test_tagging_puts_each_label_on_the_first_sub_word_piece():
    words = tf.ragged.constant([["the", "cats", "zebra", "new", "york"]])
    tags = tf.ragged.constant([[0, 3, 5, 7, 8]])
    examples = tf.data.Dataset.from_tensor_slices((words, tags))
    batches = tagging_batches(examples, word_piece_tokenizer(VOCABULARY), 10, 1, ignore_label=-1)
    ((x, labels, weights),) = as_lists(batches)
    #           [CLS]  the  cat ##s  zebra new york [SEP] pad pad
    assert x["token_ids"] == [[CLS_ID, 7, 8, 9, UNK_ID, 10, 11, SEP_ID, 0, 0]]
    assert labels == [[-1, 0, 3, -1, 5, 7, 8, -1, -1, -1]]
    assert weights == [[0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]]
    assert x["padding_mask"] == [[True] * 8 + [False] * 2]
    assert x["segment_ids"] == [[0] * 10]


def test_tagging_can_put_each_label_on_the_last_sub_word_piece():
    words = tf.ragged.constant([["the", "cats", "new"]])
    examples = tf.data.Dataset.from_tensor_slices((words, tf.ragged.constant([[4, 3, 7]])))
    batches = tagging_batches(examples, word_piece_tokenizer(VOCABULARY), 7, 1, ignore_label=-1, label_piece="last")
    ((x, labels, weights),) = as_lists(batches)
    #                         [CLS]  the  cat ##s  new  [SEP] pad
    assert x["token_ids"] == [[CLS_ID, 7, 8, 9, 10, SEP_ID, 0]]
    assert labels == [[-1, 4, -1, 3, 7, -1, -1]]
    assert weights == [[0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match='`label_piece` must be "first" or "last"'):
        tagging_batches(examples, word_piece_tokenizer(VOCABULARY), 7, 1, label_piece="middle")


def test_tagging_truncation_keeps_ids_labels_and_weights_aligned():
    words, tags = tf.ragged.constant([["cats", "cats", "cats"]]), tf.ragged.constant([[1, 2, 3]])
    examples = tf.data.Dataset.from_tensor_slices((words, tags))
    ((x, labels, weights),) = as_lists(tagging_batches(examples, word_piece_tokenizer(VOCABULARY), 5, 1))
    assert x["token_ids"] == [[CLS_ID, 8, 9, 8, SEP_ID]]
    assert labels == [[0, 1, 0, 2, 0]]
    assert weights == [[0.0, 1.0, 0.0, 1.0, 0.0]]


def test_seq2seq_teacher_forcing():
    pairs = tf.data.Dataset.from_tensor_slices((["the cat"], ["new york"]))
    tokenizer = word_piece_tokenizer(VOCABULARY)
    ((x, targets, weights),) = as_lists(seq2seq_batches(pairs, tokenizer, tokenizer, 4, 5, 1))
    assert x["encoder_token_ids"] == [[7, 8, 0, 0]]
    assert x["decoder_token_ids"] == [[5, 10, 11, 0, 0]]  # [BOS] new york
    assert targets == [[10, 11, 6, 0, 0]]  # new york [EOS]
    assert weights == [[1.0, 1.0, 1.0, 0.0, 0.0]]


def test_seq2seq_truncates_the_target_to_fit_bos_and_eos():
    pairs = tf.data.Dataset.from_tensor_slices((["cats cats cats"], ["the cat the cat"]))
    tokenizer = word_piece_tokenizer(VOCABULARY)
    ((x, targets, weights),) = as_lists(seq2seq_batches(pairs, tokenizer, tokenizer, 3, 4, 1))
    assert x["encoder_token_ids"] == [[8, 9, 8]]
    assert x["decoder_token_ids"] == [[5, 7, 8, 7]]
    assert targets == [[7, 8, 7, 6]]
    assert weights == [[1.0] * 4]


def test_seq2seq_length_buckets_pad_each_batch_to_its_longest_pair():
    sources = ["ab", "abcdefghij", "abc", "abcdefghijkl", "a", "abcdefghi"]
    pairs = tf.data.Dataset.from_tensor_slices((sources, sources))
    tokenizer = character_tokenizer()
    dataset = seq2seq_batches(
        pairs, tokenizer, tokenizer, 32, 32, 2, start_token_id=2, end_token_id=3, bucket_boundaries=[6]
    )
    batches = {}
    for x, targets, weights in as_lists(dataset):
        texts = tuple("".join(chr(i) for i in row if i) for row in x["encoder_token_ids"])
        batches[texts] = (len(x["encoder_token_ids"][0]), len(targets[0]))
        for text, row, weight in zip(texts, targets, weights, strict=True):
            assert row == [*map(ord, text), 3] + [0] * (len(row) - len(text) - 1)
            assert weight == [1.0] * (len(text) + 1) + [0.0] * (len(row) - len(text) - 1)
    # Lengths max(len(x), len(y) + 1) below 6 and from 6 up never share a batch.
    assert batches == {
        ("ab", "abc"): (3, 4),
        ("abcdefghij", "abcdefghijkl"): (12, 13),
        ("a",): (1, 2),
        ("abcdefghi",): (9, 10),
    }


def test_conditional_lm_sequence_shift_and_target_side_weights():
    pairs = tf.data.Dataset.from_tensor_slices((["the cats", "york"], ["new york", "the"]))
    ((x, targets, weights),) = as_lists(conditional_lm_batches(pairs, word_piece_tokenizer(VOCABULARY), 8, 2))
    # the cat ##s [SEP] new york [EOS]  and  york [SEP] the [EOS]: inputs drop the last token.
    assert x["token_ids"] == [[7, 8, 9, SEP_ID, 10, 11, 0], [11, SEP_ID, 7, 0, 0, 0, 0]]
    assert x["padding_mask"] == [[1] * 6 + [0], [1] * 3 + [0] * 4]
    assert targets == [[8, 9, SEP_ID, 10, 11, EOS_ID, 0], [SEP_ID, 7, EOS_ID, 0, 0, 0, 0]]
    # 1.0 exactly where the target is the Spanish side or [EOS]: from [SEP]'s position on.
    assert weights == [[0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]]
    for inputs, row, mask in zip(x["token_ids"], targets, x["padding_mask"], strict=True):
        length = sum(mask)
        assert row[: length - 1] == inputs[1:length]


def test_conditional_lm_truncation_keeps_sep_eos_and_alignment():
    # sequence_length 6 leaves room for 4 tokens beside [SEP] and [EOS].
    long = "the cat the cat"  # 4 tokens
    pairs = tf.data.Dataset.from_tensor_slices(([long, long, "york"], ["new york new york", "york", long]))
    tokenizer = word_piece_tokenizer(VOCABULARY)
    ((x, targets, weights),) = as_lists(conditional_lm_batches(pairs, tokenizer, 6, 3))
    sequences = [inputs + [row[-1]] for inputs, row in zip(x["token_ids"], targets, strict=True)]
    assert sequences == [
        [7, 8, SEP_ID, 10, 11, EOS_ID],  # both long: half the room each
        [7, 8, 7, SEP_ID, 11, EOS_ID],  # a short target leaves the source more
        [11, SEP_ID, 7, 8, 7, EOS_ID],  # a short source leaves the target more
    ]
    assert weights == [[0.0, 0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0, 1.0, 1.0]]
    # At inference the target is unknown: sources are cut to half the room.
    assert conditional_lm_prompts([long, "york", ""], tokenizer, 6) == [[7, 8, SEP_ID], [11, SEP_ID], [SEP_ID]]
    with pytest.raises(ValueError, match="must be >= 3"):
        conditional_lm_batches(pairs, tokenizer, 2, 1)


def test_conditional_lm_length_buckets_pad_each_batch_to_its_longest_sequence():
    sources = ["ab", "abcdefghij", "abc", "abcdefghijkl"]
    pairs = tf.data.Dataset.from_tensor_slices((sources, sources))
    dataset = conditional_lm_batches(
        pairs, character_tokenizer(), 64, 2, separator_token_id=3, end_token_id=4, bucket_boundaries=[10]
    )
    lengths = sorted(len(targets[0]) for _, targets, _ in as_lists(dataset))
    # Inputs below 10 tokens ("ab", "abc": 5 and 7) and from 10 up (21 and 25) never share a batch.
    assert lengths == [7, 25]


def test_conditional_lm_loss_ignores_the_source_side():
    """kzoo's default GPTCausalLM loss on these batches is the cross-entropy of the target tokens alone."""
    pairs = tf.data.Dataset.from_tensor_slices((["the cats new", "york"], ["new york", "the cat the"]))
    ((x, targets, weights),) = conditional_lm_batches(pairs, word_piece_tokenizer(VOCABULARY), 8, 2)
    x, targets, weights = tf.nest.map_structure(np.asarray, (x, targets, weights))
    backbone = models.GPTBackbone(
        vocabulary_size=len(VOCABULARY), num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32,
        max_sequence_length=8, dropout=0.0,
    )  # fmt: skip
    lm = models.GPTCausalLM(backbone)
    lm.compile()  # kzoo's defaults

    def loss(targets):
        return lm.evaluate(x, targets, sample_weight=weights, verbose=0, return_dict=True)["loss"]

    log_probabilities = tf.nn.log_softmax(lm.predict_on_batch(x)).numpy()

    def target_side_cross_entropy(targets):
        cross_entropy = -np.take_along_axis(log_probabilities, targets[..., None], axis=-1)[..., 0]
        return cross_entropy[weights == 1].mean()

    assert loss(targets) == pytest.approx(target_side_cross_entropy(targets), rel=1e-5)
    # Other targets on the source, [SEP]-predicting and padding positions: the same loss.
    other_source_side = np.where(weights == 0, (targets + 1) % len(VOCABULARY), targets)
    assert loss(other_source_side) == pytest.approx(loss(targets), rel=1e-6)
    # Another target token on the Spanish side: another loss.
    other_target_side = targets.copy()
    other_target_side[0, 4] = 7  # "new" -> "the"
    assert weights[0, 4] == 1
    assert loss(other_target_side) == pytest.approx(target_side_cross_entropy(other_target_side), rel=1e-5)
    assert abs(loss(other_target_side) - loss(targets)) > 1e-3


def test_masked_lm_batches_mask_only_real_tokens_and_record_the_originals():
    texts = tf.data.Dataset.from_tensor_slices([f"sentence number {i} is here" for i in range(64)])
    tokenizer = character_tokenizer()
    batches = as_lists(masked_lm_batches(texts, tokenizer, 32, 16, mask_selection_rate=0.25, seed=0))
    assert len(batches) == 4
    mask_tokens = selections = 0
    for i, (x, mask_ids, mask_weights) in enumerate(batches):
        assert np.shape(x["mask_positions"]) == (16, 8)  # ceil(32 * 0.25)
        for row in range(16):
            text = f"sentence number {16 * i + row} is here"
            original = [CLS_ID, *map(ord, text), SEP_ID] + [0] * (30 - len(text))
            assert x["padding_mask"][row] == [True] * (len(text) + 2) + [False] * (30 - len(text))
            assert x["segment_ids"][row] == [0] * 32
            n = int(sum(mask_weights[row]))
            assert n == -(-len(text) // 4)  # ceil(0.25 * selectable tokens)
            positions = x["mask_positions"][row][:n]
            assert all(1 <= p <= len(text) for p in positions)  # never [CLS], [SEP] or padding
            assert mask_ids[row][:n] == [original[p] for p in positions]
            restored = list(x["token_ids"][row])
            for p, token in zip(positions, mask_ids[row][:n], strict=True):
                restored[p] = token
            assert restored == original
            unchanged = [p for p in range(32) if p not in positions]
            assert [x["token_ids"][row][p] for p in unchanged] == [original[p] for p in unchanged]
            mask_tokens += sum(x["token_ids"][row][p] == MASK_ID for p in positions)
            selections += n
    assert 0.7 < mask_tokens / selections < 0.9  # BERT's 80% [MASK]


@pytest.mark.parametrize("seed", [0, None])
def test_masked_lm_selection_is_uniform_over_the_selectable_positions(seed):
    # Seeded, each row is shuffled statelessly from its own key: a bad key or shuffle would
    # favour some positions (the first ones, say) or give every row the same ones.
    texts = tf.data.Dataset.from_tensor_slices(["abcdefghijklmnopqrstuvwxyz0123"] * 1000)
    batches = masked_lm_batches(texts, character_tokenizer(), 32, 100, mask_selection_rate=0.25, seed=seed)
    rows = [  # the selected positions of each row
        positions[selected > 0]
        for x, _, weights in batches
        for positions, selected in zip(x["mask_positions"].numpy(), weights.numpy())
    ]
    assert len(rows) == 1000
    frequency = np.bincount(np.concatenate(rows), minlength=32) / 1000
    assert frequency[0] == frequency[31] == 0  # [CLS], [SEP]
    np.testing.assert_allclose(frequency[1:31], 8 / 30, atol=0.045)  # ceil(0.25 * 30) of 30; 1000 rows: sd 0.014
    # Identical rows, different selections, within each batch and across the 10 batches: keys
    # shared by the rows of a batch would leave at most 10 distinct rows, keys repeated by every
    # batch at most 100 (1000 uniform draws of C(30, 8) = 5.9 million hold 0.09 repeats on average).
    assert len({tuple(sorted(row)) for row in rows}) > 990


@pytest.mark.parametrize("copies", [1, 100])  # 100: 600 texts, more than one chunk of the packer
def test_packed_masked_lm_rows_run_the_texts_on_without_padding(copies):
    texts = ["ab", "cde", "f", "ghijk", "lm", "nopq"] * copies  # 6 texts + 6 [SEP]s = 23 stream tokens
    stream = [token for text in texts for token in [*map(ord, text), SEP_ID]]
    dataset = masked_lm_batches(
        tf.data.Dataset.from_tensor_slices(texts), character_tokenizer(), 6, 2, pack=True, mask_selection_rate=0.4
    )
    batches = as_lists(dataset)
    row_count = len(stream) // 5  # rows of 5 stream tokens; 3 left over of 23
    assert [len(x["token_ids"]) for x, _, _ in batches] == [2] * (row_count // 2) + [1] * (row_count % 2)
    rows, selected = [], 0
    for x, mask_ids, mask_weights in batches:
        assert all(all(mask) for mask in x["padding_mask"])
        selected += sum(map(sum, mask_weights))
        for row, positions, ids, weights in zip(x["token_ids"], x["mask_positions"], mask_ids, mask_weights):
            restored = list(row)
            for p, token, weight in zip(positions, ids, weights):
                if weight:
                    assert p > 0 and token != SEP_ID  # [CLS] and [SEP] are never selected
                    restored[p] = token
            rows.append(restored)
    assert [row[0] for row in rows] == [CLS_ID] * row_count
    assert [token for row in rows for token in row[1:]] == stream[: 5 * row_count]
    assert selected > 0


def test_masked_lm_refuses_packing_without_a_start_token_and_rows_without_room_for_a_token():
    # Once, not per packing test above: each pipeline built traces the masker (seconds).
    texts = ["ab", "cde", "f", "ghijk", "lm", "nopq"]
    with pytest.raises(ValueError, match="start_token_id"):
        masked_lm_batches(
            tf.data.Dataset.from_tensor_slices(texts), character_tokenizer(), 6, 2, pack=True, start_token_id=None
        )
    for pack, shortest in ((True, 2), (False, 3)):  # [CLS] + a token; [CLS] a token [SEP]
        with pytest.raises(ValueError, match=rf"`sequence_length` must be >= {shortest} .*received {shortest - 1}"):
            masked_lm_batches(
                tf.data.Dataset.from_tensor_slices(texts), character_tokenizer(), shortest - 1, 2, pack=pack
            )
        assert as_lists(
            masked_lm_batches(tf.data.Dataset.from_tensor_slices(texts), character_tokenizer(), shortest, 2, pack=pack)
        )


@pytest.mark.parametrize("pipeline", ["masked_lm", "classification", "seq2seq", "conditional_lm"])
def test_pipelines_are_deterministic_under_a_seed(pipeline):
    # tests/conftest.py seeds TensorFlow globally, which alone would make random ops repeat;
    # unset it so that only the pipelines' own `seed` can.
    tf.random.set_seed(None)
    texts = [f"the cat {i} sat on mat {i % 7}" for i in range(50)]
    tokenizer = character_tokenizer()

    def batches(seed):
        if pipeline == "masked_lm":
            dataset = tf.data.Dataset.from_tensor_slices(texts)
            dataset = masked_lm_batches(dataset, tokenizer, 24, 8, shuffle_buffer_size=50, seed=seed)
        elif pipeline == "classification":
            examples = tf.data.Dataset.from_tensor_slices((texts, list(range(50))))
            dataset = classification_batches(examples, tokenizer, 24, 8, shuffle_buffer_size=50, seed=seed)
        elif pipeline == "seq2seq":
            pairs = tf.data.Dataset.from_tensor_slices((texts, texts))
            dataset = seq2seq_batches(pairs, tokenizer, tokenizer, 24, 24, 8, shuffle_buffer_size=50, seed=seed)
        else:
            pairs = tf.data.Dataset.from_tensor_slices((texts, texts))
            dataset = conditional_lm_batches(pairs, tokenizer, 48, 8, shuffle_buffer_size=50, seed=seed)
        return dataset

    dataset = batches(seed=3)
    first_epoch, second_epoch = as_lists(dataset), as_lists(dataset)
    assert as_lists(batches(seed=3)) == first_epoch
    assert as_lists(batches(seed=4)) != first_epoch
    assert second_epoch != first_epoch  # reshuffled (and re-masked) every epoch


def test_tokenize_gives_the_same_ragged_ids_eagerly_in_a_graph_and_from_dense_output():
    from kzoo.data.pipelines import tokenize

    strings = tf.constant(["Hi!", "", "a"])
    expected = [[72, 105, 33], [], [97]]
    characters = character_tokenizer()
    assert tokenize(characters, strings).to_list() == expected  # keras-hub returns lists eagerly
    assert tf.function(lambda s: tokenize(characters, s))(strings).to_list() == expected  # ragged in a graph

    def dense(s):  # a tokenizer that pads with 0 instead
        return tf.ragged.constant(characters(s)).to_tensor()

    assert tokenize(dense, strings).to_list() == expected
