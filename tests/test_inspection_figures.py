"""Every figure is written as a valid PNG of the size asked for."""

import keras
import numpy as np
import pytest
from PIL import Image

from keras_vit import ViT, ViTConfig
from keras_vit import inspection
from keras_vit.inspection import plots

TINY = ViTConfig(patch_size=4, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2)


def read_png(path):
    with Image.open(path) as image:
        assert image.format == "PNG"
        image.load()  # decodes the whole file: a truncated PNG fails here
        return image.size


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(0)
    return ViT(TINY, image_size=28, num_classes=10, num_channels=1)


@pytest.fixture(scope="module")
def pixels():
    return np.random.default_rng(0).integers(0, 256, (6, 28, 28, 1)).astype(np.uint8)


def test_heatmap_overlay_is_an_rgb_image_of_the_input_size():
    image = np.zeros((28, 28, 1), np.uint8)
    heat = np.zeros((7, 7))
    heat[0, 0] = 1.0
    overlay = plots.heatmap_overlay(image, heat, alpha=1.0, cmap="gray")
    assert overlay.shape == (28, 28, 3) and overlay.dtype == np.uint8
    # The hot patch is the top-left corner, the rest is cold.
    assert overlay[0, 0, 0] > 200 and overlay[-1, -1, 0] == 0


@pytest.mark.slow
def test_each_plot_writes_a_png_of_figsize_times_dpi(model, pixels, tmp_path):
    probabilities = inspection.encoder_attention(model, pixels[:2])[1]
    rollout = inspection.patch_map(inspection.attention_rollout(probabilities), (7, 7), 1)
    heads = inspection.patch_map(probabilities[0], (7, 7), 1)
    components, explained = inspection.embedding_filter_pca(model)
    rgb_components = np.random.default_rng(0).normal(size=(28, 16, 16, 3))
    similarity = inspection.position_embedding_similarity(model)
    distances = inspection.mean_attention_distance(model, pixels)
    cases = {
        "rollout": lambda p: plots.plot_rollout(pixels[:2], rollout, p, titles=["a", "b"], figsize=(4, 4), dpi=50),
        "heads": lambda p: plots.plot_attention_heads(pixels[0], heads, p, figsize=(3, 2), dpi=80),
        "filters": lambda p: plots.plot_embedding_filters(components, p, explained=explained, figsize=(7, 3), dpi=40),
        "filters_rgb": lambda p: plots.plot_embedding_filters(rgb_components, p, figsize=(7, 4), dpi=50),
        "similarity": lambda p: plots.plot_position_similarity(similarity, p, figsize=(5, 4), dpi=60),
        "distance": lambda p: plots.plot_attention_distance(distances, p, figsize=(4, 3), dpi=70),
    }
    expected = {"rollout": (200, 200), "heads": (240, 160), "filters": (280, 120), "filters_rgb": (350, 200),
                "similarity": (300, 240), "distance": (280, 210)}
    for name, plot in cases.items():
        path = tmp_path / "sub" / f"{name}.png"  # the folder is created
        assert plot(str(path)) == str(path)
        assert read_png(path) == expected[name], name


def test_make_figures_writes_every_figure(model, pixels, tmp_path):
    paths = inspection.make_figures(model, pixels, str(tmp_path / "figures"), labels=list("abcdefghij"),
                                    num_overlays=3)
    assert set(paths) == {"rollout", "attention_heads", "embedding_filters", "position_similarity",
                          "attention_distance"}
    # Default sizes at dpi 100: rollout 5 x 2.5 per image; heads 1.3 per panel + margins;
    # filters 7 columns of 1.1 (16 components: 3 rows); similarity 6.4 x 5.8; distance 5 x 4.
    expected = {"rollout": (500, 750), "attention_heads": (320, 300), "embedding_filters": (770, 370),
                "position_similarity": (640, 580), "attention_distance": (500, 400)}
    for name, path in paths.items():
        assert read_png(path) == expected[name], name


@pytest.mark.slow
def test_make_figures_accepts_images_of_another_size_and_channel_count(tmp_path):
    keras.utils.set_random_seed(2)
    rgb_model = ViT(TINY, image_size=32, num_classes=3, classifier="gap")
    gray = np.random.default_rng(1).integers(0, 256, (2, 50, 40)).astype(np.uint8)  # (B, H, W)
    paths = inspection.make_figures(rgb_model, gray, str(tmp_path), num_overlays=1)
    assert read_png(paths["rollout"]) == (500, 250)
    assert read_png(paths["embedding_filters"]) == (770, 480)  # 28 components: 4 rows


def test_make_figures_runs_the_encoder_once_per_image(pixels, tmp_path):
    keras.utils.set_random_seed(3)
    model = ViT(TINY, image_size=28, num_classes=10, num_channels=1)
    encoded = []
    original = model.encoder.call

    def counting_call(x, *args, **kwargs):
        encoded.append(x.shape[0])  # a traced (symbolic) call would append None
        return original(x, *args, **kwargs)

    model.encoder.call = counting_call
    # 6 images in batches of 4, 3 of them shown: every figure from one pass.
    inspection.make_figures(model, pixels, str(tmp_path), num_overlays=3, batch_size=4)
    assert encoded == [4, 2]
    # The same counter sees the three passes the figures would need one by one.
    encoded.clear()
    inspection.encoder_attention(model, pixels[:3], batch_size=4)
    inspection.mean_attention_distance(model, pixels, batch_size=4)
    assert sum(encoded) == 3 + 6


def test_make_figures_captions_and_maps_are_those_of_the_separate_calls(pixels, tmp_path, monkeypatch):
    keras.utils.set_random_seed(4)
    model = ViT(TINY, image_size=28, num_classes=10, num_channels=1)
    # Every weight moved (the head is zero-initialised), so that images get different predictions.
    rng = np.random.default_rng(4)
    model.set_weights([w + rng.normal(scale=0.5, size=w.shape).astype(w.dtype) for w in model.get_weights()])
    captured = {}

    def capture_rollout(images, rollout, path, titles=None, **kwargs):
        captured.update(rollout=rollout, titles=titles)
        return path

    def capture_distance(distances, path, **kwargs):
        captured["distances"] = distances
        return path

    monkeypatch.setattr(plots, "plot_rollout", capture_rollout)
    monkeypatch.setattr(plots, "plot_attention_distance", capture_distance)
    inspection.make_figures(model, pixels, str(tmp_path), labels=list("abcdefghij"), num_overlays=5, batch_size=4)
    # The one-pass figures hold what the separate public functions compute.
    np.testing.assert_allclose(captured["rollout"], inspection.rollout_maps(model, pixels[:5]), atol=1e-6)
    np.testing.assert_allclose(captured["distances"], inspection.mean_attention_distance(model, pixels), rtol=1e-5)
    probabilities = inspection.predict_probabilities(model, pixels[:5])
    best = probabilities.argmax(-1)
    assert len(set(best)) > 1
    assert captured["titles"] == [f"pred: {'abcdefghij'[i]} ({probabilities[n, i]:.2f})" for n, i in enumerate(best)]
