"""`generate` under Keras' JAX backend: one `jax.jit` program per shape, the weights its arguments,
kept between processes by the persistent compilation cache. Each test runs a fresh process under
JAX (the suite's own runs under TensorFlow)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("jax")

REPOSITORY = Path(__file__).resolve().parents[2]

# Two tiny Llama-family decoders of one vocabulary (a target and a one-layer draft), and the
# greedy continuation of a prompt as argmax over whole forward passes: the truth each generate
# is checked against.
SETUP = """
import gc, json, weakref
import jax, keras, numpy as np
import kzoo
from tests.models.tiny_models import decoder_backbone

assert keras.backend.backend() == "jax"
keras.utils.set_random_seed(0)
target = kzoo.models.CausalLM(decoder_backbone("llama"))
draft = kzoo.models.CausalLM(decoder_backbone("llama", layers=1))
prompt = [3, 7, 1, 12, 5]

def greedy(model, ids, new):
    ids = list(ids)
    for _ in range(new):
        x = np.array([ids], "int32")
        logits = model({"token_ids": x, "padding_mask": np.ones_like(x)})
        ids.append(int(np.argmax(np.asarray(logits)[0, -1])))
    return ids

traces = []
prefill = type(target).prefill
target.prefill = lambda *args, **kwargs: (traces.append(1), prefill(target, *args, **kwargs))[1]
"""


def run_under_jax(script, environment=None):
    env = {name: value for name, value in os.environ.items() if name not in ("XLA_FLAGS", "KZOO_COMPILATION_CACHE")}
    env.update(KERAS_BACKEND="jax", PYTHONPATH=str(REPOSITORY), **(environment or {}))
    result = subprocess.run(
        [sys.executable, "-c", SETUP + textwrap.dedent(script)], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr[-5000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.e2e  # a fresh process under JAX, about a minute on 2 cores
def test_generate_compiles_once_reads_the_current_weights_and_lets_the_model_go():
    result = run_under_jax(
        """
        want = greedy(target, prompt, 6)
        first = target.generate([prompt], max_new_tokens=6)[0]
        again = target.generate([prompt], max_new_tokens=6)[0]
        traced_once = len(traces)
        # New weights after compiling (as fine-tuning leaves them): the same program reads them.
        rng = np.random.default_rng(1)
        for variable in target.variables:
            variable.assign(rng.normal(0, 0.5, variable.shape).astype(variable.dtype))
        want_new = greedy(target, prompt, 6)
        new = target.generate([prompt], max_new_tokens=6)[0]
        speculative = target.generate([prompt], max_new_tokens=6, draft_model=draft)[0]
        speculative_again = target.generate([prompt], max_new_tokens=6, draft_model=draft)[0]
        # Traced within `checked_by_caller`, the embedding's id check leaves no host callback in
        # the program (which JAX's persistent cache refuses); traced outside it, it does.
        embedding = target.backbone.embedding
        ids = np.array([[1, 2]], "int32")
        plain = str(jax.make_jaxpr(lambda ids: embedding(ids))(ids))
        with kzoo.ops.checks.checked_by_caller():  # a new function: JAX reuses the trace of one it has seen
            checked = str(jax.make_jaxpr(lambda ids: embedding(ids))(ids))
        # An encoder-decoder's source ids (`generate`'s context) and beam search, compiled and not.
        seq2seq = kzoo.models.Seq2SeqTransformer(kzoo.models.Seq2SeqBackbone(
            vocabulary_size=30, num_encoder_layers=1, num_decoder_layers=2, num_heads=2, hidden_dim=16,
            intermediate_dim=32, max_sequence_length=12, dropout=0.0))
        seq2seq.set_weights([w * 3 for w in seq2seq.get_weights()])  # no argmax ties
        beam = kzoo.samplers.BeamSampler(num_beams=3)
        sources = [[3, 4, 5, 6], [7, 8, 9]]
        seq2seq_same = all(
            seq2seq.generate(sources, 1, max_length=8, sampler=sampler)
            == seq2seq.generate(sources, 1, max_length=8, sampler=sampler, jit_compile=False)
            for sampler in ("greedy", beam))
        try:
            target.generate([prompt], max_new_tokens=6, draft_model=draft, jit_compile="draft")
            draft_error = ""
        except ValueError as error:
            draft_error = str(error)
        reference = weakref.ref(target)
        del target, prefill
        gc.collect()
        print(json.dumps(dict(
            want=want, first=first, again=again, traced_once=traced_once, traces=len(traces),
            want_new=want_new, new=new, speculative=speculative, speculative_again=speculative_again,
            callback_without=("callback" in plain), callback_within=("callback" in checked),
            seq2seq_same=seq2seq_same, draft_error=draft_error, freed=reference() is None)))
        """
    )
    assert result["first"] == result["again"] == result["want"]
    assert result["traced_once"] == 1  # the second call ran the compiled program, Python untouched
    assert result["want_new"] != result["want"] and result["new"] == result["want_new"]
    assert result["speculative"] == result["speculative_again"] == result["want_new"]
    assert result["traces"] == 2  # generate's one (new weights, no new trace), the speculative loop's one
    assert result["callback_without"] and not result["callback_within"]
    assert result["seq2seq_same"]
    assert "TensorFlow graph, which only Keras' TensorFlow backend has; under jax use True" in result["draft_error"]
    assert result["freed"]


@pytest.mark.e2e  # two fresh processes under JAX
def test_a_second_process_reads_the_generation_loop_from_the_cache(tmp_path):
    # A tiny loop compiles in well under JAX's one-second threshold for keeping it.
    environment = {"KZOO_COMPILATION_CACHE": str(tmp_path), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    script = """
        import jax.monitoring
        hits = []
        jax.monitoring.register_event_listener(
            lambda event, **kwargs: hits.append(1) if event == "/jax/compilation_cache/cache_hits" else None)
        tokens = target.generate([prompt], max_new_tokens=6)[0]
        print(json.dumps(dict(tokens=tokens, want=greedy(target, prompt, 6), hits=len(hits))))
        """
    first = run_under_jax(script, environment)
    (folder,) = tmp_path.iterdir()
    loops = sorted(path.name for path in folder.iterdir() if path.name.startswith("jit_decode-"))
    second = run_under_jax(script, environment)
    assert folder.name.startswith("jax-") and len(loops) == 1
    assert first["hits"] == 0 and second["hits"] > 0
    assert second["tokens"] == first["tokens"] == first["want"]
    assert sorted(path.name for path in folder.iterdir() if path.name.startswith("jit_decode-")) == loops


@pytest.mark.e2e  # a fresh process under JAX
def test_a_gguf_chat_model_loads_and_replies_under_jax_without_importing_tensorflow(tmp_path):
    """TensorFlow is installed here but costs 3-4 s to import: from `import kzoo` to a chat reply
    from a GGUF file, or from a `.keras` file, nothing imports it (nor keras-hub, which imports it),
    and the reply is the one the same model gives under TensorFlow. Once TensorFlow is imported the
    tokenizer runs in a `tf.function` again."""
    import keras

    import kzoo
    from tests.models.test_speculative import chatml_tokenizer

    tokenizer = chatml_tokenizer()
    keras.utils.set_random_seed(5)
    backbone = kzoo.models.DecoderBackbone.from_preset("llama_tiny", vocabulary_size=tokenizer.vocabulary_size())
    lm = kzoo.models.CausalLM(backbone, tokenizer=tokenizer)
    lm.export_to_gguf(tmp_path / "chat.gguf", file_type="F32")
    lm.save(tmp_path / "chat.keras")
    messages = [{"role": "user", "content": "Hello there"}]
    want = lm.chat(messages, max_new_tokens=8)
    text = "Hello there, friend"
    script = f"""
        import json, sys
        import keras
        import kzoo
        lm = kzoo.models.CausalLM.from_preset({str(tmp_path / "chat.gguf")!r})
        reply = lm.chat({messages!r}, max_new_tokens=8)
        continued = lm.generate({text!r}, max_new_tokens=4)
        saved = keras.saving.load_model({str(tmp_path / "chat.keras")!r}).chat({messages!r}, max_new_tokens=8)
        imported = sorted(name for name in ("tensorflow", "keras_hub", "tensorflow_text") if name in sys.modules)
        config = lm.get_config()  # Keras' serialization, which asks whether TensorFlow is available
        imported_by_config = sorted(name for name in ("tensorflow", "keras_hub") if name in sys.modules)
        import tensorflow as tf
        graph = tf.function(lambda text: lm.tokenizer(text))(tf.constant({text!r})).numpy().tolist()
        print(json.dumps(dict(reply=reply, continued=continued, saved=saved, imported=imported,
            imported_by_config=imported_by_config, graph=graph, eager=lm.tokenizer({text!r}).tolist())))
        """
    env = {name: value for name, value in os.environ.items() if name not in ("XLA_FLAGS", "KZOO_COMPILATION_CACHE")}
    env.update(KERAS_BACKEND="jax", PYTHONPATH=str(REPOSITORY))
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr[-5000:]
    result = json.loads(result.stdout.strip().splitlines()[-1])
    assert result["imported"] == [] and result["imported_by_config"] == []
    assert result["reply"] == result["saved"] == want
    assert result["continued"] == lm.generate(text, max_new_tokens=4)
    assert result["graph"] == result["eager"] == tokenizer(text).tolist()
