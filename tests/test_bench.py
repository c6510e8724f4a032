"""benchmarks/bench.py: its bookkeeping (rounds, ratios, rows, tables) with a
stubbed clock, and one very small real run of its command line through the
project's own trainer. No assertion is about speed."""

import json
import os

import pytest

from keras_vit.cli import bench as cli_bench

bench = cli_bench._load()  # puts benchmarks/ on sys.path for its sections' modules
import bench_core  # noqa: E402
import bench_exports  # noqa: E402
import bench_training  # noqa: E402
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class StubProbe:
    def __init__(self):
        self.samples = 0

    def sample(self):
        self.samples += 1

    def peak(self, dtype):
        return {"float32": 100.0, "bfloat16": 200.0}[dtype]

    def summary(self):
        return {"float32_gflops": 100.0}


def test_alternate_times_every_runner_in_every_round(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(bench_core.time, "perf_counter", clock)
    costs = {"a": [1.0, 1.0, 1.0, 1.0, 5.0], "b": [2.0, 2.0, 2.0, 3.0, 4.0]}
    order = []

    def runner(name):
        def run():
            order.append(name)
            clock.now += costs[name].pop(0)
        return run

    probe = StubProbe()
    rounds = bench_core.alternate({"a": runner("a"), "b": runner("b")}, rounds=3, block_seconds=0, probe=probe,
                             warmup=2)
    # warm-up (a, a, b, b), then a, b alternating with a probe sample per round
    assert order == ["a", "a", "b", "b", "a", "b", "a", "b", "a", "b"]
    assert rounds == {"a": [1.0, 1.0, 5.0], "b": [2.0, 3.0, 4.0]}
    assert probe.samples == 3
    # medians of the same rounds: b (median 3 s) vs a (median 1 s)
    assert bench_core._ratio_to(rounds, "a", "b") == pytest.approx(3.0)
    assert bench_core._ratio_to(rounds, "a", "missing") is None


def test_training_rows_per_step_fraction_and_ratios():
    hub = bench_core.Contender("keras-hub", "float32", True, "fit")
    ours = bench_core.Contender("keras-vit", "bfloat16", False, "train()")
    torch = bench_core.Contender("torch", "float32", False)
    contenders = {c.label: c for c in (hub, ours, torch)}
    assert set(contenders) == {"keras-hub fit float32 XLA", "keras-vit train() bfloat16 no-XLA", "torch float32"}
    rounds = {hub.label: [4.0, 6.0, 5.0], ours.label: [1.0, 2.0, 1.5], torch.label: [3.0, 3.0, 3.0],
              bench_training.PIPELINE: [0.8, 0.8, 0.8]}
    steps = {hub.label: 2, ours.label: 1, torch.label: 1, bench_training.PIPELINE: 4}
    rows = {r["label"]: r for r in bench_training.training_rows(rounds, steps, contenders, StubProbe(), "S/16", 224, 16,
                                                       flops=3e9)}
    mine = rows[ours.label]
    assert mine["step_seconds"] == 1.5 and mine["images_per_s"] == pytest.approx(16 / 1.5)
    assert mine["vs_keras_hub_fit_float32_xla"] == pytest.approx(2.5 / 1.5)  # fit ran 2 steps per call
    assert mine["vs_torch_float32"] == pytest.approx(3.0 / 1.5)
    # 16 images x 3 GFLOP / 1.5 s against the bfloat16 limit
    assert mine["fraction_of_peak"] == pytest.approx(16 * 3 / 1.5 / 200.0)
    assert rows[hub.label]["vs_keras_hub_fit_float32_xla"] == 1.0
    pipeline = rows[bench_training.PIPELINE]
    assert pipeline["images_per_s"] == pytest.approx(16 / 0.2) and pipeline["fraction_of_peak"] is None
    assert pipeline["vs_torch_float32"] is None
    table = bench.markdown({"machine": _machine(), "training": list(rows.values())})
    assert "| S/16@224 | 16 | keras-vit train() bfloat16 no-XLA | 10.67 | 1.67x | 2.00x | 16% |" in table


def test_int8_rows_are_named_for_what_they_are():
    assert "dynamic-range" in bench_exports.ARTIFACTS["tflite-dynamic"]
    assert "full-integer" in bench_exports.ARTIFACTS["tflite-int8"] and "calibrated" in bench_exports.ARTIFACTS["tflite-int8"]
    rows = [{"variant": "B/16", "image_size": 224, "threads": 1, "kind": bench_exports.ARTIFACTS[f], "latency_ms": 100.0,
             "megabytes": 84.0, "speedup_vs_tflite_float32": 3.0, "top1_agreement_with_keras": 1.0,
             "agreement_images": 16, "fraction_of_float32_peak": None} for f in ("tflite-dynamic", "tflite-int8")]
    table = bench.markdown({"machine": _machine(), "tflite": rows})
    assert "TFLite dynamic-range int8 (int8 weights, float activations) | 100.0 | 84.0 | 3.00x | 100% of 16 | - |" \
        in table
    assert "TFLite full-integer int8 (calibrated)" in table
    assert "| int8 |" not in table


def test_keras_vit_bench_passes_every_option_through():
    import argparse

    parser = argparse.ArgumentParser()
    cli_bench.add_arguments(parser)
    args = parser.parse_args(["--quick", "--sections", "training", "--match", "train()", "--train-batches", "2"])
    assert args.quick and args.sections == ["training"] and args.match == ["train()"] and args.train_batches == [2]
    bench.fill_defaults(args)  # --quick's values only where none was given
    assert args.train_batches == [2] and args.train_cases == ["S/16@224"] and args.rounds == 3
    full = bench.fill_defaults(parser.parse_args(["--rounds", "1"]))
    assert full.rounds == 1 and full.train_cases == ["S/16@224", "B/16@224"] and full.train_batches == [16, 64]


@pytest.mark.slow
def test_smallest_real_run_has_trainer_rows(tmp_path, monkeypatch):
    # bench.py's command line in this process (its __main__ only puts the checkout on sys.path, as
    # cli_bench._load() did here, and exits with main's status).
    output = tmp_path / "bench.json"
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")  # what bench.run sets by default, undone afterwards
    monkeypatch.chdir(tmp_path)
    assert bench.main(["--sections", "training", "--train-cases", "Nano/4@16", "--train-batches", "2", "--rounds", "2",
                       "--block-seconds", "0", "--pipeline-batches", "1", "--impls", "keras-vit", "--dtypes",
                       "float32", "--match", "train() float32 no-XLA", "--output", str(output)]) == 0
    report = json.loads(output.read_text())
    rows = {r["label"]: r for r in report["training"]}
    assert set(rows) == {"keras-vit train() float32 no-XLA", bench_training.PIPELINE}
    trainer = rows["keras-vit train() float32 no-XLA"]
    assert trainer["path"] == "train()" and trainer["rounds"] == 2 and len(trainer["round_seconds"]) == 2
    assert trainer["images_per_s"] > 0 and 0 < trainer["fraction_of_peak"]
    assert rows[bench_training.PIPELINE]["rounds"] == 2
    assert report["arguments"]["rounds"] == 2 and "float32" in report["matmul_peak"]


def _machine():
    return {"cpu": "test", "cores": 2, "memory_gib": 1, "gpu": "none", "load_average_at_start": (0, 0, 0)}


def _load_plot():
    import importlib.util

    spec = importlib.util.spec_from_file_location("keras_vit_benchmarks_plot", os.path.join(ROOT, "benchmarks", "plot.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_plot_lines_against_batch_and_resolution(tmp_path):
    plot = _load_plot()
    rows = [{"variant": "B/16", "image_size": size, "batch": batch, "label": "keras-vit float32 XLA",
             "images_per_s": size / batch} for size in (224, 384) for batch in (8, 1)]
    against_batch = plot.series(rows, "batch", "images_per_s")
    assert against_batch == {"B/16@224 keras-vit float32 XLA": [(1, 224.0), (8, 28.0)],
                             "B/16@384 keras-vit float32 XLA": [(1, 384.0), (8, 48.0)]}
    against_size = plot.series(rows, "image_size", "images_per_s")
    assert against_size["B/16 batch 8 keras-vit float32 XLA"] == [(224, 28.0), (384, 48.0)]
    memory = [{"mode": "training", "variant": "S/16", "image_size": 224, "batch": 16, "label": "torch float32",
               "peak_rss_mib": 900.0}]
    assert plot.series(memory, "batch", "peak_rss_mib") == {"training S/16@224 torch float32": [(16, 900.0)]}

    results = tmp_path / "results.json"
    results.write_text(json.dumps({"machine": _machine(), "inference": rows, "memory": memory}))
    out = tmp_path / "out.png"
    assert plot.main([str(results), str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot.main([str(tmp_path / "missing.json"), str(out)]) == 2

    # Two runs' JSONs into one figure: rows side by side.
    more = tmp_path / "more.json"
    training = [dict(rows[0], fraction_of_peak=0.6, label="keras-vit train() float32 XLA")]
    more.write_text(json.dumps({"machine": _machine(), "training": training}))
    merged = plot.merge([json.loads(results.read_text()), json.loads(more.read_text())])
    assert merged["inference"] == rows and merged["training"] == training and merged["memory"] == memory
    assert plot.main([str(results), str(more), str(out)]) == 0


def test_attention_share_of_the_flops_grows_with_resolution():
    # ViT-B/16 at 224 counted by hand: 197 tokens of width 768, MLP 3072, 12 blocks.
    n, d, m = 197, 768, 3072
    attention = 12 * 2 * n * n * d
    total = 196 * 16 * 16 * 3 * d + 12 * (4 * n * d * d + 2 * n * n * d + 2 * n * d * m)
    assert bench_core.macs_per_image("B/16", 224) == total
    assert bench_core.attention_share("B/16", 224) == pytest.approx(attention / total)  # 4.1%
    assert bench_core.attention_share("B/16", 384) == pytest.approx(0.111, abs=1e-3)
    assert bench_core.attention_share("S/16", 384) > bench_core.attention_share("S/16", 224)


@pytest.mark.slow
def test_decompose_and_fused_ab_run_on_the_smallest_model(tmp_path):
    import decompose
    import fused_ab

    out = tmp_path / "lines.jsonl"
    tiny = ["--case", "Nano/4@16", "--batch", "2", "--rounds", "1", "--block-seconds", "0", "--output", str(out)]
    assert decompose.main(tiny + ["--training", "--no-xla"]) == 0
    assert fused_ab.main(tiny) == 0
    step, ab = [json.loads(line) for line in out.read_text().splitlines()]
    assert step["mode"].startswith("training") and step["xla"] is False
    for key in ("matmuls_of_probe", "model_of_matmuls", "model_of_probe", "model_of_trainer", "trainer_of_probe"):
        assert step[key] > 0, key
    assert set(ab["ms"]) == {"gradient fused", "gradient plain", "GELU fused", "GELU plain"}
    assert ab["gradient_speedup"] > 0 and ab["GELU_speedup"] > 0


# --- the speed guard (make bench-check: benchmarks/check.py) -------------------------------------

def _check_run(monkeypatch, tmp_path, seconds, *extra):
    """benchmarks/check.py's main with runners that take `seconds` each on a stubbed clock."""
    import check

    clock = FakeClock()
    monkeypatch.setattr(bench_core.time, "perf_counter", clock)

    def runner(cost):
        def run():
            clock.now += cost
        return run

    pairs = [("train()", "keras-vit fit"), ("inference", "keras-hub inference")]
    monkeypatch.setattr(check, "runners", lambda *args: ({k: (lambda v=v: runner(v)) for k, v in seconds.items()},
                                                         pairs))
    monkeypatch.setattr(check, "MatmulProbe", lambda dtypes: StubProbe())
    results = tmp_path / "check.jsonl"
    code = check.main(["--rounds", "3", "--results", str(results), *extra])
    return code, [json.loads(line) for line in results.read_text().splitlines()]


def test_the_speed_guard_fails_below_its_floor_and_keeps_a_row(monkeypatch, tmp_path, capsys):
    code, rows = _check_run(monkeypatch, tmp_path, {"train()": 1.0, "keras-vit fit": 1.0, "inference": 1.0,
                                                    "keras-hub inference": 1.0})
    assert code == 0 and rows[-1]["paired"] == {"train() / keras-vit fit": 1.0, "inference / keras-hub inference": 1.0}
    # The trainer 4% slower than fit: below 0.97x, named, and the run exits 1.
    code, rows = _check_run(monkeypatch, tmp_path, {"train()": 1.04, "keras-vit fit": 1.0, "inference": 1.0,
                                                    "keras-hub inference": 1.02})
    out, err = capsys.readouterr()
    assert code == 1 and rows[-1]["paired"]["train() / keras-vit fit"] == pytest.approx(1 / 1.04)
    assert "bench-check: train() / keras-vit fit below 0.97x" in err and "inference /" not in err
    assert "docs/benchmarks.md row: |" in out
    # --only: the pairs named, and only their contenders built and timed.
    code, rows = _check_run(monkeypatch, tmp_path, {"train()": 1.0, "keras-vit fit": 1.01, "inference": 1.0,
                                                    "keras-hub inference": 0.5}, "--only", "fit")
    assert code == 0 and rows[-1]["paired"] == {"train() / keras-vit fit": pytest.approx(1.01)}
    assert set(rows[-1]["seconds_per_call"]) == {"train()", "keras-vit fit"}
