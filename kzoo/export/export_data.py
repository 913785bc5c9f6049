"""The examples an export is verified and calibrated on: a kzoo dataset, or synthetic ids."""

import dataclasses
from pathlib import Path

import numpy as np

# The data an export of a causal LM with a tokenizer is checked on unless told otherwise: text.
# Uniformly random ids are inputs no language model was trained on: its quantized files' losses
# on them say little of what a user will see, and a checkpoint with large activations (Qwen2.5)
# is ill-conditioned there: Keras' own float32 logits can be off its float64 ones by more than
# the float32 tolerance (BENCHMARKS.md).
DEFAULT_TEXT = "kzoo_tiny_shakespeare"

# The `representative_data` name of `synthetic_data`.
SYNTHETIC = "synthetic"


@dataclasses.dataclass
class ExportData:
    """Held-out and representative examples of one model, as NumPy arrays.

    Attributes:
        held_out: `{input name: (N, T) int32}`, the model's inputs at its full
            length T, for the comparisons with Keras and the quality metrics.
        targets: int32 labels of `held_out`, `(N,)` for classifiers, else
            `(N, T)` (`(N, M)` for masked LMs); None for synthetic data, where
            the Keras model's own argmax predictions serve as labels.
        sample_weight: float32, shaped as `targets`, 0 where a target does
            not count; None for all ones.
        representative: `{input name: (M, T) int32}` for int8 calibration.
        source: one line saying where the examples come from.
    """

    held_out: dict
    targets: object
    sample_weight: object
    representative: dict
    source: str


def synthetic_data(names, vocabulary_size, length, num_examples, num_representative, seed=0):
    """Uniformly random token ids in [1, V) (0 is padding), full padding masks,
    one segment, and 15% of positions as masked-LM positions.

    Args:
        names: the model's input names.
        vocabulary_size: int, V.
        length: int, T.
        num_examples: int, N held-out rows.
        num_representative: int, M calibration rows.
        seed: int.
    """
    rng = np.random.default_rng(seed)

    def inputs(rows):
        arrays = {}
        for name in names:
            if name == "padding_mask":
                arrays[name] = np.ones((rows, length), np.int32)
            elif name == "segment_ids":
                arrays[name] = np.zeros((rows, length), np.int32)
            elif name == "mask_positions":
                count = max(1, round(0.15 * length))
                arrays[name] = np.sort(
                    np.stack([rng.choice(length, count, replace=False) for _ in range(rows)]), axis=1
                ).astype(np.int32)
            else:
                arrays[name] = rng.integers(1, vocabulary_size, (rows, length)).astype(np.int32)
        return arrays

    return ExportData(
        held_out=inputs(num_examples),
        targets=None,
        sample_weight=None,
        representative=inputs(num_representative),
        source=f"synthetic: uniform token ids in [1, {vocabulary_size}), seed {seed}",
    )


def text_data(tokenizer, names, length, num_examples, num_representative, seed=0, source_dir=None):
    """Rows of `DEFAULT_TEXT` (Tiny Shakespeare, read from kzoo's corpora without
    tensorflow-datasets) for a causal LM: the held-out rows are consecutive windows of its
    validation text, as `dataset_data` cuts them; the calibration rows windows at seeded offsets
    in as much of its train text.

    Args:
        tokenizer: the model's tokenizer.
        names: the model's input names (`token_ids`, `padding_mask`).
        length: int, the sequence length T of every row.
        num_examples: int, N held-out rows.
        num_representative: int, M calibration rows.
        seed: int, the offsets of the calibration rows.
        source_dir: where the corpora are (`kzoo.data.corpora.corpus_dir`).

    Raises:
        FileNotFoundError: where the corpus is not installed.
        ValueError: where the validation text has fewer than N windows.
    """
    from kzoo.data import corpora  # plain Python: no tensorflow-datasets
    from kzoo.data.readers import DataFileError

    try:
        splits = corpora.read_tiny_shakespeare(source_dir)
    except DataFileError as error:
        if Path(error.path).exists():  # there, but unreadable
            raise
        raise FileNotFoundError(str(error)) from error
    validation = splits["validation"][0]["text"]
    held_out = np.asarray(tokenizer(validation)).astype(np.int32)
    windows = (len(held_out) - 1) // length
    if windows < num_examples:
        raise ValueError(
            f"{DEFAULT_TEXT}'s validation text holds {windows} rows of {length} tokens, fewer than the "
            f"{num_examples} held-out rows asked for: pass a smaller num_examples (--num-examples) or max_length."
        )
    train = np.asarray(tokenizer(splits["train"][0]["text"][: len(validation)])).astype(np.int32)
    offsets = np.random.default_rng(seed).integers(0, max(1, len(train) - length), num_representative)

    def rows(ids, starts):
        x = np.stack([ids[start : start + length] for start in starts])
        return {name: np.ones_like(x) if name == "padding_mask" else x for name in names}

    starts = np.arange(num_examples) * length
    return ExportData(
        held_out=rows(held_out, starts),
        targets=np.stack([held_out[start + 1 : start + length + 1] for start in starts]),
        sample_weight=None,
        representative=rows(train, offsets),
        source=f"{DEFAULT_TEXT}: calibration from 'train', held-out from 'validation'",
    )


def dataset_data(
    name, tokenizer, task, names, vocabulary_size, length, num_examples, num_representative, seed=0, data_dir=None
):
    """Examples from a kzoo dataset through kzoo's tf.data pipelines.

    Calibration rows come from the "train" split (shuffled with `seed`), the
    held-out rows from "validation", or "test" where there is none.

    Args:
        name: a `kzoo.data.load` dataset name, e.g. "kzoo_tiny_shakespeare".
        tokenizer: the model's tokenizer (`kzoo.data.load_tokenizer`).
        task: the model's serving task (`kzoo.export.serving_module.task_of`).
        names: the model's input names.
        vocabulary_size: int.
        length: int, the sequence length T of every row.
        num_examples: int, N held-out rows.
        num_representative: int, M calibration rows.
        seed: int, the shuffle seed of the calibration rows.
        data_dir: the tensorflow-datasets folder (`kzoo.data.load`'s `data_dir`).
    """
    from kzoo import data  # imports tensorflow-datasets: only on this path

    def load(split, as_supervised=False):
        return data.load(name, split, data_dir=data_dir, as_supervised=as_supervised)

    from kzoo.export.serving_signatures import classifier_special_ids

    # BERT inputs wrap their text in the tokenizer's [CLS] and [SEP] (not wrapped without them).
    cls_id, sep_id = classifier_special_ids(tokenizer)
    special = {"start_token_id": cls_id, "end_token_id": sep_id}
    mask_id = getattr(tokenizer, "mask_token_id", None)
    masking = {} if mask_id is None else {"mask_token_id": int(mask_id)}

    def batch(split, rows, shuffle):
        shuffle_buffer_size = 10_000 if shuffle else None
        if task in ("causal_lm", "lm") and "mask_positions" not in names:
            texts = _texts(load(split))
            token_ids = texts.map(lambda text: tokenizer(text[None])[0])
            windows = data.lm_windows(token_ids, length, rows, shuffle_buffer_size=shuffle_buffer_size, seed=seed)
            x, targets = next(iter(windows))
            x = {"token_ids": x, "padding_mask": np.ones_like(x)}
            return x, targets, None
        if "mask_positions" in names:
            batches = data.masked_lm_batches(
                _texts(load(split)),
                tokenizer,
                length,
                rows,
                vocabulary_size=vocabulary_size,
                shuffle_buffer_size=shuffle_buffer_size,
                seed=seed,
                **special,
                **masking,
            )
        elif task == "classifier":
            batches = data.classification_batches(
                load(split, as_supervised=True),
                tokenizer,
                length,
                rows,
                shuffle_buffer_size=shuffle_buffer_size,
                seed=seed,
                **special,
            )
        elif task == "tagger":
            batches = data.tagging_batches(
                load(split, as_supervised=True),
                tokenizer,
                length,
                rows,
                shuffle_buffer_size=shuffle_buffer_size,
                seed=seed,
                **special,
            )
        else:  # seq2seq: one tokenizer for both sides, as the tied-embedding model needs
            batches = data.seq2seq_batches(
                load(split, as_supervised=True),
                tokenizer,
                tokenizer,
                length,
                length,
                rows,
                shuffle_buffer_size=shuffle_buffer_size,
                seed=seed,
            )
        x, targets, *weights = next(iter(batches))
        return x, targets, (weights[0] if weights else None)

    def arrays(x):
        x = {key: np.asarray(value).astype(np.int32) for key, value in x.items()}
        return {name: x[name] for name in names}

    held_out_split = _held_out_split(load)
    x, targets, weights = batch(held_out_split, num_examples, shuffle=False)
    representative, _, _ = batch("train", num_representative, shuffle=True)
    return ExportData(
        held_out=arrays(x),
        targets=np.asarray(targets).astype(np.int32),
        sample_weight=None if weights is None else np.asarray(weights, np.float32),
        representative=arrays(representative),
        source=f"{name}: calibration from 'train', held-out from {held_out_split!r}",
    )


def _texts(dataset):
    """The text feature of a dataset of feature dicts ("text", else the first string)."""
    import tensorflow as tf

    spec = dataset.element_spec
    key = "text" if "text" in spec else next(k for k, s in spec.items() if s.dtype == tf.string)
    return dataset.map(lambda features: features[key])


def _held_out_split(load):
    for split in ("validation", "test"):
        try:
            load(split)
            return split
        except (ValueError, KeyError):
            continue
    raise ValueError("The dataset has neither a 'validation' nor a 'test' split to hold out.")


def crop(inputs, length):
    """The first `length` positions of each row (masked-LM positions clipped into them)."""
    cropped = {}
    for name, value in inputs.items():
        cropped[name] = np.minimum(value, length - 1) if name == "mask_positions" else value[:, :length]
    return cropped
