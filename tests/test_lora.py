"""LoRA (#39): the low-rank update against its definition, what trains, merging, adapters,
refusals, and a run whose frozen weights stay exactly as loaded."""

import json

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.cli import main
from keras_vit.errors import UserError
from keras_vit.layers import LowRankUpdate
from keras_vit.model.lora import adapter_params, merge_lora, parameter_counts
from keras_vit.weights.layout import is_lora_key, variables_by_key
from keras_vit.weights.npz import checkpoint_params, load_checkpoint
from keras_vit.weights.parts import CLASSIFIER, part_of
from tests.test_families_model import BASE, FAMILIES, perturbed

ALL = ("query", "key", "value", "out", "mlp")


def _images(seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, size=(2, 16, 16, 3)).astype("float32")


def _with_lora(model, **lora):
    """`model`'s architecture with LoRA, loaded from its weights (the base a run starts from)."""
    config = model.config.replace(**{f"lora_{k}": v for k, v in lora.items()})
    adapted = keras_vit.ViT(config, image_size=model.image_size, num_classes=model.num_classes)
    load_checkpoint(adapted, checkpoint_params(model))
    return adapted


def _perturb_updates(model, seed=3):
    rng = np.random.default_rng(seed)
    for key, variable in variables_by_key(model).items():
        if is_lora_key(key):
            variable.assign(rng.normal(scale=0.3, size=variable.shape).astype("float32"))


@pytest.mark.parametrize("input_axes, in_shape, out_shape", [(1, (6,), (3, 4)), (2, (3, 4), (6,)), (1, (6,), (10,))])
def test_the_update_is_alpha_over_rank_x_a_b_on_the_flattened_projection(input_axes, in_shape, out_shape):
    """peft's LoRA on the projection as a matrix (its input axes and output axes flattened)."""
    update = LowRankUpdate(rank=2, alpha=5.0, output_shape=out_shape, input_axes=input_axes)
    x = np.random.default_rng(0).normal(size=(2, 7, *in_shape)).astype("float32")
    update.build(x.shape)
    a = np.random.default_rng(1).normal(size=update.lora_a.shape).astype("float32")
    b = np.random.default_rng(2).normal(size=update.lora_b.shape).astype("float32")
    update.lora_a.assign(a)
    update.lora_b.assign(b)
    expected = (x.reshape(2, 7, -1) @ a @ b * 2.5).reshape(2, 7, *out_shape)
    np.testing.assert_allclose(update(x), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(update.delta(), a @ b * 2.5, rtol=1e-6)
    assert update.lora_a.shape == (int(np.prod(in_shape)), 2) and update.lora_b.shape == (2, int(np.prod(out_shape)))


def test_a_new_update_starts_at_zero_with_peft_s_uniform_a():
    update = LowRankUpdate(rank=4, alpha=4, output_shape=(8,))
    update.build((None, 5, 64))
    assert not np.any(update.lora_b.numpy())
    a = update.lora_a.numpy()
    assert np.abs(a).max() <= 1 / 8 and a.std() > 0.05  # uniform in +-1/sqrt(64), as peft's kaiming_uniform(a=5**.5)


@pytest.mark.parametrize("family", ["vit", "deit", "siglip", "clip", "dinov2_reg_swiglu", "dinov3", "aimv2"])
def test_a_lora_model_starts_as_its_base_and_trains_only_updates_and_heads(family):
    base = perturbed(keras_vit.ViT(keras_vit.ViTConfig(**BASE, **FAMILIES[family]), image_size=16, num_classes=5))
    adapted = _with_lora(base, rank=2, targets=ALL)
    np.testing.assert_array_equal(adapted(_images()), base(_images()))  # B = 0: the base's function
    keys = {v.path: k for k, v in variables_by_key(adapted).items()}
    trainable = {keys[v.path] for v in adapted.trainable_variables}
    expected = {k for k in keys.values() if is_lora_key(k) or part_of(k).group == CLASSIFIER}
    assert trainable == expected  # DeiT: both heads; SigLIP's MAP head, CLIP's projection: frozen
    # 3 blocks x (4 attention projections 24x24 + the MLP's 24x40 and 40x24 (80 gated)), rank 2
    mlp_out = 80 if family in ("dinov2_reg_swiglu", "aimv2") else 40  # gated: twice the width
    updates = 3 * (4 * 2 * (24 + 24) + 2 * (24 + mlp_out) + 2 * (40 + 24))
    heads = (2 if family == "deit" else 1) * ((20 if family == "clip" else 24) * 5 + 5)
    assert parameter_counts(adapted) == {"trainable": updates + heads,
                                         "total": parameter_counts(base)["total"] + updates}


@pytest.mark.slow
def test_merging_gives_a_plain_model_with_the_same_outputs(tmp_path):
    base = perturbed(keras_vit.ViT(keras_vit.ViTConfig(**BASE, **FAMILIES["dinov2"]), image_size=16, num_classes=5))
    adapted = _with_lora(base, rank=3, alpha=6, targets=("query", "out", "mlp"))
    _perturb_updates(adapted)
    assert np.abs(adapted(_images()) - base(_images())).max() > 1e-2  # the updates do something
    merged = merge_lora(adapted)
    assert merged.config.lora_rank == 0 and not any(is_lora_key(k) for k in variables_by_key(merged))
    np.testing.assert_allclose(merged(_images()), adapted(_images()), rtol=1e-5, atol=1e-5)
    # Unmerged, a .keras file keeps the updates and the frozen weights.
    adapted.save(tmp_path / "adapted.keras")
    again = keras.saving.load_model(tmp_path / "adapted.keras")
    np.testing.assert_array_equal(again(_images()), adapted(_images()))
    assert parameter_counts(again) == parameter_counts(adapted)
    assert merge_lora(merged) is merged and keras_vit.merge_lora is merge_lora


@pytest.mark.slow
def test_vit_b16_with_peft_s_guide_settings_trains_what_peft_reports():
    """peft's image-classification guide (ViT-B/16, r=16 on query and value, the classifier of
    101 classes trained): "trainable params: 667,493". The position table is frozen, so a
    one-patch image counts the same."""
    model = keras_vit.ViT("B/16", image_size=16, num_classes=101, lora_rank=16, lora_alpha=16)
    assert parameter_counts(model)["trainable"] == 667_493


@pytest.mark.parametrize("fields, message", [
    (dict(lora_rank=25), "lora_rank 25 does not fit the projections it adapts (query, value: the smallest is 24"),
    (dict(lora_rank=2, lora_targets=("query", "ffn")), "are not projections LoRA adapts: choose among"),
    (dict(lora_rank=2, lora_alpha=0), "lora_alpha must be positive"),
])
def test_a_lora_setting_that_cannot_be_built_is_one_line(fields, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        keras_vit.ViTConfig(**BASE, **fields)


def test_an_official_layout_writer_refuses_unmerged_updates(tmp_path):
    model = keras_vit.ViT(keras_vit.ViTConfig(**BASE, lora_rank=2), image_size=16, num_classes=5)
    with pytest.raises(UserError, match="merge them first, keras_vit.merge_lora"):
        keras_vit.save_weights(model, tmp_path / "w.npz")
    assert sorted(adapter_params(model)) == sorted(k for k in variables_by_key(model)
                                                   if is_lora_key(k) or k.startswith("head/"))


@pytest.mark.parametrize("argv, message", [
    (["--model", "Nano/4", "--lora-rank", "4"], "--lora-rank adapts pre-trained weights, and this run has none"),
    (["--recipe", "masked_patch", "--lora-rank", "4"], "--lora-rank fine-tunes a classifier; the masked_patch task"),
    (["--lora-rank", "4", "--lora-targets", "query,ffn"], "argument --lora-targets: 'query,ffn': choose among"),
    (["--lora-rank", "4096"], "--lora-rank 4096 does not fit the projections it adapts (query, value: the smallest "
                              "is 32 wide): choose a rank from 1 to 32"),
])
def test_lora_without_weights_or_a_classifier_is_one_line_before_the_data(argv, message, digits_run, tmp_path,
                                                                           capsys):
    weights = [] if "--model" in argv else ["--weights", str(digits_run)]
    code = main(["train", *weights, "--dataset", f"folder:{tmp_path / 'none'}", "--workdir", str(tmp_path / "r"),
                 "--steps", "2", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err  # the folder is not read


def test_an_injected_task_is_refused_lora_as_the_recipe_s_is(digits_run, tmp_path):
    """train(config, task=MaskedPatchTask()) with lora_rank: the Task the run trains is checked,
    not the one the config would make (a classifier), before the data is read."""
    from keras_vit.training import TrainConfig, train
    from keras_vit.tasks.masked_patch import MaskedPatchTask

    config = TrainConfig.create("finetune", weights=str(digits_run), dataset=f"folder:{tmp_path / 'none'}",
                                workdir=str(tmp_path / "r"), steps=2, lora_rank=4, progress=False)
    with pytest.raises(UserError, match="lora_rank fine-tunes a classifier; the masked_patch task"):
        train(config, task=MaskedPatchTask())


@pytest.mark.slow
def test_a_lora_run_changes_only_the_updates_and_the_head(digits_run, tmp_path, capsys):
    """From a finished run, under mixed_bfloat16 with --remat: every frozen weight of model.keras
    equals the base's bit for bit, each adapted kernel is the base's plus alpha/rank A B of the
    adapter file, and the adapter applied to the base again is model.keras."""
    from keras_vit.runs.adapter import read_adapter
    from keras_vit.training import load_adapter
    from tests.test_cli import TRAIN

    workdir = tmp_path / "lora"
    argv = [*TRAIN, "--weights", str(digits_run), "--workdir", str(workdir), "--steps", "3",
            "--learning-rate", "0.05", "--lora-rank", "2", "--lora-alpha", "3", "--lora-targets", "query,out,mlp",
            "--precision", "mixed_bfloat16", "--remat"]
    assert main([a for a in argv if a not in ("--model", "Nano/4", "--patch-size", "7")]) == 0
    printed = capsys.readouterr().out
    assert "LoRA rank 2 alpha 3 on query/out/mlp (the rest frozen)" in printed
    results = json.loads((workdir / "results.json").read_text())
    counts = results["parameters"]
    assert f"({counts['trainable']:,} of {counts['total']:,} parameters train)" in printed
    assert results["built"]["rematerialized_blocks"] == 1 and results["plan"]["precision"] == "mixed_bfloat16"

    base = checkpoint_params(keras_vit.load_model(digits_run))
    merged_model = keras_vit.load_model(workdir)
    merged = checkpoint_params(merged_model)
    tensors, named_base, config = read_adapter(workdir)
    assert named_base == str(digits_run) and config["config"]["lora_rank"] == 2
    assert sorted(merged) == sorted(base)  # a plain model: no factors
    adapted = {k[:-len("/lora_a")] for k in tensors if k.endswith("/lora_a")}
    assert len(adapted) == 4  # query, out and both MLP layers of Nano/4's one block
    for key in base:
        prefix = key.rsplit("/", 1)[0]
        if key.startswith("head/"):
            assert not np.array_equal(merged[key], base[key]), key  # the head trained
        elif key.endswith("/kernel") and prefix in adapted:
            delta = 1.5 * tensors[prefix + "/lora_a"] @ tensors[prefix + "/lora_b"]
            assert np.abs(delta).max() > 0, key
            np.testing.assert_allclose(merged[key], base[key] + delta.reshape(base[key].shape), atol=1e-6)
        else:
            np.testing.assert_array_equal(merged[key], base[key], err_msg=key)  # frozen: bit for bit
    images = np.random.default_rng(0).uniform(-1, 1, (3, 28, 28, 1)).astype("float32")
    np.testing.assert_allclose(load_adapter(workdir)(images), merged_model(images), atol=1e-6)


@pytest.mark.slow
def test_an_unmerged_lora_model_file_is_weights_as_its_function(tmp_path):
    """A .keras file saved with its updates (not a run's model.keras) starts a run as the
    function it computes: merged, not refused and not stacked under new updates."""
    from keras_vit.training.transfer import apply_weights, resolve_weights

    base = perturbed(keras_vit.ViT(keras_vit.ViTConfig(**BASE), image_size=16, num_classes=5))
    adapted = _with_lora(base, rank=2, targets=ALL)
    _perturb_updates(adapted)
    adapted.save(tmp_path / "adapted.keras")
    initial = resolve_weights(str(tmp_path / "adapted.keras"))
    assert initial.source_config.lora_rank == 0 and not any(is_lora_key(k) for k in initial.weights)
    for rank in (0, 3):
        fresh = keras_vit.ViT(keras_vit.ViTConfig(**BASE, lora_rank=rank), image_size=16, num_classes=5)
        apply_weights(fresh, initial)
        embed = lambda m: m.backbone(_images())  # noqa: E731 - the head is the run's own
        np.testing.assert_allclose(embed(fresh), embed(adapted), rtol=1e-5, atol=1e-5)


def test_lora_settings_without_a_rank_are_one_line(digits_run, tmp_path, capsys):
    code = main(["train", "--weights", str(digits_run), "--dataset", f"folder:{tmp_path / 'none'}", "--workdir",
                 str(tmp_path / "r"), "--lora-alpha", "16"])
    err = capsys.readouterr().err
    assert code == 2 and "--lora-alpha has no effect without --lora-rank: add --lora-rank 8" in err, err


def test_comma_separated_targets_are_a_list_in_python_too():
    config = keras_vit.ViTConfig(**BASE, lora_rank=2, lora_targets="query, mlp")
    assert config.lora_targets == ("query", "mlp")
    with pytest.raises(UserError, match=r"lora_targets=\('query', 'value'\)"):
        keras_vit.ViTConfig(**BASE, lora_rank=2, lora_targets=("ffn",))


def test_an_adapter_file_round_trips_and_a_partial_one_is_refused(tmp_path):
    """adapter.safetensors alone (no run): the updates and the head, the base's name and the
    config; applied to the model built from that config over the same base, the same outputs."""
    from keras_vit.runs.adapter import apply_adapter, read_adapter, write_adapter

    base = perturbed(keras_vit.ViT(keras_vit.ViTConfig(**BASE, **FAMILIES["deit"]), image_size=16, num_classes=5))
    adapted = _with_lora(base, rank=2, targets=("value", "mlp"))
    _perturb_updates(adapted)
    path = write_adapter(tmp_path, adapted, "the/base.npz")
    tensors, named_base, config = read_adapter(tmp_path)  # the run folder finds its file
    assert named_base == "the/base.npz" and sorted(tensors) == sorted(adapter_params(adapted))
    again = keras_vit.ViT.from_config(config)
    load_checkpoint(again, checkpoint_params(base))
    apply_adapter(again, tensors)
    np.testing.assert_array_equal(again(_images()), adapted(_images()))
    with pytest.raises(UserError, match="missing from the adapter: head_dist/bias"):
        apply_adapter(again, {k: v for k, v in tensors.items() if k != "head_dist/bias"})
    with pytest.raises(UserError, match="is not a keras_vit LoRA adapter"):
        from safetensors.numpy import save_file

        save_file({"x": np.zeros(2, np.float32)}, str(tmp_path / "other.safetensors"), metadata={"format": "peft"})
        read_adapter(tmp_path / "other.safetensors")
    assert path.endswith("adapter.safetensors")


def test_layer_decay_gives_each_update_its_block_s_rate_and_the_head_the_full_rate():
    """--layer-decay with LoRA (finetune_ld): a block's updates learn at that block's rate, as its
    frozen kernels would (BEiT's rate ** (L + 1 - depth)), and the head at the full rate."""
    from keras_vit.training.optimization import layer_scales

    base = keras_vit.ViT(keras_vit.ViTConfig(**BASE, **FAMILIES["dinov2"]), image_size=16, num_classes=5)
    adapted = _with_lora(base, rank=2, targets=("query", "mlp"))
    scales, layers = layer_scales(adapted, 0.5), adapted.config.num_layers
    trainable = {v.path for v in adapted.trainable_variables}
    updates = {key: v.path for key, v in variables_by_key(adapted).items() if is_lora_key(key)}
    assert updates and set(updates.values()) | {v.path for k, v in variables_by_key(adapted).items()
                                                if part_of(k).group == CLASSIFIER} == trainable
    for key, path in updates.items():
        block = int(key.split("encoderblock_")[1].split("/")[0])
        assert scales[path] == 0.5 ** (layers - block), key
    assert {scales[v.path] for k, v in variables_by_key(adapted).items() if part_of(k).group == CLASSIFIER} == {1.0}
