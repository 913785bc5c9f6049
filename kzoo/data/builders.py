"""tensorflow-datasets builders for kzoo's shipped corpora, and `load`.

Each builder reads the compressed files in `recipes/data` through `kzoo.data.corpora` (never
the network) and writes TFRecords under the tfds `data_dir`; later loads read those. The
examples keep the order of the corpus reader (`disable_shuffling`), so a split is the same
sequence on every machine. Importing this module registers the builders with tfds, so
`tfds.load("kzoo_spa_eng")` works too.

A prepared dataset records the SHA-256 of its source files, and is prepared again whenever
they differ (other files, another `source_dir`): stale data is never read.
"""

import contextlib
import hashlib
import inspect
import io

import tensorflow_datasets as tfds

from kzoo import _compat
from kzoo.data import corpora


class CorpusBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Base of the kzoo builders: a tfds builder over one of the corpora shipped in `recipes/data`.

    Splits and examples come from a `kzoo.data.corpora.read_*` function; nothing is
    downloaded. Subclasses set `name`, `read_corpus`, `features`, `supervised_keys`,
    `homepage` and `license`; their docstring is the dataset description. Use a subclass
    through `kzoo.data.load`, `tfds.load("kzoo_...")` or directly.

    Args:
        source_dir: the folder of the corpus files; defaults to `KZOO_DATA_DIR`, then the
            repository's `recipes/data` (see `kzoo.data.corpora.corpus_dir`).
        **kwargs: `tfds.core.DatasetBuilder` arguments, e.g. `data_dir`, where the prepared
            TFRecords go.

    Example:
    >>> builder = KzooWnut17(data_dir="tfds")
    >>> builder.download_and_prepare()  # doctest: +ELLIPSIS
    Preparing kzoo_wnut17 ...
    >>> builder.info.splits["test"].num_examples
    1287
    """

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First version, read from the files kzoo ships in recipes/data."}
    supervised_keys = None
    # The corpus folder under the source dir, whose files the reader reads.
    source_folder = None

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):
        # tfds locates a builder's download checksums beside its code. These builders download
        # nothing, and tfds 4.9.10 resolves the path with `importlib_resources`, which it installs
        # on Python < 3.9 only (tensorflow/datasets#11212).
        return None

    def __init__(self, *, source_dir=None, **kwargs):
        self.source_dir = source_dir
        super().__init__(**kwargs)

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            description=inspect.cleandoc(self.__doc__),
            features=tfds.features.FeaturesDict(self.features),
            supervised_keys=self.supervised_keys,
            homepage=self.homepage,
            license=self.license,
            disable_shuffling=True,
            metadata=tfds.core.MetadataDict(),
        )

    def source_checksum(self):
        """The SHA-256 of the source folder's files (names and contents), or None if there is no such folder."""
        folder = corpora.corpus_dir(self.source_dir) / self.source_folder
        if not folder.is_dir():
            return None
        digest = hashlib.sha256()
        for path in sorted(path for path in folder.rglob("*") if path.is_file()):
            digest.update(path.relative_to(folder).as_posix().encode("utf-8") + b"\0")
            with open(path, "rb") as file:
                for chunk in iter(lambda: file.read(1 << 20), b""):
                    digest.update(chunk)
        return digest.hexdigest()

    def download_and_prepare(self, *, download_dir=None, download_config=None, **kwargs):
        """Prepares the dataset, again if its source files changed since it was prepared."""
        checksum = self.source_checksum()
        prepared = self.is_prepared()
        if prepared and (checksum is None or self.info.metadata.get("source_sha256") != checksum):
            download_config = download_config or tfds.download.DownloadConfig()
            download_config.download_mode = tfds.download.GenerateMode.REUSE_CACHE_IF_EXISTS
            print(f"Preparing {self.name} again into {self.data_dir}: its corpus files changed")
        elif not prepared:
            print(f"Preparing {self.name} from its corpus files into {self.data_dir} (on first use only)")
        # In place of tensorflow-datasets' lines, which announce a download of unknown size, and of
        # its progress bars (the caller's setting is restored after).
        bars = _compat.progress_bar_enabled()
        tfds.display_progress_bar(False)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                super().download_and_prepare(download_dir=download_dir, download_config=download_config, **kwargs)
        finally:
            tfds.display_progress_bar(bars)

    def _split_generators(self, dl_manager):
        self.info.metadata["source_sha256"] = self.source_checksum()
        splits = self.read_corpus(self.source_dir)
        return {split: self._generate_examples(examples) for split, examples in splits.items()}

    def _generate_examples(self, examples):
        yield from enumerate(examples)


class KzooTinyShakespeare(CorpusBuilder):
    """Tiny Shakespeare (karpathy/char-rnn), for character language modelling.

    One `text` per split: the first 90% of the 1,115,394 characters are `train`, the last 10%
    `validation`.
    """

    name = "kzoo_tiny_shakespeare"
    source_folder = "tinyshakespeare"
    read_corpus = staticmethod(corpora.read_tiny_shakespeare)
    features = {"text": tfds.features.Text()}
    homepage = "https://github.com/karpathy/char-rnn"
    license = "Public domain text; char-rnn repository MIT."


class KzooSpaEng(CorpusBuilder):
    """English–Spanish sentence pairs (Tatoeba via manythings.org), for translation.

    The 118,964 pairs of the keras-io translation example, shuffled with a fixed seed and split
    80/10/10 into train/validation/test.
    """

    name = "kzoo_spa_eng"
    source_folder = "spa-eng"
    read_corpus = staticmethod(corpora.read_spa_eng)
    features = {"english": tfds.features.Text(), "spanish": tfds.features.Text()}
    supervised_keys = ("english", "spanish")
    homepage = "https://www.manythings.org/anki/"
    license = "CC BY 2.0 FR; attribution: www.manythings.org/anki and tatoeba.org."


class KzooRtPolarity(CorpusBuilder):
    """Pang & Lee sentence polarity v1.0 (Rotten Tomatoes snippets), for sentence classification.

    10,662 lower-cased, tokenised snippets, half positive, shuffled with a fixed seed and split
    90/10 into train/test.
    """

    name = "kzoo_rt_polarity"
    source_folder = "rt-polarity"
    read_corpus = staticmethod(corpora.read_rt_polarity)
    features = {"text": tfds.features.Text(), "label": tfds.features.ClassLabel(names=corpora.SENTIMENT_LABELS)}
    supervised_keys = ("text", "label")
    homepage = "https://www.cs.cornell.edu/people/pabo/movie-review-data/"
    license = "CC BY 4.0 (per nltk_data sentence_polarity)."


class KzooSentimentSentences(CorpusBuilder):
    """UCI Sentiment Labelled Sentences (Kotzias et al., 2015), for sentence classification.

    3,000 review sentences, 1,000 each from amazon, imdb and yelp, shuffled with a fixed seed
    and split 90/10 into train/test. Lines 19-20 of the imdb file are two halves of one
    sentence upstream and stay two examples.
    """

    name = "kzoo_sentiment_sentences"
    source_folder = "sentiment-labelled-sentences"
    read_corpus = staticmethod(corpora.read_sentiment_sentences)
    features = {
        "text": tfds.features.Text(),
        "label": tfds.features.ClassLabel(names=corpora.SENTIMENT_LABELS),
        "source": tfds.features.ClassLabel(names=list(corpora.SENTIMENT_SOURCES)),
    }
    supervised_keys = ("text", "label")
    homepage = "https://archive.ics.uci.edu/dataset/331/sentiment+labelled+sentences"
    license = "CC BY 4.0."


class KzooUdEnglishEwt(CorpusBuilder):
    """Universal Dependencies English Web Treebank v2.16, for part-of-speech tagging.

    Words with their UPOS tags. `train` is every third training document (4,276 sentences);
    `validation` (2,001) and `test` (2,077) are the official files.
    """

    name = "kzoo_ud_english_ewt"
    source_folder = "ud-english-ewt"
    read_corpus = staticmethod(corpora.read_ud_english_ewt)
    features = {
        "sent_id": tfds.features.Text(),
        "text": tfds.features.Text(),
        "tokens": tfds.features.Sequence(tfds.features.Text()),
        "upos": tfds.features.Sequence(tfds.features.ClassLabel(names=corpora.UPOS_TAGS)),
    }
    supervised_keys = ("tokens", "upos")
    homepage = "https://universaldependencies.org/treebanks/en_ewt/"
    license = "CC BY-SA 4.0."


class KzooWnut17(CorpusBuilder):
    """WNUT 2017 Emerging and Rare Entities, for named-entity recognition.

    Noisy user-generated sentences (3,394 train, 1,009 validation, 1,287 test) with 13 BIO
    tags over person, location, group, corporation, product and creative-work.
    """

    name = "kzoo_wnut17"
    source_folder = "wnut17"
    read_corpus = staticmethod(corpora.read_wnut17)
    features = {
        "tokens": tfds.features.Sequence(tfds.features.Text()),
        "ner_tags": tfds.features.Sequence(tfds.features.ClassLabel(names=corpora.WNUT17_TAGS)),
    }
    supervised_keys = ("tokens", "ner_tags")
    homepage = "https://noisy-text.github.io/2017/emerging-rare-entities.html"
    license = "CC BY 4.0."


class KzooScitldr(CorpusBuilder):
    """SciTLDR, abstract-only (SciTLDR-A), for extreme summarization.

    Abstract (`source`) to one-sentence TLDR: 1,992 train and 619 validation papers. `target`
    is the author TLDR; `targets` holds every TLDR (one in train, 1 to 4 in validation).
    """

    name = "kzoo_scitldr"
    source_folder = "scitldr-a"
    read_corpus = staticmethod(corpora.read_scitldr)
    features = {
        "paper_id": tfds.features.Text(),
        "title": tfds.features.Text(),
        "source": tfds.features.Text(),
        "target": tfds.features.Text(),
        "targets": tfds.features.Sequence(tfds.features.Text()),
    }
    supervised_keys = ("source", "target")
    homepage = "https://github.com/allenai/scitldr"
    license = "Apache-2.0."


BUILDERS = {
    builder.name: builder
    for builder in (
        KzooTinyShakespeare,
        KzooSpaEng,
        KzooRtPolarity,
        KzooSentimentSentences,
        KzooUdEnglishEwt,
        KzooWnut17,
        KzooScitldr,
    )
}


def load(name, split, data_dir=None, *, source_dir=None, as_supervised=False):
    """A split of a kzoo corpus, or of any tensorflow-datasets catalog dataset, as a `tf.data.Dataset`.

    kzoo names (`BUILDERS`) are prepared from the shipped files on first use, offline. Any
    other name goes to `tfds.load`, which downloads (network needed).

    Args:
        name: a kzoo dataset name, e.g. "kzoo_spa_eng", or a tfds catalog name such as
            "imdb_reviews" or "glue/sst2".
        split: a tfds split, e.g. "train", "validation", "test[:10%]".
        data_dir: where tfds keeps prepared datasets; defaults to tfds' own
            (`TFDS_DATA_DIR` or `~/tensorflow_datasets`).
        source_dir: kzoo datasets only: the folder of the corpus files, see
            `kzoo.data.corpora.corpus_dir` (defaults to `KZOO_DATA_DIR`, then `recipes/data`).
        as_supervised: bool; if True, elements are the builder's `supervised_keys` tuple,
            e.g. `(text, label)`, instead of a feature dict.

    Example:
    >>> dataset = load("kzoo_rt_polarity", "test", data_dir="tfds", as_supervised=True)
    Preparing kzoo_rt_polarity from its corpus files into tfds/kzoo_rt_polarity/1.0.0 (on first use only)
    >>> text, label = next(iter(dataset))
    >>> text.dtype, label.dtype
    (tf.string, tf.int64)
    """
    if name in BUILDERS:
        builder = BUILDERS[name](data_dir=data_dir, source_dir=source_dir)
        builder.download_and_prepare()
        return builder.as_dataset(split=split, as_supervised=as_supervised)
    catalog_name = name.split(":")[0].split("/")[0]
    if catalog_name not in tfds.list_builders(with_community_datasets=False):
        raise ValueError(
            f"Unknown dataset {name!r}. kzoo datasets: {sorted(BUILDERS)}; "
            "other names must be in the tensorflow-datasets catalog (tfds.list_builders())."
        )
    if source_dir is not None:
        raise ValueError(f"`source_dir` applies to kzoo datasets only; received it with {name!r}.")
    return tfds.load(name, split=split, data_dir=data_dir, as_supervised=as_supervised)
