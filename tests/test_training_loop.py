"""The training loop in this process: learning, accumulation, NaN, workdir
compatibility, SIGTERM, weight transfer (multi-device tests: test_training_distributed.py)."""

import json
import os
import signal

import numpy as np
import pytest

from keras_vit import training
from tests.training_helpers import TINY, checkpoint_arrays, tiny_config, weights_of


@pytest.fixture(scope="module")
def learned(tmp_path_factory):
    """A short real run on the MNIST digits (shared by the tests below)."""
    workdir = tmp_path_factory.mktemp("mnist")
    config = tiny_config(workdir, model=TINY.replace(hidden_size=32, mlp_dim=64), steps=200, batch_size=64,
                         learning_rate=3e-3, warmup_steps=10, eval_every=100, classifier="token", fewshot_shots=(1, 5),
                         log_every=10)
    return workdir, training.train(config)


@pytest.mark.slow
def test_mnist_digits_learn(learned):
    workdir, results = learned
    # 10 balanced classes: chance is 0.1.
    assert results["eval"]["accuracy"] > 0.5, results["eval"]
    assert results["eval"]["num_examples"] == 1000
    assert results["eval"]["top5"] >= results["eval"]["accuracy"]
    assert [e["step"] for e in results["eval_history"]] == [100]
    assert results["steps"] == 200 and results["images_per_sec"] > 0
    assert set(results["fewshot"]) == {"1shot", "5shot"}
    assert all(0.1 < acc <= 1.0 for acc in results["fewshot"].values())
    on_disk = json.loads((workdir / "results.json").read_text())
    assert on_disk["eval"] == results["eval"]
    assert on_disk["config"]["recipe"]["name"] == "scratch"
    assert training.TrainConfig.from_dict(on_disk["config"]).recipe.steps == 200
    assert any((workdir / "tensorboard").iterdir())


@pytest.mark.slow
def test_model_keras_reproduces_the_eval_accuracy(learned):
    import keras

    from keras_vit.training.data import load_mnist5k

    workdir, results = learned
    model = keras.models.load_model(workdir / "model.keras", compile=False)
    _, (images, labels) = load_mnist5k()
    logits = model.predict(images.astype("float32") / 127.5 - 1.0, batch_size=500, verbose=0)
    assert np.mean(np.argmax(logits, -1) == labels) == pytest.approx(results["eval"]["accuracy"], abs=1e-3)


@pytest.mark.slow
def test_weights_from_a_workdir_transfer_the_encoder(learned, tmp_path):
    workdir, _ = learned
    source = {w.path: w.numpy() for w in __import__("keras").models.load_model(workdir / "model.keras").weights}
    results = training.train(tiny_config(tmp_path / "ft", model=None, weights=str(workdir), steps=0))
    import keras

    model = keras.models.load_model(results["model_path"])
    target = {w.path: w.numpy() for w in model.weights}
    encoder = [p for p in source if not p.startswith("head")]
    assert encoder and all(np.array_equal(source[p], target[p]) for p in encoder)
    assert not np.any(target["head/kernel"])  # a new, zero-initialised head


@pytest.mark.slow
def test_accumulation_equals_the_large_batch(tmp_path):
    one = training.train(tiny_config(tmp_path / "one", batch_size=32, steps=3))
    two = training.train(tiny_config(tmp_path / "two", batch_size=32, steps=3, accum_steps=2))
    assert one["built"]["fused_gelu"] is True  # a step without XLA takes the fused GELU
    for a, b in zip(weights_of(one["model_path"]), weights_of(two["model_path"])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert one["eval"]["loss"] == pytest.approx(two["eval"]["loss"], rel=1e-5)


@pytest.mark.slow
def test_remat_trains_the_same_network_in_the_same_steps(tmp_path):
    # Dropout and stochastic depth on, XLA as by default: rematerialised
    # blocks must recompute with the masks of the forward pass.
    regularised = TINY.replace(num_layers=2, dropout_rate=0.1, attention_dropout_rate=0.1,
                               stochastic_depth_rate=0.2)
    runs = {remat: training.train(tiny_config(tmp_path / str(remat), model=regularised, steps=3,
                                              jit_compile=True, remat=remat))
            for remat in (False, True)}
    assert runs[True]["built"]["rematerialized_blocks"] == 2
    assert runs[False]["built"]["rematerialized_blocks"] == 0
    assert runs[False]["built"]["fused_gelu"] is False  # XLA fuses it by itself
    for a, b in zip(weights_of(runs[False]["model_path"]), weights_of(runs[True]["model_path"])):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    config = tiny_config(tmp_path, optimizer="sgd", learning_rate=1e6, grad_clip_norm=None, steps=20,
                         checkpoint_every=1)
    with pytest.raises(training.NonFiniteLossError, match="became") as error:
        training.train(config)
    assert "last good checkpoint" in str(error.value)
    checkpoints = sorted((tmp_path / "checkpoints").glob("ckpt-*.npz"))
    assert checkpoints, "no checkpoint was kept"
    for array in checkpoint_arrays(checkpoints[-1]).values():
        if array.dtype.kind == "f":
            assert np.all(np.isfinite(array))
    assert not (tmp_path / "model.keras").exists()


@pytest.mark.slow
def test_incompatible_workdir_is_an_error_and_untouched(tmp_path):
    training.train(tiny_config(tmp_path, steps=2))
    before = {p.name: p.read_bytes() for p in (tmp_path / "checkpoints").iterdir()}
    with pytest.raises(training.IncompatibleCheckpointError, match="different run") as error:
        training.train(tiny_config(tmp_path, model=TINY.replace(hidden_size=32), steps=4))
    assert "hidden_size" in str(error.value) and "new workdir" in str(error.value)  # Python: the keyword
    after = {p.name: p.read_bytes() for p in (tmp_path / "checkpoints").iterdir()}
    assert after == before


@pytest.mark.parametrize("steps_per_loop, signal_at, checkpoint_at", [(1, 2, 2), (3, 1, 3)])
@pytest.mark.slow
def test_sigterm_checkpoints_at_the_loop_boundary_then_the_same_call_resumes(
        tmp_path, steps_per_loop, signal_at, checkpoint_at):
    config = tiny_config(tmp_path, steps=6, checkpoint_every=100, steps_per_loop=steps_per_loop)

    def terminate(step, logs):
        if step == signal_at:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(training.TrainingInterrupted, match="re-run"):
        training.train(config, callbacks=[terminate])
    # Callbacks run once the loop holding their step has ended: the loop in
    # flight is finished, then the checkpoint is written.
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [f"ckpt-{checkpoint_at:08d}.npz"]
    results = training.train(config)
    assert results["steps"] == 6 and results["steps_this_session"] == 6 - checkpoint_at


@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
@pytest.mark.slow
def test_mixed_precision_trains_and_writes_a_float32_model(tmp_path, precision):
    import keras

    results = training.train(tiny_config(tmp_path, precision=precision, steps=2))
    assert np.isfinite(results["eval"]["loss"])
    model = keras.models.load_model(results["model_path"])
    assert model.dtype_policy.name == "float32"
    assert {w.dtype for w in model.weights} == {"float32"}
    meta = json.loads(str(np.load(tmp_path / "checkpoints" / "ckpt-00000002.npz")["meta"]))
    assert meta["fingerprint"]["precision"] == precision
    if precision == "mixed_float16":  # the dynamic loss scale is checkpointed
        assert any("scale" in name for name, _, _ in meta["optimizer_variables"])


def _rewrite_checkpoint(path, change):
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays["meta"]))
    change(meta, arrays)
    arrays["meta"] = np.array(json.dumps(meta))
    with open(path, "wb") as f:
        np.savez(f, **arrays)


@pytest.mark.slow
def test_resume_matches_variables_by_name_and_refuses_other_names(tmp_path):
    """q, k and v kernels share one shape: a checkpoint whose stored order
    differs must still put each array where its name says (#29)."""
    training.train(tiny_config(tmp_path, steps=2, checkpoint_every=2))
    path = tmp_path / "checkpoints" / "ckpt-00000002.npz"
    saved = checkpoint_arrays(path)
    with np.load(path) as data:
        entries = json.loads(str(data["meta"]))["model_variables"]
    q = next(i for i, e in enumerate(entries) if e[0].endswith("query/kernel"))
    k = next(i for i, e in enumerate(entries) if e[0].endswith("key/kernel"))
    assert not np.array_equal(saved[f"model/{q:05d}"], saved[f"model/{k:05d}"])

    def swap(meta, arrays):
        rows = meta["model_variables"]
        rows[q], rows[k] = rows[k], rows[q]
        arrays[f"model/{q:05d}"], arrays[f"model/{k:05d}"] = arrays[f"model/{k:05d}"], arrays[f"model/{q:05d}"]

    _rewrite_checkpoint(path, swap)
    trainer = training.Trainer(tiny_config(tmp_path, steps=4, checkpoint_every=2))
    trainer.build()
    trainer.restore()
    by_path = {v.path: v.numpy() for v in trainer.model.variables}
    np.testing.assert_array_equal(by_path[entries[q][0]], saved[f"model/{q:05d}"])
    np.testing.assert_array_equal(by_path[entries[k][0]], saved[f"model/{k:05d}"])

    def rename(meta, arrays):
        for row in meta["model_variables"]:
            row[0] = row[0].replace("query/kernel", "q_proj/kernel")

    _rewrite_checkpoint(path, rename)
    with pytest.raises(training.IncompatibleCheckpointError, match="q_proj"):
        training.train(tiny_config(tmp_path, steps=4, checkpoint_every=2))


@pytest.mark.slow
def test_training_figures_average_over_the_examples_that_count(tmp_path):
    """A zero-initialised head gives every class the same logit: each counted
    example's loss is exactly ln(classes), whatever weighs 0 in the batch.
    Divided by the nominal batch, an unreadable file would pull it down."""
    from PIL import Image

    for c in range(3):
        os.makedirs(tmp_path / "photos" / f"c{c}")
        for i in range(10):
            Image.fromarray(np.full((9, 9, 3), 20 * c + i, np.uint8)).save(tmp_path / "photos" / f"c{c}" / f"{i}.png")
    source_check = training.TrainConfig.create("scratch", model=TINY, dataset=f"folder:{tmp_path / 'photos'}")
    from keras_vit.training import data as data_lib

    data_lib.open_source(source_check)  # the header check passes; the file breaks afterwards
    logs = []
    config = tiny_config(tmp_path / "run", dataset=f"folder:{tmp_path / 'photos'}", steps=1, batch_size=27,
                         image_size=28, learning_rate=0.0, label_smoothing=0.0, eval_batch_size=3)
    victim = tmp_path / "photos" / "c0" / "3.png"

    class Break:
        def on_step_end(self, step, logs_):
            logs.append(logs_)

    # Damage one file between the header check and its decoding.
    original = data_lib.train_dataset

    def damaged(*args, **kwargs):
        victim.write_bytes(victim.read_bytes()[:40])
        return original(*args, **kwargs)

    data_lib.train_dataset = damaged
    try:
        training.train(config, callbacks=[Break()])
    finally:
        data_lib.train_dataset = original
    assert logs[0]["skipped_examples"] == 1
    assert logs[0]["loss"] == pytest.approx(np.log(3), rel=1e-5)


@pytest.mark.slow
def test_a_custom_tasks_export_holds_the_moving_average(tmp_path):
    """A Task whose export_model returns the model itself: model.keras must
    hold the EMA weights, not the trained ones (#29)."""
    from keras_vit.tasks import ClassificationTask

    class AsIs(ClassificationTask):
        def export_model(self, model):
            return model

    config = tiny_config(tmp_path, steps=3, ema=0.5, checkpoint_every=3, learning_rate=3e-2)
    training.train(config, task=AsIs())
    with np.load(tmp_path / "checkpoints" / "ckpt-00000003.npz") as data:
        meta = json.loads(str(data["meta"]))
        arrays = {k: data[k] for k in data.files}
    averages = {row[0].split("/", 1)[1][:-len("_average")]: arrays[f"optimizer/{i:05d}"]
                for i, row in enumerate(meta["optimizer_variables"]) if row[0].endswith("_average")}
    trained = {row[0].replace("/", "_"): arrays[f"model/{i:05d}"] for i, row in enumerate(meta["model_variables"])}
    import keras

    exported = keras.models.load_model(tmp_path / "model.keras", compile=False)
    differs = 0
    for variable in exported.trainable_variables:
        key = variable.path.replace("/", "_")
        np.testing.assert_allclose(variable.numpy(), averages[key], rtol=1e-6, atol=1e-7, err_msg=key)
        differs += not np.allclose(averages[key], trained[key])
    assert differs > 0  # the average is not the trained weights


@pytest.mark.slow
def test_a_run_of_no_steps_with_a_weight_average_keeps_its_weights(tmp_path):
    """Keras fills the averages at the first applied step: before it they are
    zeros, which must not be evaluated or saved as the model."""
    import keras

    results = training.train(tiny_config(tmp_path, steps=0, ema=0.5))
    model = keras.models.load_model(tmp_path / "model.keras", compile=False)
    kernels = {v.path: v.numpy() for v in model.variables if v.path.endswith("kernel") and "head" not in v.path}
    assert results["steps"] == 0 and kernels and all(np.abs(w).max() > 0 for w in kernels.values()), kernels.keys()
