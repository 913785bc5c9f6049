"""What the BERT fine-tuning recipes share: the backbone and tokenizer they start from."""

import _common

import kzoo
import kzoo.data


def backbone_and_tokenizer(args, run, texts, lowercase=True):
    """The backbone and tokenizer a fine-tuning recipe starts from.

    With `--checkpoint`: the pretrained backbone and its tokenizer (`_common.load_checkpoint`:
    MiniLM, a Hugging Face folder or a `bert_pretrain.py` run). Otherwise a new `--preset`
    backbone and a WordPiece vocabulary of `--vocabulary-size` fitted on `texts` (the
    fine-tuning training text).
    """
    if args.checkpoint:
        backbone, tokenizer = _common.load_checkpoint(args, run, kzoo.models.BertBackbone)
        if args.sequence_length > backbone.max_sequence_length:
            args.parser.error(
                f"--sequence-length {args.sequence_length} exceeds the pretrained backbone's "
                f"{backbone.max_sequence_length} positions."
            )
        return backbone, tokenizer
    tokenizer = _common.word_piece_tokenizer(args, texts, lowercase)
    with run.scope():
        backbone = kzoo.models.BertBackbone.from_preset(
            args.preset, vocabulary_size=tokenizer.vocabulary_size(), max_sequence_length=args.sequence_length
        )
    return backbone, tokenizer
