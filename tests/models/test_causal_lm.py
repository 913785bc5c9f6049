"""The causal-LM contract, run by every decoder family (`tiny_models.DECODERS`: GPT-2 and every
record of `kzoo.checkpoints.families`).

A family adds its record and passes these: its outputs never depend on later tokens or on
padding, the cached steps give the full pass's logits, ragged prompts in one batch give each row
its own greedy tokens, and `.keras` files, LoRA and int8 keep working. What is specific to one family (its
Hugging Face checkpoints) is tested against transformers in test_decoder_hf.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from kzoo import models
from kzoo.models import generation
from tests.models.tiny_models import DECODERS
from tests.models.tiny_models import LENGTH
from tests.models.tiny_models import TINY_CONFIG
from tests.models.tiny_models import decoder_backbone
from tests.models.tiny_models import padding_mask
from tests.models.tiny_models import token_ids

FAMILIES = list(DECODERS)


def causal_lm(name, context=None):
    """The family's tiny causal LM, of the tiny context or a `context` of its own."""
    keras.utils.set_random_seed(7)
    if context is None:
        backbone = DECODERS[name]()
    elif name == "gpt2":
        backbone = models.GPTBackbone(**{**TINY_CONFIG, "max_sequence_length": context})
    else:
        backbone = decoder_backbone(name, max_position_embeddings=context)
    lm = models.CausalLM(backbone)
    # Weights larger than the initialization's: logits of unit scale, so that every check below
    # sees a difference and argmax ties do not happen.
    lm.set_weights([w + np.random.default_rng(i).normal(0, 0.3, w.shape) for i, w in enumerate(lm.get_weights())])
    return lm


@pytest.fixture(scope="module")
def built():
    """`built(name)`: the family's `causal_lm`, built once for the module's tests that only run it
    (building the eleven of them again for each such test was a tenth of the module's time)."""
    models_by_name = {}

    def get(name):
        if name not in models_by_name:
            models_by_name[name] = causal_lm(name)
        return models_by_name[name]

    return get


def inputs(ids, mask=None):
    return {"token_ids": ids, "padding_mask": np.ones_like(ids) if mask is None else mask}


@pytest.mark.parametrize("name", FAMILIES)
def test_output_at_t_is_independent_of_later_tokens(name, built):
    lm = built(name)
    rng = np.random.default_rng(0)
    ids = token_ids(rng)
    logits = np.asarray(lm(inputs(ids)))
    for t in (0, 4, LENGTH - 2):
        changed = ids.copy()
        changed[:, t + 1 :] = token_ids(rng)[:, t + 1 :]
        changed_logits = np.asarray(lm(inputs(changed)))
        np.testing.assert_allclose(changed_logits[:, : t + 1], logits[:, : t + 1], atol=1e-5)
        assert not np.allclose(changed_logits[:, t + 1 :], logits[:, t + 1 :], atol=1e-3)


@pytest.mark.parametrize("name", FAMILIES)
def test_outputs_at_real_tokens_are_independent_of_padding(name, built):
    lm = built(name)
    rng = np.random.default_rng(1)
    ids = token_ids(rng, batch=2, length=6)
    short = np.asarray(lm(inputs(ids)))
    padded = np.concatenate([ids, token_ids(rng, batch=2, length=6)], axis=1)  # arbitrary ids under the padding
    long = np.asarray(lm(inputs(padded, padding_mask([6, 6], length=12))))
    np.testing.assert_allclose(long[:, :6], short, atol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_cached_steps_match_the_full_pass(name, built):
    lm = built(name)
    ids = token_ids(np.random.default_rng(2), batch=3, length=12)
    full = np.asarray(lm(inputs(ids)))
    logits, state = lm.prefill(ids[:, :5], cache_length=12)
    backbone = lm.backbone
    assert {name: tuple(c.shape) for name, c in state.items()} == {
        f"{kind}_cache_{i}": (3, backbone.num_key_value_heads, 12, backbone.head_dim)
        for kind in ("key", "value")
        for i in range(backbone.num_layers)
    }
    steps = [logits]
    step = tf.function(lm.decode)  # as `generate` runs it: a graph with a tensor index
    for t in range(5, 12):
        logits, state = step(ids[:, t : t + 1], state, tf.constant(t))
        steps.append(logits)
    assert logits.dtype == "float32" and tuple(logits.shape) == (3, 1, backbone.vocabulary_size)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


# Generating for ragged prompts takes 2 to 4 s a family: by default it runs for decoders with
# absolute positions (GPT-2), llama3 RoPE scaling (Llama), a window on every layer (Mistral),
# QK-norm (Qwen3) and mixed windows with two RoPE bases (Gemma 3); for every family with KZOO_SLOW=1.
RAGGED_BY_DEFAULT = ("gpt2", "llama", "mistral", "qwen3", "gemma3_text")


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=[] if name in RAGGED_BY_DEFAULT else pytest.mark.slow) for name in FAMILIES]
)
def test_ragged_prompts_in_one_batch_give_each_row_its_own_greedy_tokens(name, built):
    """Each row of a ragged batch (prefilled as long as its shortest prompt, the rest read in the
    loop) is the greedy continuation of its prompt: every new token the argmax of the full pass
    over the tokens before it. The longest prompt alone (a prefill of four) gives its row too.

    Each generate call traces the loop again (a batch size and prefill of its own), so the rows
    are checked against one uncached pass rather than each generated alone."""
    lm = built(name)
    prompts = [[5], [7, 3, 9], [1, 2, 3, 4, 5, 6, 7], [9, 9]]
    together = lm.generate(prompts, max_length=14, jit_compile=False)
    assert [len(row) for row in together] == [14] * len(prompts)
    logits = np.asarray(lm(inputs(np.array(together, "int32"))))
    for prompt, row, row_logits in zip(prompts, together, logits):
        assert row[: len(prompt)] == prompt
        assert row[len(prompt) :] == row_logits[len(prompt) - 1 : -1].argmax(-1).tolist()
    assert lm.generate([prompts[2]], max_length=14, jit_compile=False) == [together[2]]


@pytest.mark.parametrize("name", RAGGED_BY_DEFAULT)
def test_the_rest_of_a_long_prompt_is_read_in_chunks_and_gives_the_greedy_tokens(name):
    """Past a prefill of 16, `generate` reads the shortest prompt's rest in calls of 4 positions
    (`generation.prompt_chunk`), the last ending at the prompt's end: prompts of 19 and 23 tokens
    read positions 15-18 in one call (15 again), one of 31 tokens 16-30 in four (27 again). Every
    new token is the argmax of one uncached pass over the tokens before it (windows of 4 in the
    sliding families, so the chunks cross them), and the traced loop reads chunks of 4 (without
    them, the test fails on its widths: the rest was read a token at a time)."""
    lm = causal_lm(name, context=40)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(1, 39, n).tolist() for n in (19, 23)]
    widths = []
    decode = lm.decode
    lm.decode = lambda ids, *args, **kwargs: widths.append(ids.shape[1]) or decode(ids, *args, **kwargs)
    try:
        rows = lm.generate(prompts, max_length=34, jit_compile=False) + lm.generate(
            [rng.integers(1, 39, 31).tolist()], max_length=36, jit_compile=False
        )
    finally:
        del lm.decode
    assert sorted(set(widths)) == [1, 4, 16]  # the decode steps, the chunks, the prefill
    for row, length in zip(rows, (19, 23, 31)):
        logits = np.asarray(lm(inputs(np.array([row], "int32"))))[0]
        assert row[length:] == logits[length - 1 : -1].argmax(-1).tolist()


def test_one_xla_program_serves_every_prompt_length_of_a_prefill():
    """Prompts of 17 and 19 tokens share a compiled loop (a prefill of 16, the same length): the
    HLO XLA is given is the same for both, so neither the prompt nor its length is a constant
    in it (a chunk read by `ops.slice` made the length one, and `chat` compiled again for every
    new prompt length)."""
    lm = causal_lm("llama", context=40)
    sampler, stop = generation.resolve("greedy", None)
    programs = []
    for n in (17, 19):
        ids, mask, _ = generation.pack_prompts([list(range(1, n + 1))], 40, None, 40)
        lm.generate([list(range(1, n + 1))], max_length=40)
        (function,) = generation._COMPILED[lm].values()
        programs.append(function.experimental_get_compiler_ir(ids, mask, stop, sampler.noise(40, 1), {})(stage="hlo"))
    assert programs[0] == programs[1]


def test_a_prompt_read_in_chunks_gives_the_logits_of_one_prefill(built):
    """`generation.read_prompt` of positions 8-20 in calls of 4 (the last reading 17-20, two of
    them again) after a prefill of 8: the logits of a prefill of all 21 positions, and a cache
    that the next step reads as it reads that prefill's."""
    lm = causal_lm("llama", context=32)
    ids = np.random.default_rng(4).integers(1, 39, (2, 22)).astype("int32")
    logits, state = lm.prefill(ids[:, :8], 32, last_only=True)
    logits, state = generation.read_prompt(lm, ids, state, logits[:, -1], 8, 21, 4)
    whole, whole_state = lm.prefill(ids[:, :21], 32, last_only=True)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(whole)[:, -1], atol=2e-5)
    step, _ = lm.decode(ids[:, 21:22], state, 21)
    whole_step, _ = lm.decode(ids[:, 21:22], whole_state, 21)
    np.testing.assert_allclose(np.asarray(step), np.asarray(whole_step), atol=2e-5)
    # Nothing to read: the logits come back as they were.
    same, _ = generation.read_prompt(lm, ids, state, logits, 21, 21, 4)
    np.testing.assert_array_equal(np.asarray(same), np.asarray(logits))


@pytest.mark.parametrize("name", FAMILIES)
def test_keras_file_round_trip(name, tmp_path, built):
    lm = built(name)
    ids = token_ids(np.random.default_rng(3))
    lm.save(tmp_path / "lm.keras")
    reloaded = keras.saving.load_model(tmp_path / "lm.keras")
    assert type(reloaded.backbone) is type(lm.backbone) and reloaded.backbone.get_config() == lm.backbone.get_config()
    np.testing.assert_array_equal(np.asarray(reloaded(inputs(ids))), np.asarray(lm(inputs(ids))))


# LoRA and int8 go through the same Dense layers in every family: by default the two decoders
# that differ most (GPT-2's and Gemma 3's) run it, the others with KZOO_SLOW=1.
@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=[] if name in ("gpt2", "gemma3_text") else pytest.mark.slow) for name in FAMILIES]
)
def test_lora_trains_its_weights_only_and_int8_stays_close(name, tmp_path):
    lm = causal_lm(name)
    rng = np.random.default_rng(4)
    ids = token_ids(rng, length=LENGTH + 1)
    x, y = inputs(ids[:, :-1]), ids[:, 1:]
    lm.backbone.enable_lora(2)
    frozen = {w.path: w.numpy() for w in lm.weights if "lora" not in w.path}
    # Eagerly: tracing the train step cost ten times the three steps, and LoRA trains the same.
    lm.compile(learning_rate=1e-2, run_eagerly=True)
    before = np.asarray(lm(x))
    lm.fit(x, y, epochs=1, steps_per_epoch=3, batch_size=len(y), verbose=0)
    assert all(np.array_equal(w.numpy(), frozen[w.path]) for w in lm.weights if w.path in frozen)
    after = np.asarray(lm(x))
    assert np.abs(after - before).max() > 1e-3
    # Saved with the LoRA updates merged into the kernels.
    lm.save(tmp_path / "lora.keras")
    merged = keras.saving.load_model(tmp_path / "lora.keras")
    np.testing.assert_allclose(np.asarray(merged(x)), after, atol=1e-5)
    # int8 weights: the same next tokens almost everywhere, and the quantized file reloads exactly.
    merged.quantize("int8")
    quantized = np.asarray(merged(x))
    assert (quantized.argmax(-1) == after.argmax(-1)).mean() >= 0.9
    assert np.abs(quantized - after).max() < 0.1 * np.abs(after).max()
    merged.save(tmp_path / "int8.keras")
    np.testing.assert_array_equal(np.asarray(keras.saving.load_model(tmp_path / "int8.keras")(x)), quantized)


def test_a_prefill_for_generation_gives_the_last_position_s_logits_alone(built):
    lm = built("llama")
    ids = token_ids(np.random.default_rng(3), batch=2, length=6)
    full, state = lm.prefill(ids, cache_length=8)
    last, last_state = lm.prefill(ids, cache_length=8, last_only=True)
    assert tuple(last.shape) == (2, 1, lm.backbone.vocabulary_size)
    np.testing.assert_allclose(np.asarray(last), np.asarray(full)[:, -1:], atol=1e-6)
    for name, tensor in state.items():
        np.testing.assert_array_equal(np.asarray(last_state[name]), np.asarray(tensor))


def test_rope_layers_name_the_layers_without_positions_and_are_checked():
    config = dict(vocabulary_size=64, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32)
    backbone = models.DecoderBackbone(**config, max_sequence_length=16, rope_layers=[True, False])
    assert [block.self_attention.rotary_embedding is not None for block in backbone.transformer_blocks] == [True, False]
    assert models.DecoderBackbone.from_config(backbone.get_config()).rope_layers == [True, False]
    with pytest.raises(ValueError, match=r"`rope_layers` must list 2 booleans \(one per layer\)"):
        models.DecoderBackbone(**config, max_sequence_length=16, rope_layers=[True])


def test_a_traced_forward_computes_rotary_angles_and_masks_once_per_setting_whatever_its_depth():
    """The blocks share the rotary sines and cosines of each RoPE setting and the mask of each
    window, computed once per forward (each block's own put L copies of them into the graph
    that a first reply traces and XLA compiles), and their outputs are each block's own."""
    config = dict(
        vocabulary_size=64,
        num_heads=4,
        num_key_value_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=16,
        sliding_window=3,
        # Gemma 3's: a RoPE base and a window for the sliding layers, others for the full ones.
        rope_parameters={"sliding_attention": {"rope_theta": 10000.0}, "full_attention": {"rope_theta": 1e6}},
    )
    layer_types = ["sliding_attention", "full_attention"] * 2
    counted = ("Sin", "Cos", "Range", "GreaterEqual", "Greater", "SelectV2")

    def graph_ops(num_layers):
        keras.utils.set_random_seed(1)
        backbone = models.DecoderBackbone(**config, num_layers=num_layers, layer_types=layer_types[:num_layers])
        lm = models.CausalLM(backbone)
        ids = tf.TensorSpec((2, 8), tf.int32)
        prefill = tf.function(lambda x: lm.prefill(x, 16), autograph=False).get_concrete_function(ids)
        caches = generation.cache_state(lm.backbone.empty_cache(2, 16))
        state = {name: tf.TensorSpec(cache.shape, cache.dtype) for name, cache in caches.items()}
        step = tf.function(lm.decode, autograph=False).get_concrete_function(
            tf.TensorSpec((2, 1), tf.int32), state, tf.TensorSpec((), tf.int32)
        )
        ops = [[op.type for op in fn.graph.get_operations()] for fn in (prefill, step)]
        return lm, [{name: types.count(name) for name in counted} for types in ops]

    _, shallow = graph_ops(2)
    lm, deep = graph_ops(4)
    assert deep == shallow
    assert deep[0]["Sin"] == deep[0]["Cos"] == 2  # one per RoPE setting

    rng = np.random.default_rng(5)
    ids, mask = token_ids(rng, batch=2, length=9), np.array([[1] * 9, [1] * 6 + [0] * 3])
    # Under mixed precision too, where a call's floating arguments are cast (the angles must not be).
    mixed = models.DecoderBackbone(**config, num_layers=2, layer_types=layer_types[:2], dtype="mixed_bfloat16")
    for backbone in (lm.backbone, mixed):
        per_block = backbone(inputs(ids, mask))  # the functional model: each block computes its own
        shared = backbone.decode(ids, padding_mask=mask)
        np.testing.assert_array_equal(np.asarray(shared)[mask == 1], np.asarray(per_block)[mask == 1])
