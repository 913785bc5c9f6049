"""What the BERT fine-tuning recipes share: the backbone and tokenizer they start from."""

import _common
import keras

import kzoo
import kzoo.data


def backbone_and_tokenizer(args, run, texts, lowercase=True):
    """The backbone and tokenizer a fine-tuning recipe starts from.

    With `--pretrained DIR`: those of the `bert_pretrain.py` run in DIR. Otherwise a new
    `--preset` backbone and a WordPiece vocabulary of `--vocabulary-size` fitted on `texts`
    (the fine-tuning training text).
    """
    if args.pretrained:
        try:
            with run.scope():
                backbone = keras.saving.load_model(f"{args.pretrained}/{_common.MODEL_FILE}", compile=False).backbone
            tokenizer = kzoo.data.load_tokenizer(args.pretrained)
        except (OSError, ValueError) as error:
            args.parser.error(f"--pretrained {args.pretrained} is not a bert_pretrain.py output folder: {error}")
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
