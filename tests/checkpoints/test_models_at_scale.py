"""The models of `kzoo.checkpoints.fetch` (0.3-1.5B, 4-bit K-quant GGUF files) in kzoo against
transformers' own reading of the same file: tokenizer ids, last-position logits and greedy
continuations of 64 tokens, through the chat template where the file has one.

transformers runs first, in a process of its own (tests/checkpoints/transformers_gguf.py), so
that only one float32 copy of a model is in memory at a time. Each model's tests run where
`python -m kzoo.checkpoints.fetch NAME` has put its file, with KZOO_SLOW=1.
"""

import json
import subprocess
import sys

import numpy as np
import pytest

import kzoo
from kzoo.checkpoints import fetch
from kzoo.tokenizers import packing

pytestmark = pytest.mark.slow

NEW_TOKENS = 64
# Float32 logits of two implementations of the same dequantized weights, relative to the largest.
TOLERANCE = 1e-4
CHATS = {
    "code": [
        "Write a Python function that checks whether a number is prime.",
        "What does `git rebase -i HEAD~3` do? Answer briefly.",
        "Fix this JavaScript: `const xs = [1, 2, 3]; xs.map(x => { x * 2 });`",
    ],
    "text": [
        "The capital of France is",
        "def fibonacci(n):\n    ",
        "Once upon a time, in a small village by the sea,",
    ],
}
TEXTS = [
    "Grüße aus Zürich: naïve café, œuvre, ½ + ¾ = 1¼ — “quoted”.",
    "東京タワーは1958年に完成しました。北京欢迎你！서울은 한국의 수도입니다.",
    "Привет, мир! Γειά σου κόσμε. مرحبا بالعالم. नमस्ते दुनिया. 😂👍🏽",
    "def f(x: int) -> list[int]:\n\treturn [i ** 2 for i in range(x)]  # squares\n\n\n    ",
    '    if (a != b && c <= 0x1F) { printf("%d\\n", a); }\r\n',
    "12345678901234567890 3.14159 1e-10 -42 v1.2.3 ...!?!?",
]


def model_path(name):
    path = fetch.path(name)
    if path is None:
        pytest.skip(f"needs `python -m kzoo.checkpoints.fetch {name}`")
    return path


@pytest.fixture(scope="module", params=sorted(fetch.MODELS))
def pair(request, tmp_path_factory):
    """(kzoo's CausalLM, transformers' results) for one fetched model."""
    name = request.param
    path = model_path(name)
    folder = tmp_path_factory.mktemp(name)
    chats = CHATS["code" if "coder" in name else "text"]
    (folder / "prompts.json").write_text(json.dumps({"chats": chats, "texts": TEXTS, "new_tokens": NEW_TOKENS}))
    command = [sys.executable, "-m", "tests.checkpoints.transformers_gguf", str(path), str(folder / "ref.npz")]
    subprocess.run([*command, str(folder / "prompts.json")], check=True, capture_output=True)
    reference = dict(np.load(folder / "ref.npz"))
    return kzoo.models.CausalLM.from_preset(str(path)), reference, chats


def test_tokenizer_ids_equal_transformers(pair):
    lm, reference, _ = pair
    for i, text in enumerate(TEXTS):
        assert np.asarray(lm.tokenizer.tokenize(text)).tolist() == reference[f"tokens_{i}"].tolist(), text


def test_prompts_render_and_tokenize_as_transformers(pair):
    """Through the chat template where the file has one (rendered as transformers renders it), else
    as `generate` tokenizes a text prompt (its start token included)."""
    lm, reference, chats = pair
    for i, text in enumerate(chats):
        ids = reference[f"ids_{i}"].tolist()
        if lm.tokenizer.chat_template:
            rendered = lm.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
            assert rendered == str(reference["rendered"][i])
            assert np.asarray(lm.tokenizer.tokenize(rendered)).tolist() == ids
        else:
            assert packing.prompt_ids(lm.tokenizer, text) == ids


def test_last_position_logits_equal_transformers(pair):
    lm, reference, chats = pair
    for i in range(len(chats)):
        ids = reference[f"ids_{i}"][None].astype("int32")
        ours = np.asarray(lm({"token_ids": ids, "padding_mask": np.ones_like(ids)}))[0, -1]
        expected = reference[f"logits_{i}"]
        np.testing.assert_allclose(ours, expected, rtol=0, atol=TOLERANCE * np.abs(expected).max())


def test_greedy_continuations_of_64_tokens_equal_transformers(pair):
    lm, reference, chats = pair
    stops = reference["stops"].tolist()
    for i in range(len(chats)):
        ids = reference[f"ids_{i}"].tolist()
        row = lm.generate([ids], max_new_tokens=NEW_TOKENS, stop_token_ids=stops)[0]
        assert row[len(ids) :] == reference[f"greedy_{i}"].tolist(), str(reference["rendered"][i])
