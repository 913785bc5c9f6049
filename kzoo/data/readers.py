"""Strict readers for corpus files: plain, `.xz` or `.gz`, always UTF-8.

Every problem raises `DataFileError`, a `ValueError` that names the file and, where there is
one, the line: a missing or empty file, a damaged archive, bytes that are not UTF-8, a line in
the wrong format, a label outside the documented set. Nothing is skipped or repaired silently.
"""

import gzip
import json
import lzma
from pathlib import Path

_OPENERS = {".xz": lzma.open, ".gz": gzip.open}


class DataFileError(ValueError):
    """A corpus file is missing, empty, not UTF-8, or not in its documented format.

    The message starts with the file and, where the problem is on one line, its 1-based number.

    Args:
        path: the file.
        message: what is wrong.
        line_number: int, the 1-based line, or None for the file as a whole.

    Example:
    >>> str(DataFileError("spa.txt", "expected 2 tab-separated fields, found 1", 7))
    'spa.txt, line 7: expected 2 tab-separated fields, found 1'
    """

    def __init__(self, path, message, line_number=None):
        where = str(path) if line_number is None else f"{path}, line {line_number}"
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line_number = line_number


def find_file(directory, name):
    """The path of the corpus file `name` in `directory`: compressed (`name.xz`, `name.gz`) or plain.

    Args:
        directory: the folder to look in.
        name: the file's name without a compression suffix, e.g. "spa.txt".

    Returns:
        The one matching `Path`; `DataFileError` if there is none, or more than one.

    Example:
    >>> find_file(kzoo.data.corpus_dir() / "spa-eng", "spa.txt").name
    'spa.txt.xz'
    """
    directory = Path(directory)
    candidates = [directory / (name + suffix) for suffix in ("", *_OPENERS)]
    found = [path for path in candidates if path.is_file()]
    if not found:
        tried = ", ".join(path.name for path in candidates)
        raise DataFileError(directory / name, f"no such file (looked for {tried} in {directory}).")
    if len(found) > 1:
        raise DataFileError(directory / name, f"found {[p.name for p in found]}; keep only one of them.")
    return found[0]


def read_text(path):
    """The whole file as a string, decompressed by its suffix and decoded as strict UTF-8.

    Args:
        path: a plain, `.xz` or `.gz` file.

    Example:
    >>> len(read_text(find_file(kzoo.data.corpus_dir() / "tinyshakespeare", "input.txt")))
    1115394
    """
    path = Path(path)
    opener = _OPENERS.get(path.suffix, open)
    try:
        with opener(path, "rb") as file:
            data = file.read()
    except FileNotFoundError as error:
        raise DataFileError(path, "no such file.") from error
    except (OSError, EOFError, lzma.LZMAError) as error:
        raise DataFileError(path, f"cannot be read ({error}).") from error
    if not data:
        raise DataFileError(path, "the file is empty.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line_number = data.count(b"\n", 0, error.start) + 1
        bad = data[error.start : error.end]
        raise DataFileError(path, f"bytes {bad!r} are not valid UTF-8.", line_number) from error


def read_lines(path):
    """The file's lines as `(line_number, line)` pairs, numbered from 1, without line ends.

    Lines end at "\\n" (or "\\r\\n") only: `str.splitlines` would also break at U+0085, which
    occurs inside sentences of the sentiment corpus.

    Args:
        path: a plain, `.xz` or `.gz` UTF-8 file.

    Example:
    >>> read_lines(find_file(kzoo.data.corpus_dir() / "spa-eng", "spa.txt"))[0]
    (1, 'Go.\\tVe.')
    """
    lines = read_text(path).split("\n")
    if lines[-1] == "":
        lines.pop()
    return [(number, line.removesuffix("\r")) for number, line in enumerate(lines, start=1)]


def read_tab_separated(path, num_fields, split_on_last_tab=False):
    """`(line_number, fields)` for each line of a tab-separated file; no quoting, no empty fields.

    Args:
        path: a plain, `.xz` or `.gz` UTF-8 file.
        num_fields: int, how many fields each line must have.
        split_on_last_tab: bool; if True, tabs before the last `num_fields - 1` ones stay in
            the first field instead of making the line wrong.

    Example:
    >>> read_tab_separated(find_file(kzoo.data.corpus_dir() / "spa-eng", "spa.txt"), 2)[0]
    (1, ['Go.', 'Ve.'])
    """
    return [
        (number, split_fields(path, number, line, num_fields, split_on_last_tab)) for number, line in read_lines(path)
    ]


def split_fields(path, line_number, line, num_fields, split_on_last_tab=False):
    """The `num_fields` tab-separated fields of one line, none of them blank.

    Args:
        path: the file the line was read from, for the error message.
        line_number: int, the line's number, for the error message.
        line: str, the line without its line end.
        num_fields: int, how many fields the line must have.
        split_on_last_tab: bool; if True, tabs before the last `num_fields - 1` ones stay in
            the first field instead of making the line wrong.

    Example:
    >>> split_fields("imdb_labelled.txt", 1, "A very, very slow-moving film.  \\t0", 2)
    ['A very, very slow-moving film.  ', '0']
    """
    fields = line.rsplit("\t", num_fields - 1) if split_on_last_tab else line.split("\t")
    if len(fields) != num_fields:
        raise DataFileError(
            path, f"expected {num_fields} tab-separated fields, found {len(fields)}: {line!r}.", line_number
        )
    if not all(field.strip() for field in fields):
        raise DataFileError(path, f"a field is blank: {line!r}.", line_number)
    return fields


def read_blocks(path):
    """The file's blocks of lines separated by blank (or whitespace-only) lines.

    This is the sentence layout of CoNLL files. Each block is a list of `(line_number, line)`.

    Args:
        path: a plain, `.xz` or `.gz` UTF-8 file.

    Example:
    >>> read_blocks(find_file(kzoo.data.corpus_dir() / "wnut17", "wnut17train.conll"))[0][:2]
    [(1, '@paulwalk\\tO'), (2, 'It\\tO')]
    """
    blocks, block = [], []
    for number, line in read_lines(path):
        if line.strip():
            block.append((number, line))
        elif block:
            blocks.append(block)
            block = []
    if block:
        blocks.append(block)
    return blocks


def read_json_lines(path, required_keys):
    """`(line_number, record)` for each line of a JSON-lines file, each record an object.

    Args:
        path: a plain, `.xz` or `.gz` UTF-8 file.
        required_keys: keys every record must have.

    Example:
    >>> path = find_file(kzoo.data.corpus_dir() / "scitldr-a", "train.jsonl")
    >>> read_json_lines(path, ["source", "target"])[0][1]["target"]
    ['We provide necessary and sufficient analytical forms ...']
    """
    records = []
    for number, line in read_lines(path):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataFileError(path, f"not valid JSON ({error}).", number) from error
        if not isinstance(record, dict):
            raise DataFileError(path, f"expected a JSON object, found {type(record).__name__}.", number)
        missing = [key for key in required_keys if key not in record]
        if missing:
            raise DataFileError(path, f"the record has no {missing}.", number)
        records.append((number, record))
    return records


def check_label(path, line_number, label, names):
    """`label` if it is one of `names`, else `DataFileError` naming the file, line and label set.

    Args:
        path: the file the label was read from.
        line_number: int, its line.
        label: str, the label read.
        names: the allowed labels.

    Example:
    >>> check_label("wnut17train.conll", 3, "B-person", ["O", "B-person", "I-person"])
    'B-person'
    """
    if label not in names:
        raise DataFileError(path, f"label {label!r} is not one of {list(names)}.", line_number)
    return label
