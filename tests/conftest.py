import gc
import math
import os
import re
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402

WORKERS_PER_CORE = 1


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: WORKERS_PER_CORE workers per core the process may run on (xdist's own count
    can be the physical cores, or all of the machine's). One: the suite is CPU-bound (TensorFlow
    runs each op, and a test's subprocess, on every core), so a third worker on two cores ran
    the fast tier longer, on more CPU-seconds (BENCHMARKS.md, "one worker per core").
    PYTEST_XDIST_AUTO_NUM_WORKERS still overrides."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return math.ceil(WORKERS_PER_CORE * cores)


# The longest tests of the tiers, started first: xdist hands tests out in
# order, and one of these started last keeps a worker busy long after the others are done.
LONGEST_FIRST = (
    "tests/test_docs.py::test_readme_examples_run",
    "tests/recipes/test_chat_finetune.py::test_translation_scores_greedy_replies_with_bleu",
    "tests/training/test_distributed_fit.py::test_a_killed_run_resumes",
    "tests/recipes/test_resume.py::test_a_killed_recipe_reruns",
    "tests/recipes/test_lm_compare.py",
    "tests/export/test_quiet.py",
    # The fast tier's longest (20 s or more each on 2 cores); those above take a minute or more.
    "tests/models/test_seq2seq.py::test_overfits_a_tiny_batch",
    "tests/export/test_litertlm.py::test_greedy_text_in_the_runtime_equals_keras_generate",
    "tests/models/test_gpt_generate.py::test_ragged_prompts_in_one_batch_equal_each_row_alone",
    "tests/models/test_quantization.py::test_int8_quantization_stays_close_to_float32_and_reloads",
    "tests/models/test_seq2seq_generate.py::test_the_xla_loop_gives_the_tokens_of_the_traced_loop",
)


# The tiers. Every test is in exactly one; `--tier` picks which run (default `fast`, the
# developer's loop), and KZOO_SLOW=1 adds `slow`. The README gives each tier's command and time.
TIERS = {
    "fast": "every layer, model, format and file reader on tiny configs",
    "parity": "kzoo against transformers, keras-hub and torch on the same weights or tokenizer",
    "e2e": "whole workflows: recipes, real checkpoints (SmolLM2, all-MiniLM), bundles in the LiteRT-LM runtime, "
    "every tokenizer in every export format, a file read back in a fresh process or under JAX, distributed "
    "training, the docs' examples",
    "slow": "the long tests beyond CI",
}
TIER_SETS = {"all": ("fast", "parity", "e2e")}  # `--tier all` is what CI runs

# Where a test's tier comes from, first match wins:
# 1. the `slow` marker;
# 2. a `parity` or `e2e` marker, on the test or its module (`pytestmark`);
# 3. TIER_TABLE below;
# 4. e2e: a test that uses a real checkpoint's fixture (`smollm2...`, `minilm...`), or whose name says
#    it reads a file back in a fresh process (`..._in_a_fresh_process`);
# 5. parity: a test named for the library it is compared with (`..._matches_transformers`);
# 6. fast.
# TIER_TABLE names test folders (`recipes/`), modules by file name (`test_x.py`, so that a module
# moved to another folder keeps its tier) and tests (`test_x.py::test_y`, every parametrization).
TIER_TABLE = {
    "e2e": (
        "recipes/",
        "test_docs.py::test_readme_examples_run",
        "test_smollm2.py",
        "test_sentence_embeddings.py",
        "test_litertlm_chat.py",
        "test_litertlm_families.py",
        "test_serving_examples.py",
        "test_quiet.py",
        "test_distributed_fit.py",
        "test_model_parallel.py::test_a_sharded_decoder_gives_the_unsharded_logits_and_lora_steps",
        "test_docs.py::test_docstring_examples_print_what_they_show",
        "test_text_signatures.py",
        "test_tokenizer_formats.py",
        "test_families.py",
        "test_litertlm_int4.py",
        "test_representative_data.py::test_character_gpt_on_tiny_shakespeare",
        "test_variable_length_fit.py",
        "test_jax_backend.py::test_model_saved_under_tensorflow_gives_the_same_outputs_and_trains_under_jax",
        "test_feed_forward_lm.py::test_saved_under_tensorflow_gives_the_same_logits_under_jax",
        "test_logs.py",
    ),
    "parity": (),
}
REAL_CHECKPOINT_FIXTURES = ("smollm2", "minilm")
PEER_IN_NAME = re.compile(r"(?:^|_)(transformers|keras_hub|torch|llama_cpp)(?:_|$)")


def pytest_addoption(parser):
    parser.addoption(
        "--tier",
        default="fast",
        help="the tiers to run, comma-separated: " + ", ".join(TIERS) + "; or `all` (fast, parity, e2e: what CI "
        "runs). Default: fast. KZOO_SLOW=1 adds slow.",
    )


def selected_tiers(config):
    """The tiers `--tier` and KZOO_SLOW name, checked."""
    tiers = set()
    for name in config.getoption("--tier").split(","):
        name = name.strip()
        if name not in TIERS and name not in TIER_SETS:
            raise pytest.UsageError(f"--tier: expected a comma list of {', '.join([*TIERS, *TIER_SETS])}, got {name!r}")
        tiers.update(TIER_SETS.get(name, (name,)))
    if os.environ.get("KZOO_SLOW") == "1":
        tiers.add("slow")
    return tiers


def tier_of(item):
    """The one tier of a collected test (see the rules above TIERS)."""
    if item.get_closest_marker("slow"):
        return "slow"
    marked = [name for name in ("parity", "e2e") if item.get_closest_marker(name)]
    if len(marked) > 1:
        raise pytest.UsageError(f"{item.nodeid} is marked {' and '.join(marked)}: a test has one tier")
    if marked:
        return marked[0]
    path = Path(str(item.path)).relative_to(item.config.rootpath)
    name = getattr(item, "originalname", item.name)
    keys = {f"{folder}/" for folder in path.parts[:-1]} | {path.name, f"{path.name}::{name}"}
    for tier, entries in TIER_TABLE.items():
        if keys.intersection(entries):
            return tier
    if any(fixture.split("_")[0] in REAL_CHECKPOINT_FIXTURES for fixture in getattr(item, "fixturenames", ())):
        return "e2e"
    if "_in_a_fresh_process" in name:
        return "e2e"
    if PEER_IN_NAME.search(name):
        return "parity"
    return "fast"


def pytest_collection_modifyitems(config, items):
    """The longest tests first; each test gets its tier, and those of tiers not asked for are skipped."""
    items.sort(key=lambda item: not item.nodeid.startswith(LONGEST_FIRST))  # stable: the rest keep their order
    tiers = selected_tiers(config)
    for item in items:
        tier = tier_of(item)
        item.user_properties.append(("tier", tier))
        if tier not in tiers:
            how = "set KZOO_SLOW=1" if tier == "slow" else f"run with --tier {tier} (or --tier all)"
            item.add_marker(pytest.mark.skip(reason=f"{tier} tier: {how}"))


# Every this many tests, a worker also collects the objects it froze (below).
FULL_COLLECTION_EVERY = 100
_tests_since_full_collection = 0


@pytest.fixture(autouse=True)
def _reset_keras_state():
    """Each test starts from a fixed seed, the float32 policy and fresh Keras state (layer names,
    TensorFlow's default graph).

    After each test its garbage is collected and what is left is frozen (`gc.freeze`): Python's
    full collections walk every tracked object, and a worker holds over a million (the modules
    of TensorFlow, Keras, transformers and torch, earlier tests' traced functions), which made a
    test late in a worker two to three times slower than in a fresh one. Frozen objects are
    never walked again, so each collection sees one test's objects. Every
    FULL_COLLECTION_EVERY tests the frozen objects are collected too, so that the cyclic garbage
    of finished modules (their fixtures' models) is freed."""
    global _tests_since_full_collection
    keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy("float32")
    keras.backend.clear_session(free_memory=False)
    _tests_since_full_collection += 1
    if _tests_since_full_collection >= FULL_COLLECTION_EVERY:
        _tests_since_full_collection = 0
        gc.unfreeze()
    gc.collect()
    gc.freeze()
