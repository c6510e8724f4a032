"""ViTConfig.position_embedding end to end: every kind builds, trains through the
trainer, saves and loads as .keras, resizes for a new resolution by its own rule,
and the official-layout writers refuse the kinds they cannot hold."""

import argparse

import keras
import numpy as np
import pytest
import scipy.ndimage

import keras_vit
from keras_vit.config import POSITION_EMBEDDINGS
from keras_vit.layers import PositionEmbedding, PositionEmbedding2D, SinCosPositionEmbedding2D, sincos_2d_table
from keras_vit.weights import checkpoint_params, load_weights
from tests.conftest import tiny_config

KINDS = POSITION_EMBEDDINGS
LAYER_OF = {"learned_1d": PositionEmbedding, "learned_2d": PositionEmbedding2D,
            "sincos_2d": SinCosPositionEmbedding2D, "relative": type(None), "rope": type(None), "none": type(None)}


def perturbed(model, rng):
    """Random weights everywhere (zero-initialised heads and biases would hide bugs)."""
    model.set_weights([rng.normal(size=w.shape).astype("float32") * 0.2 for w in model.get_weights()])
    return model


def images(rng, size=16, n=2):
    return rng.uniform(-1, 1, size=(n, size, size, 3)).astype("float32")


# --- the config field ---------------------------------------------------------------

def test_default_is_learned_1d_and_round_trips():
    assert tiny_config().position_embedding == "learned_1d"
    assert keras_vit.get_variant("B/16").position_embedding == "learned_1d"
    for kind in KINDS:
        config = tiny_config(position_embedding=kind)
        assert keras_vit.ViTConfig.from_dict(config.to_dict()) == config
    # A config written before the field existed reads as the official kind.
    old = {k: v for k, v in tiny_config().to_dict().items() if k != "position_embedding"}
    assert keras_vit.ViTConfig.from_dict(old).position_embedding == "learned_1d"


def test_bad_values_are_named():
    with pytest.raises(ValueError, match=r"position_embedding must be one of .*got 'sinusoidal'"):
        tiny_config(position_embedding="sinusoidal")
    with pytest.raises(ValueError, match="'sincos_2d' needs hidden_size divisible by 4, got 34"):
        tiny_config(hidden_size=34, num_heads=2, position_embedding="sincos_2d")
    with pytest.raises(ValueError, match="'learned_2d' needs hidden_size divisible by 2, got 33"):
        tiny_config(hidden_size=33, num_heads=3, position_embedding="learned_2d")


# --- building, the layers, the one embedding path -----------------------------------

@pytest.mark.parametrize("classifier", ["token", "gap"])
@pytest.mark.parametrize("kind", KINDS)
def test_builds_with_its_layer_and_forward_intermediates_agree(rng, kind, classifier):
    model = keras_vit.ViT(tiny_config(position_embedding=kind, classifier=classifier), image_size=(16, 12),
                          num_classes=3)
    assert isinstance(model.position_embedding, LAYER_OF[kind])
    relative = [b.attention.relative_position_bias for b in model.encoder.blocks]
    assert all((r is not None) == (kind == "relative") for r in relative)
    assert (model.rotary_embedding is not None) == (kind == "rope")  # DINOv3's angles, in every block
    if kind == "relative":  # (heads, 2*4-1, 2*3-1) for the 4x3 grid, in every block
        assert tuple(relative[0].relative_bias.shape) == (4, 7, 5)
        assert (relative[0].prefix_bias is not None) == (classifier == "token")
    perturbed(model, rng)
    x = images(rng, 16)[:, :, :12]
    out = model.forward_stages(x)  # the explicit attention path, bias included
    np.testing.assert_allclose(out["logits"], np.asarray(model(x)), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["embeddings"], np.asarray(model.embed(x)), rtol=1e-6)


def test_none_is_a_bag_of_patches(rng):
    # Without positions, permuting the patches cannot change a GAP model's output.
    model = perturbed(keras_vit.ViT(tiny_config(position_embedding="none", classifier="gap"), image_size=8,
                                    num_classes=3), rng)
    x = images(rng, 8)
    swapped = x.copy()
    swapped[:, :4, :4], swapped[:, 4:, 4:] = x[:, 4:, 4:], x[:, :4, :4]
    np.testing.assert_allclose(np.asarray(model(x)), np.asarray(model(swapped)), rtol=1e-4, atol=1e-5)
    learned = perturbed(keras_vit.ViT(tiny_config(classifier="gap"), image_size=8, num_classes=3), rng)
    assert not np.allclose(np.asarray(learned(x)), np.asarray(learned(swapped)), atol=1e-4)


def test_sincos_embeddings_are_the_table(rng):
    model = keras_vit.ViT(tiny_config(position_embedding="sincos_2d"), image_size=16, num_classes=3)
    assert not [w for w in model.position_embedding.weights]
    table = np.asarray(model.position_embedding.table())[0]
    np.testing.assert_allclose(table[0], 0)  # the class token
    np.testing.assert_allclose(table[1:], sincos_2d_table((4, 4), 32), rtol=1e-6)


def test_position_similarity_for_every_absolute_kind(rng):
    from keras_vit.inspection import position_embedding_similarity

    for kind in ("learned_1d", "learned_2d", "sincos_2d"):
        model = keras_vit.ViT(tiny_config(position_embedding=kind), image_size=16, num_classes=3)
        assert position_embedding_similarity(model).shape == (4, 4, 4, 4)
    model = keras_vit.ViT(tiny_config(position_embedding="relative"), image_size=16, num_classes=3)
    with pytest.raises(ValueError, match="no position embedding table"):
        position_embedding_similarity(model)


# --- .keras ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_keras_file_round_trip(tmp_path, rng, kind):
    model = perturbed(keras_vit.ViT(tiny_config(position_embedding=kind), image_size=16, num_classes=3), rng)
    x = images(rng)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras_vit.load_model(path)
    assert loaded.config.position_embedding == kind
    np.testing.assert_allclose(np.asarray(loaded(x)), np.asarray(model(x)), rtol=1e-6, atol=1e-6)


# --- resizing for another resolution ---------------------------------------------------

def zoom(array, shape):
    """scipy.ndimage.zoom(order=1), the official loader's resize, to an exact shape."""
    return scipy.ndimage.zoom(array, [n / o for n, o in zip(shape, array.shape)], order=1)


def transferred(kind, rng, old=16, new=24, classifier="token"):
    source = perturbed(keras_vit.ViT(tiny_config(position_embedding=kind, classifier=classifier), image_size=old,
                                     num_classes=3), rng)
    target = keras_vit.ViT(tiny_config(position_embedding=kind, classifier=classifier), image_size=new,
                           num_classes=3)
    load_weights(target, checkpoint_params(source))  # what ViT(weights=...) and --weights do
    return source, target


def test_resize_learned_1d_is_the_official_rule(rng):
    source, target = transferred("learned_1d", rng)
    old, new = np.asarray(source.position_embedding.pos_embedding), np.asarray(target.position_embedding.pos_embedding)
    np.testing.assert_allclose(new[:, :1], old[:, :1])
    grid = zoom(old[0, 1:].reshape(4, 4, -1), (6, 6, old.shape[-1]))
    np.testing.assert_allclose(new[0, 1:], grid.reshape(36, -1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_resize_learned_2d_resizes_each_table_along_its_axis(rng, classifier):
    source, target = transferred("learned_2d", rng, old=(16, 8), new=(24, 16), classifier=classifier)
    s, t = source.position_embedding, target.position_embedding
    assert tuple(t.row_embedding.shape) == (6, 16) and tuple(t.column_embedding.shape) == (4, 16)
    np.testing.assert_allclose(t.row_embedding, zoom(np.asarray(s.row_embedding), (6, 16)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t.column_embedding, zoom(np.asarray(s.column_embedding), (4, 16)),
                               rtol=1e-5, atol=1e-6)
    if classifier == "token":
        np.testing.assert_allclose(t.prefix_embedding, s.prefix_embedding)


def test_sincos_needs_no_resize(rng):
    source, target = transferred("sincos_2d", rng)
    np.testing.assert_allclose(np.asarray(target.position_embedding.table())[0, 1:], sincos_2d_table((6, 6), 32),
                               rtol=1e-6)
    x = images(rng, 24)
    assert np.isfinite(np.asarray(target(x))).all()
    # Nothing position-specific moved: every other weight is the source's.
    for a, b in zip(source.get_weights(), target.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_resize_relative_resizes_each_heads_offset_table(rng):
    source, target = transferred("relative", rng, old=16, new=(24, 32))
    for s, t in zip(source.encoder.blocks, target.encoder.blocks):
        s, t = s.attention.relative_position_bias, t.attention.relative_position_bias
        old = np.asarray(s.relative_bias)
        assert tuple(t.relative_bias.shape) == (4, 11, 15)  # (2*6-1, 2*8-1) for the 6x8 grid
        np.testing.assert_allclose(t.relative_bias, zoom(old, (4, 11, 15)), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(t.relative_bias)[:, 5, 7], old[:, 3, 3], rtol=1e-6)  # offset 0
        np.testing.assert_allclose(t.prefix_bias, s.prefix_bias)


def test_none_has_nothing_to_resize(rng):
    source, target = transferred("none", rng)
    for a, b in zip(source.get_weights(), target.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_checkpoint_of_another_kind_is_refused(rng):
    official = checkpoint_params(keras_vit.ViT(tiny_config(), image_size=16, num_classes=3))
    model = keras_vit.ViT(tiny_config(position_embedding="relative"), image_size=16, num_classes=3)
    with pytest.raises(ValueError, match="holds a learned_1d position embedding but .* uses "
                                         "position_embedding='relative': build the model with "
                                         "position_embedding='learned_1d'"):
        load_weights(model, official)


# --- official-layout writers ---------------------------------------------------------

@pytest.mark.parametrize("kind", ["learned_2d", "sincos_2d", "relative", "none"])
def test_official_writers_refuse_other_kinds(tmp_path, kind):
    model = keras_vit.ViT(tiny_config(position_embedding=kind), image_size=16, num_classes=3)
    message = rf"position_embedding='{kind}', which .* cannot hold .*save it as \.keras instead"
    with pytest.raises(ValueError, match=message) as npz_error:
        keras_vit.save_weights(model, str(tmp_path / "x.npz"))
    assert "\n" not in str(npz_error.value)
    with pytest.raises(ValueError, match=message):
        keras_vit.save_pretrained(model, str(tmp_path / "hf"))
    assert not (tmp_path / "x.npz").exists() and not (tmp_path / "hf").exists()


def test_official_writer_still_writes_learned_1d(tmp_path, rng):
    model = perturbed(keras_vit.ViT(tiny_config(), image_size=16, num_classes=3), rng)
    keras_vit.save_weights(model, str(tmp_path / "x.npz"))
    again = keras_vit.ViT(tiny_config(), image_size=16, num_classes=3, weights=str(tmp_path / "x.npz"))
    x = images(rng)
    np.testing.assert_allclose(np.asarray(again(x)), np.asarray(model(x)), rtol=1e-6)


# --- the trainer ---------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.slow
def test_trains_through_the_trainer_and_its_model_file_loads(tmp_path, kind):
    from keras_vit.training import train
    from tests.training_helpers import TINY, tiny_config as tiny_run

    results = train(tiny_run(tmp_path / kind, model=TINY.replace(position_embedding=kind), steps=2,
                             eval_batch_size=1000))
    assert results["steps"] == 2 and 0.0 <= results["eval"]["accuracy"] <= 1.0
    assert np.isfinite(results["eval"]["loss"])
    assert results["plan"]["model"]["position_embedding"] == kind
    loaded = keras_vit.load_model(tmp_path / kind)
    assert loaded.config.position_embedding == kind


def test_flag_picks_the_kind_and_weights_fix_it(tmp_path):
    from keras_vit.training import cli
    from keras_vit.training.plan import model_config
    from keras_vit.training.transfer import resolve_weights

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--model", "Mu/4", "--recipe", "scratch", "--workdir", str(tmp_path / "run"),
                              "--position-embedding", "relative"])
    config = cli.config_from_args(args)
    assert config.position_embedding == "relative"
    assert model_config(config).position_embedding == "relative"
    with pytest.raises(SystemExit):  # argparse names the choices
        parser.parse_args(["--workdir", "x", "--position-embedding", "2d"])

    source = keras_vit.ViT(tiny_config(position_embedding="sincos_2d"), image_size=16, num_classes=3)
    source.save(str(tmp_path / "source.keras"))
    initial = resolve_weights(str(tmp_path / "source.keras"))
    taken = model_config(config.replace(model=None, position_embedding=None), initial)
    assert taken.position_embedding == "sincos_2d"  # the weights' own kind
    with pytest.raises(ValueError, match="position_embedding='relative' contradicts the pre-trained weights "
                                         r"\(.*\), whose position embedding is 'sincos_2d'"):
        model_config(config.replace(model=None), initial)


def test_weights_from_a_keras_file_are_resized_for_the_run(tmp_path, rng):
    from keras_vit.training.transfer import apply_weights, resolve_weights

    source = perturbed(keras_vit.ViT(tiny_config(position_embedding="relative"), image_size=16, num_classes=3),
                       rng)
    source.save(str(tmp_path / "source.keras"))
    initial = resolve_weights(str(tmp_path / "source.keras"))
    target = keras_vit.ViT(initial.source_config, image_size=32, num_classes=5)
    apply_weights(target, initial)
    bias = target.encoder.blocks[0].attention.relative_position_bias.relative_bias
    assert tuple(bias.shape) == (4, 15, 15)
    old = np.asarray(source.encoder.blocks[0].attention.relative_position_bias.relative_bias)
    np.testing.assert_allclose(np.asarray(bias)[:, 7, 7], old[:, 3, 3], rtol=1e-6)


def test_a_checkpoint_from_before_the_field_resumes(tmp_path):
    from keras_vit.training.checkpointing import CheckpointManager

    model = keras_vit.ViT(tiny_config(), image_size=16, num_classes=3)
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    current = {"model": tiny_config().to_dict(), "task": "classification"}
    before = {**current, "model": {k: v for k, v in current["model"].items() if k != "position_embedding"}}
    CheckpointManager(str(tmp_path), before).save(1, 16, model, optimizer)
    assert CheckpointManager(str(tmp_path), current).restore(model, optimizer) == (1, 16)
