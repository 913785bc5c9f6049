"""The text every peer benchmark prefills: plain English, so its token ids are ordinary ones.

Imported by kzoo's side (`benchmarks.peers`) and by the peer scripts, which run in their own
environments with this folder on their path; it imports nothing.
"""

TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a wooden screw press into a system that could "
    "produce books faster and more cheaply than scribes ever had. Within fifty years presses were "
    "running in more than two hundred cities across Europe, and the number of books in circulation "
    "grew from tens of thousands to millions. Scholars could compare identical copies of a text, "
    "errors were corrected in later editions, and ideas travelled further than their authors. "
)


def text_of_at_least(tokens):
    """`TEXT` repeated until it has at least `tokens` tokens under any subword tokenizer
    (one word or more per token)."""
    return TEXT * (1 + tokens // len(TEXT.split()))
