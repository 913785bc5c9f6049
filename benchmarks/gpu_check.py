"""kzoo under JAX against transformers on the same Hugging Face checkpoints, on whatever device JAX has.

For each family in `FAMILIES` it writes a tiny random checkpoint with transformers (seeded), loads
it with `kzoo.models.CausalLM.from_preset(folder, tokenizer=None)`, and compares the logits at the
last position of a batch of prompts, then 16 greedily generated tokens, with transformers' (on
torch's device: CUDA where torch has it), and the same tokens from speculative decoding with a
one-layer checkpoint of the family as the draft (`generate(..., draft_model=)`, one prompt at a
time), which must be the target's own greedy output whatever the draft proposes. One line per
family; the exit status is 1 if any family's logits differ by more than `RTOL` (relative to
their largest magnitude) or any token differs.

It imports no TensorFlow, keras-hub, tensorflow-text or gguf (the checkpoints come without a
tokenizer, whose loader needs keras-hub), so it runs where only JAX, torch and transformers are
installed:

    KERAS_BACKEND=jax python -m benchmarks.gpu_check
"""

import os

# Before Keras and JAX are imported: kzoo's backend here is JAX, and JAX by default takes 75% of
# the GPU's memory up front, which would leave torch's reference model none on the same GPU.
os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import sys  # noqa: E402
import tempfile  # noqa: E402

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

import kzoo  # noqa: E402
from kzoo.checkpoints.families import FAMILIES  # noqa: E402
from kzoo.checkpoints.families import TINY_BASE  # noqa: E402

# Three families whose records differ where a port goes wrong: Llama 3's RoPE scaling and biases,
# Qwen2's sliding window on some layers, Gemma 2's soft caps, query scale and sandwich norms.
CHECKED = ("llama", "qwen2", "gemma2")
# The tiny checkpoints' sizes (the test suites'); each family's own fields are its record's `tiny.hf`
# (windows of 4, RoPE scaling from 8 positions), so every difference acts within the prompt and the
# 16 tokens.
SIZES = TINY_BASE
NEW_TOKENS = 16
# float32 on both sides, with full-precision matrix products (below): what is left is the order
# of summation, well under this.
RTOL = 1e-4


def write_checkpoint(folder, model_type, seed=0, scale=0.2, **sizes):
    """A random transformers causal LM of the family saved in `folder`; every weight is drawn from
    N(0, scale^2), norms included, so that each one moves the logits. `sizes` override `SIZES`."""
    family = FAMILIES[model_type]
    torch.manual_seed(seed)
    # Eager attention: the reference implementation (Gemma 2's soft caps need it).
    config = getattr(transformers, family.tiny.config)(
        **{**SIZES, **family.tiny.hf, **sizes}, attn_implementation="eager"
    )
    model = getattr(transformers, family.causal_lm)(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter) * scale)
    model.save_pretrained(folder)
    # No stop token: both sides generate exactly NEW_TOKENS tokens.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def check(model_type, device, rng):
    """`(relative logits difference, tokens that agree, speculative tokens that agree, tokens)` of
    one family."""
    with tempfile.TemporaryDirectory() as folder:
        reference = write_checkpoint(folder, model_type).to(device)
        lm = kzoo.models.CausalLM.from_preset(folder, tokenizer=None)
    with tempfile.TemporaryDirectory() as folder:
        write_checkpoint(folder, model_type, seed=1, num_hidden_layers=1)
        draft = kzoo.models.CausalLM.from_preset(folder, tokenizer=None)
    prompts = rng.integers(1, SIZES["vocab_size"], (2, 6)).astype("int32")

    inputs = {"token_ids": prompts, "padding_mask": np.ones_like(prompts)}
    logits = np.asarray(lm(inputs)[:, -1], "float64")
    with torch.no_grad():
        want = reference(torch.from_numpy(prompts).long().to(device)).logits[:, -1].double().cpu().numpy()
    difference = np.abs(logits - want).max() / np.abs(want).max()

    tokens = np.asarray(lm.generate(prompts.tolist(), max_new_tokens=NEW_TOKENS))[:, prompts.shape[1] :]
    with torch.no_grad():
        sequences = reference.generate(
            torch.from_numpy(prompts).long().to(device), max_new_tokens=NEW_TOKENS, do_sample=False
        )
    want_tokens = sequences[:, prompts.shape[1] :].cpu().numpy()
    speculative = np.concatenate(
        [
            np.asarray(lm.generate([row.tolist()], max_new_tokens=NEW_TOKENS, draft_model=draft))[:, prompts.shape[1] :]
            for row in prompts
        ]
    )
    return (
        difference,
        int((tokens == want_tokens).sum()),
        int((speculative == want_tokens).sum()),
        want_tokens.size,
    )


def main():
    if keras.backend.backend() != "jax":
        sys.exit(f"benchmarks.gpu_check runs kzoo under JAX; KERAS_BACKEND is {keras.backend.backend()!r}.")
    # JAX's default on GPUs multiplies float32 matrices in TF32 (10-bit mantissas), torch's does not.
    jax.config.update("jax_default_matmul_precision", "highest")
    transformers.utils.logging.disable_progress_bar()  # one line per family, nothing else
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rng = np.random.default_rng(0)
    failed = False
    for model_type in CHECKED:
        difference, agree, speculative, total = check(model_type, device, rng)
        ok = difference <= RTOL and agree == speculative == total
        failed |= not ok
        print(
            f"{model_type:8s} logits max rel diff {difference:.2e}  tokens {agree}/{total}  "
            f"speculative {speculative}/{total}  "
            f"{'ok' if ok else 'MISMATCH'}  jax {jax.devices()}  torch {device}",
            flush=True,
        )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
