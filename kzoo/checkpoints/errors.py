"""The error every checkpoint reader and writer raises, and how it lists many problems at once:
below both formats and the tokenizer files."""

# Problems listed in one error before "... and N more".
MAX_LISTED = 12


class CheckpointError(ValueError):
    """A checkpoint kzoo cannot read or write; the message names the file and the tensor or field."""


def problem_lines(problems):
    """`problems` as the tail of an error message: a line each, the first `MAX_LISTED` of them.

    >>> print("Cannot load x:" + problem_lines([f"tensor {i} is missing" for i in range(1, 14)]))
    Cannot load x:
    - tensor 1 is missing
    - tensor 2 is missing
    - tensor 3 is missing
    - tensor 4 is missing
    - tensor 5 is missing
    - tensor 6 is missing
    - tensor 7 is missing
    - tensor 8 is missing
    - tensor 9 is missing
    - tensor 10 is missing
    - tensor 11 is missing
    - tensor 12 is missing
    - ... and 1 more
    """
    more = len(problems) - MAX_LISTED
    return "\n- " + "\n- ".join(problems[:MAX_LISTED] + ([f"... and {more} more"] if more > 0 else []))
