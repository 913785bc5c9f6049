"""The error every checkpoint reader and writer raises: below both formats and the tokenizer files."""


class CheckpointError(ValueError):
    """A checkpoint kzoo cannot read or write; the message names the file and the tensor or field."""
