"""Generation speed: kzoo `GPTCausalLM.generate` against keras-hub `GPT2CausalLM.generate`.

Same config (vocab 8192, 4 layers, 4 heads, width 256, ff 1024, 256 positions),
same weights (copied from the keras-hub model, so the greedy tokens must agree),
prompt 32 random ids, 224 new tokens, greedy, batch 1 and 8; both with XLA.
Calls are interleaved after a warm-up call each; new tokens/s = B * 224 / time.

Also times one compiled kzoo decode step at position 32 and at 224 (same
256-slot cache), which must cost about the same.

    python benchmarks/generation.py [--repeats 3] [--out generation.json]
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kzoo  # noqa: E402
from benchmarks.common import median_time  # noqa: E402
from benchmarks.common import report  # noqa: E402
from benchmarks.common import wait_for_quiet  # noqa: E402

CONFIG = dict(
    vocabulary_size=8192, num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024, max_sequence_length=256
)
PROMPT, LENGTH = 32, 256


def build_models():
    keras.utils.set_random_seed(0)
    hub = keras_hub.models.GPT2CausalLM(keras_hub.models.GPT2Backbone(**CONFIG), preprocessor=None)
    hub.compile(sampler="greedy", jit_compile=True)
    ours = kzoo.models.GPTCausalLM(kzoo.models.GPTBackbone.from_keras_hub(hub.backbone))
    return hub, ours


def step_time(lm, index, repeats=50):
    """Median time of one compiled decode step at `index` with a 256-slot cache."""
    token, position = tf.constant([[7]]), tf.constant(index)
    _, state = lm.prefill(token, LENGTH)
    step = tf.function(lambda t, s, i: lm.decode(t, s, i)[0], jit_compile=True)
    step(token, state, position)
    return median_time(lambda: step(token, state, position).numpy(), repeats)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    hub, ours = build_models()
    rng = np.random.default_rng(0)
    results = {"config": CONFIG, "prompt_length": PROMPT, "new_tokens": LENGTH - PROMPT, "batches": {}}
    for batch in (1, 8):
        prompt = rng.integers(1, CONFIG["vocabulary_size"], (batch, PROMPT)).astype("int32")
        hub_inputs = {
            "token_ids": np.pad(prompt, ((0, 0), (0, LENGTH - PROMPT))),
            "padding_mask": np.arange(LENGTH)[None, :].repeat(batch, 0) < PROMPT,
        }
        run_hub = lambda: hub.generate(hub_inputs, stop_token_ids=None)  # noqa: E731
        run_ours = lambda: ours.generate(prompt, max_length=LENGTH)  # noqa: E731
        agreement = float((run_hub()["token_ids"] == run_ours()["token_ids"]).mean())  # also the warm-up
        wait_for_quiet()
        hub_times, our_times = [], []
        for _ in range(args.repeats):
            hub_times.append(median_time(run_hub, 1))
            our_times.append(median_time(run_ours, 1))
        hub_tps = batch * (LENGTH - PROMPT) / float(np.median(hub_times))
        our_tps = batch * (LENGTH - PROMPT) / float(np.median(our_times))
        results["batches"][batch] = {
            "keras_hub_new_tokens_per_s": round(hub_tps, 1),
            "kzoo_new_tokens_per_s": round(our_tps, 1),
            "ratio_kzoo_over_keras_hub": round(our_tps / hub_tps, 2),
            "token_agreement": agreement,
        }
    at_32, at_224 = step_time(ours, 32), step_time(ours, 224)
    results["kzoo_step_ms"] = {
        "position_32": round(at_32 * 1e3, 3),
        "position_224": round(at_224 * 1e3, 3),
        "ratio": round(at_224 / at_32, 2),
    }
    report("generation", results, args.out)


if __name__ == "__main__":
    main()
