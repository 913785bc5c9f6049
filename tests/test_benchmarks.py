"""The benchmarks' FLOP counts, against the figures derived by hand in ../shared/peer-baseline.md."""

import numpy as np
import pytest

from benchmarks import training


@pytest.mark.parametrize(
    "case, gflop_per_step",
    [
        # tokens (6N + 12 L d S), N = 5,256,704: 4096 * (31,540,224 + 3,145,728)
        (training.gpt_case, 142.07),
        # tokens (6 N_body + 12 L d S) + masked 6 N_head, N_body = 3,159,552, N_head = 2,171,648
        (training.bert_case, 92.43),
    ],
)
def test_model_flops_match_the_hand_count(case, gflop_per_step):
    _, _, hub, ours, flops = case(np.random.default_rng(0))
    for build in (hub, ours):
        assert flops(build()) / 1e9 == pytest.approx(gflop_per_step, abs=0.005)


def test_seq2seq_peer_is_the_same_size_as_kzoos_model():
    _, tokens, hub, ours, flops = training.seq2seq_case(np.random.default_rng(0))
    assert hub().count_params() == ours().count_params() == 297_472
    # 64 x 64 target tokens (6 N + 12 d (L_enc S + 2 L_dec S)), d = 64, S = T = 64, L = 2 + 2
    assert flops(ours()) == 64 * 64 * (6 * 297_472 + 12 * 64 * (2 * 64 + 2 * 2 * 64))
    assert tokens == 2 * 64 * 64


@pytest.mark.parametrize("case", [training.gpt_case, training.bert_case, training.seq2seq_case])
def test_batch_multiplier_scales_tokens_and_flops_together(case):
    _, tokens, _, ours, flops = case(np.random.default_rng(0))
    data, tokens_x2, _, _, flops_x2 = case(np.random.default_rng(0), 2)
    model = ours()
    assert tokens_x2 == 2 * tokens and flops_x2(model) == 2 * flops(model)
    x = next(iter(data))[0]
    assert len(next(iter(x.values()))) == 2 * {training.gpt_case: 16, training.bert_case: 32}.get(case, 64)


@pytest.mark.slow
def test_litertlm_benchmark_measures_every_row():
    """The GPT-2-small LiteRT-LM benchmark, at gpt_tiny size: every figure measured, the bundle verified."""
    import argparse

    from benchmarks import litertlm

    results = litertlm.scale(argparse.Namespace(preset="gpt_tiny", cache_length=64, prompt=8, new_tokens=8, repeats=1))
    assert results["fp32"]["verified"]["generation"]["matches_keras"]
    assert results["export"]["seconds"] > 0 and results["export"]["peak_resident_bytes"] > 0
    for precision in ("fp32", "int8"):
        assert (
            results[precision]["decode_ms_per_token"] > 0 and results[precision]["end_to_end_new_tokens_per_second"] > 0
        )
    assert results["keras_generate_batch1"]["new_tokens_per_second"] > 0
    assert set(results["targets"]) == {
        "fp32_step_over_weight_floor",
        "int8_end_to_end_over_keras",
        "fp32_file_over_weights",
    }


def test_every_export_memory_stage_names_a_function_its_callers_look_up():
    # A stage whose function was renamed would silently drop out of the table.
    import importlib

    from benchmarks import export_memory

    for module_name, attribute, _ in export_memory.STAGES:
        owner = importlib.import_module(module_name)
        for part in attribute.split("."):
            owner = getattr(owner, part)
        assert callable(owner), (module_name, attribute)


def test_greedy_runs_times_every_call_and_names_another_output():
    from benchmarks.common import greedy_runs

    class Stats:
        accepted, proposed = 3, 4

    calls = {"alone": lambda prompt: ([prompt + [1]], None), 4: lambda prompt: ([prompt + [1]], Stats())}
    seconds, accepted, proposed, outputs, differ = greedy_runs(calls, [[5], [6, 7]], rounds=2)
    assert set(seconds) == {"alone", 4} and all(value > 0 for value in seconds.values())
    assert (accepted[4], proposed[4], accepted["alone"]) == (12, 16, 0)  # 2 prompts x 2 rounds, timed calls only
    assert outputs[(4, (6, 7))] == [[6, 7, 1]] and differ == []
    calls[8] = lambda prompt: ([prompt + [2]] if prompt == [6, 7] else [prompt + [1]], Stats())
    assert greedy_runs(calls, [[5], [6, 7]], rounds=1)[4] == [8]  # another output on one prompt


@pytest.mark.parametrize("tied", [True, False])
def test_a_decode_floor_counts_an_untied_table_as_looked_up_not_read(tied):
    # An untied token table is only looked up, a row a step; a tied one is the output layer's
    # weights too, read whole. Counting the first as read put Qwen2.5-Coder-1.5B's int4 floor
    # 233 MB too low, below the speed the runtime reached.
    from benchmarks.peers import looked_up_bytes
    from kzoo.export import litertlm
    from kzoo.export.tflite import quantize
    from tests.export.test_litertlm_int4 import tiny_lm

    lm = tiny_lm(64, tie_embeddings=tied)
    float32 = litertlm.bundle_model(litertlm.RuntimeSignatures(lm, 32), "tflite_fp32")
    int8 = quantize.quantize(float32, quantize.INT8)
    assert looked_up_bytes(int8) == (0 if tied else 128 * 64)  # the int8 table, once


@pytest.mark.parametrize("tied", [True, False])
def test_the_keras_decode_floor_reads_every_weight_but_an_untied_table(tied):
    # The same rule in Keras: the untied (128, 64) table is looked up, a tied one is the head.
    from benchmarks.common import weight_floor
    from tests.export.test_litertlm_int4 import tiny_lm

    lm = tiny_lm(64, tie_embeddings=tied)
    seconds, read = weight_floor(lm)
    assert read == 4 * lm.count_params() - (0 if tied else 4 * 128 * 64)
    assert seconds > 0
    assert weight_floor(lm, bandwidth=1e9) == (read / 1e9, read)  # a rate the caller read
