"""kzoo's data layer: shipped corpora, tensorflow-datasets builders, tokenizers and tf.data pipelines.

- `load(name, split)`: a kzoo corpus (`BUILDERS`, read offline from `recipes/data`) or any
  tensorflow-datasets catalog dataset, as a `tf.data.Dataset`.
- `kzoo.data.corpora`: the same corpora as plain Python splits (`read_spa_eng`, ...).
- kzoo's character and WordPiece tokenizers and its special tokens, from `kzoo.tokenizers`.
- `kzoo.data.pipelines`: batches for language modelling, masked LM, classification, tagging,
  seq2seq and conditional (decoder-only) translation.

Example:
>>> reviews = load("kzoo_sentiment_sentences", "train", data_dir="tfds", as_supervised=True)
Preparing kzoo_sentiment_sentences from its corpus files into tfds/kzoo_sentiment_sentences/1.0.0 (on first use only)
>>> texts = reviews.map(lambda text, label: text)
>>> tokenizer = word_piece_tokenizer(train_word_piece_vocabulary(texts, 1000))
>>> tokenizer.detokenize(tokenizer("a very good film"))
'a very good film'
"""

from kzoo.data.builders import BUILDERS
from kzoo.data.builders import load
from kzoo.data.corpora import corpus_dir
from kzoo.data.corpora import seeded_split
from kzoo.data.pipelines import classification_batches
from kzoo.data.pipelines import conditional_lm_batches
from kzoo.data.pipelines import conditional_lm_prompts
from kzoo.data.pipelines import lm_windows
from kzoo.data.pipelines import masked_lm_batches
from kzoo.data.pipelines import seq2seq_batches
from kzoo.data.pipelines import tagging_batches
from kzoo.data.readers import DataFileError
from kzoo.tokenizers.characters import CharacterTokenizer
from kzoo.tokenizers.word_piece import SPECIAL_TOKENS
from kzoo.tokenizers.word_piece import character_tokenizer
from kzoo.tokenizers.word_piece import load_tokenizer
from kzoo.tokenizers.word_piece import save_tokenizer
from kzoo.tokenizers.word_piece import train_word_piece_vocabulary
from kzoo.tokenizers.word_piece import word_piece_tokenizer
