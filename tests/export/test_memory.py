"""The export's memory estimate: refused before anything is converted where it cannot fit, with a
message naming the estimate and the memory available; `--ignore-memory-estimate` overrides it."""

import pytest

from kzoo import export
from kzoo.export import memory
from tests.export.tiny_models import QUICK
from tests.export.tiny_models import build
from tests.export.tiny_models import load_export_command

export_command = load_export_command()


@pytest.fixture(scope="module")
def model():
    return build("gpt")


@pytest.fixture(scope="module")
def quick_model():
    """For the whole export: a feed-forward LM, one signature without a cache, exports in a tenth
    of the GPT's time."""
    return build("feed_forward_lm")


def test_the_estimate_is_weights_checks_and_libraries(model):
    weights = 4 * model.count_params()
    cache = 4 * 2 * 2 * 2 * 16 * 8  # layers x (K, V) x heads x positions x head width, float32
    assert memory.float32_weight_bytes(model) == weights
    assert memory.cache_bytes(model, 16) == cache
    estimate = memory.check_memory(model, 16, 16, 8, 64, available=10**12, resident=0)
    logits = 4 * 8 * 16 * 64
    assert estimate["estimated_peak_bytes"] == memory.estimated_peak_bytes(weights, cache, logits)
    assert estimate["estimated_peak_bytes"] == int(
        memory.WEIGHT_COPIES * weights + memory.CHECK_COPIES * (cache + logits) + memory.BASE_BYTES
    )
    # An export that loaded the model lets go of it before its checks: fewer copies of the weights.
    released = memory.check_memory(model, 16, 16, 8, 64, available=10**12, resident=0, releases_model=True)
    assert released["estimated_peak_bytes"] == int(
        memory.RELEASED_WEIGHT_COPIES * weights + memory.CHECK_COPIES * (cache + logits) + memory.RELEASED_BASE_BYTES
    )


def test_the_estimates_cover_the_measured_exports():
    # `--formats litertlm,litertlm_int4`, the export loading the model (BENCHMARKS.md): SmolLM2-135M
    # (the README's command: a 2,048-slot cache, 3 KV heads, vocabulary 49,152) 4.58 GB measured;
    # Qwen2.5-Coder-0.5B and -1.5B from their GGUF files (4,096-slot caches, 2 KV heads, vocabulary
    # 151,936) 6.58 and 14.45 GB; 8 rows x 256 positions of logits checked.
    for weights, layers, kv_heads, head_dim, slots, vocabulary, measured in (
        (0.538e9, 30, 3, 64, 2048, 49_152, 4.58e9),
        (2.52e9, 24, 2, 64, 4096, 151_936, 6.58e9),
        (7.11e9, 28, 2, 128, 4096, 151_936, 14.45e9),
    ):
        cache, logits = 4 * layers * 2 * kv_heads * slots * head_dim, 4 * 8 * 256 * vocabulary
        estimate = memory.estimated_peak_bytes(weights, cache, logits, releases_model=True)
        assert measured <= estimate <= 1.3 * measured


def test_an_estimate_beyond_the_available_memory_is_refused_naming_both(model):
    estimate = memory.check_memory(model, 16, 16, 8, 64, available=10**12, resident=0)["estimated_peak_bytes"]
    with pytest.raises(ValueError, match=r"peak at \d+\.\d GB .* host has 0\.1 GB available.*--ignore-memory-estimate"):
        memory.check_memory(model, 16, 16, 8, 64, available=int(0.1e9), resident=0)
    # What the process already holds is part of the peak: only the rest must be available.
    memory.check_memory(model, 16, 16, 8, 64, available=int(0.1e9), resident=estimate - int(0.1e9))
    assert memory.check_memory(model, 16, 16, 8, 64, available=1, resident=0, ignore=True)["available_bytes"] == 1


def test_the_host_s_available_memory_is_read():
    available = memory.available_bytes()
    assert available is None or available > 0
    assert memory.resident_bytes() > 0


def test_an_export_that_cannot_fit_writes_nothing(model, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(memory, "available_bytes", lambda: int(0.1e9))
    monkeypatch.setattr(memory, "resident_bytes", lambda: 0)
    with pytest.raises(export.ExportError, match=r"estimated to peak at .* GB .* 0\.1 GB available"):
        export.export(model, tmp_path / "out", "tflite_fp32", **QUICK)
    assert list(tmp_path.iterdir()) == []
    path = tmp_path / "gpt.keras"
    model.save(path)
    assert export_command.main([str(path), "--out", str(tmp_path / "out"), "--formats", "tflite_fp32"]) == 1
    assert "export failed: The export is estimated to peak at" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt.keras"]


def test_the_override_exports_and_reports_the_estimate(quick_model, tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: int(0.1e9))
    monkeypatch.setattr(memory, "resident_bytes", lambda: 0)
    report = export.export(quick_model, tmp_path / "out", "tflite_fp32", ignore_memory_estimate=True, **QUICK)
    assert report["memory"]["available_bytes"] == int(0.1e9)
    assert report["memory"]["estimated_peak_bytes"] > int(0.1e9)
    assert (tmp_path / "out" / "model_fp32.tflite").is_file()
    assert (
        export_command.make_parser().parse_args(["m", "--out", "o", "--ignore-memory-estimate"]).ignore_memory_estimate
    )
