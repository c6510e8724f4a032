"""benchmarks/gpu.py (#39) in its reduced form: the same code the GPU machine runs, on the CPU,
one fresh process per Keras backend."""

import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_the_reduced_gpu_benchmark_runs_every_section_on_every_backend(tmp_path):
    spec = importlib.util.spec_from_file_location("keras_vit_benchmarks_gpu", os.path.join(ROOT, "benchmarks", "gpu.py"))
    gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu)
    gpu.main(["--reduced", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "results_gpu.json").read_text())
    rows = {row["backend"]: row for row in results["backends"]}
    assert set(rows) == set(gpu.BACKENDS) and results["spec"] == gpu.REDUCED
    for row in rows.values():
        assert row["device"] == "cpu" and row["inference_mfu"] is None and row["training_mfu"] is None
        assert row["inference_images_s"] > 0 and row["training_images_s"] > 0
    latency = rows["tensorflow"]["int8"]
    assert set(latency) == {"batch_1", "batch_4"} and all(v > 0 for r in latency.values() for v in r.values())
    trainer = rows["tensorflow"]["trainer"]  # keras_vit's trainer against fit of the same model
    assert trainer["trainer_images_s"] > 0 and trainer["fit_images_s"] > 0
    assert trainer["trainer_vs_fit"] == pytest.approx(trainer["trainer_images_s"] / trainer["fit_images_s"])
    assert "memory" not in rows["tensorflow"]  # accelerators only: a CPU process's high-water mark never falls
    table = (tmp_path / "results_gpu.md").read_text()
    assert "| jax | cpu |" in table and "| batch 1 |" in table
