"""The forward path: one embedding function (model graph, ViT.embed, masked
patch prediction) and forward_stages, checked against a plain-numpy
ViT and against the model's own call."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.tasks import ModelPlan
from keras_vit.model import vit as model_lib  # the module whose embed_images ViT.embed calls
from keras_vit.tasks.masked_patch import MaskedPatchTask
from tests.conftest import tiny_config, tiny_hybrid_config
from tests.layers import reference
from tests.official_format import official_params, write_npz


def perturb(model, seed=0):
    # Fresh models have unit LayerNorms, zero biases and a zero head: give
    # every weight a random offset so that nothing trivial hides a mismatch.
    rng = np.random.default_rng(seed)
    model.set_weights([w + rng.normal(scale=0.2, size=w.shape).astype(w.dtype) for w in model.get_weights()])
    return model


def block_params(params, i):
    q = f"Transformer/encoderblock_{i}/"
    a = q + "MultiHeadDotProductAttention_1/"
    return {
        "ln0_scale": params[q + "LayerNorm_0/scale"], "ln0_bias": params[q + "LayerNorm_0/bias"],
        "ln2_scale": params[q + "LayerNorm_2/scale"], "ln2_bias": params[q + "LayerNorm_2/bias"],
        "attention": [params[a + f"{n}/{v}"] for n in ("query", "key", "value", "out") for v in ("kernel", "bias")],
        "mlp": [params[q + f"MlpBlock_3/Dense_{j}/{v}"] for j in (0, 1) for v in ("kernel", "bias")],
    }


def test_forward_stages_match_a_numpy_vit_stage_by_stage(tmp_path):
    config = tiny_config(num_layers=3)
    rng = np.random.default_rng(0)
    params = official_params(config, grid=(4, 4), num_classes=7, representation_size=16, rng=rng)
    model = keras_vit.ViT(config, image_size=16, num_classes=7, representation_size=16,
                          weights=write_npz(tmp_path / "w.npz", params))
    images = rng.uniform(-1, 1, size=(2, 16, 16, 3)).astype("float32")
    out = model.forward_stages(images)

    # The embedding, by hand: patches row-major, projected, class token, position embedding.
    patches = images.reshape(2, 4, 4, 4, 4, 3).transpose(0, 1, 3, 2, 4, 5).reshape(2, 16, 48)
    x = patches @ params["embedding/kernel"].reshape(48, 32) + params["embedding/bias"]
    x = np.concatenate([np.broadcast_to(params["cls"], (2, 1, 32)), x], axis=1)
    x = x + params["Transformer/posembed_input/pos_embedding"]
    np.testing.assert_allclose(np.asarray(out["embeddings"]), x, atol=1e-5)

    assert len(out["blocks"]) == len(out["attention"]) == 3
    for i in range(3):
        p = block_params(params, i)
        _, probs = reference.attention(reference.layer_norm(x, p["ln0_scale"], p["ln0_bias"]), *p["attention"])
        np.testing.assert_allclose(np.asarray(out["attention"][i]), probs, atol=1e-5, err_msg=f"block {i}")
        x = reference.encoder_block(x, p)
        np.testing.assert_allclose(np.asarray(out["blocks"][i]), x, atol=1e-4, err_msg=f"block {i}")
    tokens = reference.layer_norm(x, params["Transformer/encoder_norm/scale"], params["Transformer/encoder_norm/bias"])
    np.testing.assert_allclose(np.asarray(out["tokens"]), tokens, atol=1e-4)
    np.testing.assert_allclose(np.asarray(out["pooled"]), tokens[:, 0], atol=1e-4)
    pre_logits = np.tanh(tokens[:, 0] @ params["pre_logits/kernel"] + params["pre_logits/bias"])
    np.testing.assert_allclose(np.asarray(out["pre_logits"]), pre_logits, atol=1e-4)
    logits = pre_logits @ params["head/kernel"] + params["head/bias"]
    np.testing.assert_allclose(np.asarray(out["logits"]), logits, atol=1e-4)
    np.testing.assert_allclose(logits, reference.vit_forward(params, images, config), atol=1e-5)


@pytest.mark.parametrize("kind", ["token", "gap", "hybrid", "no_top"])
def test_forward_stages_equal_the_models_call(kind):
    keras.utils.set_random_seed(3)
    if kind == "hybrid":
        model = keras_vit.ViT(tiny_hybrid_config(), image_size=32, num_classes=3, include_preprocessing=True)
    elif kind == "no_top":
        model = keras_vit.ViT(tiny_config(), image_size=16, include_top=False, representation_size=8)
    else:
        model = keras_vit.ViT(tiny_config(classifier=kind), image_size=16, num_classes=5, num_channels=1,
                              classifier_activation="softmax" if kind == "gap" else None)
    perturb(model)
    shape = (2,) + model.input_shape[1:]
    images = np.random.default_rng(1).uniform(0 if model.include_preprocessing else -1, 1, size=shape)
    images = (images * (255 if model.include_preprocessing else 1)).astype("float32")
    expected = np.asarray(model(images))
    for with_attention in (True, False):
        out = model.forward_stages(images, attention=with_attention)
        final = out["logits"] if model.include_top else out["pre_logits"]
        assert ("logits" in out) == model.include_top and ("attention" in out) == with_attention
        # The explicit attention path differs from the fused kernel by float rounding only.
        np.testing.assert_allclose(np.asarray(final), expected, rtol=1e-5, atol=1e-6)
        # The blocks chain: block i of the model's encoder maps output i - 1 to output i.
        previous = out["embeddings"]
        for block, output in zip(model.encoder.blocks, out["blocks"]):
            np.testing.assert_allclose(np.asarray(output), np.asarray(block(previous)), atol=1e-5)
            previous = output
        np.testing.assert_allclose(np.asarray(out["tokens"]), np.asarray(model.encoder.encoder_norm(previous)),
                                   atol=1e-5)
        encoder_output = keras.Model(model.input, model.encoder.output)(images)
        np.testing.assert_allclose(np.asarray(out["tokens"]), np.asarray(encoder_output), atol=1e-5)


def test_graph_embed_and_masked_patch_model_share_one_embedding_function(monkeypatch):
    calls = []
    original = model_lib.embed_images

    def counting(images, *args, **kwargs):
        calls.append(kwargs.get("patch_hook"))
        return original(images, *args, **kwargs)

    monkeypatch.setattr(model_lib, "embed_images", counting)
    task = MaskedPatchTask()
    masked = task.build_model(ModelPlan(tiny_config(), (16, 16), 10, 3))  # builds a ViT: its graph's embedding
    assert len(calls) == 1 and calls[0] is None
    images = np.random.default_rng(2).uniform(-1, 1, size=(2, 16, 16, 3)).astype("float32")
    masked.vit.embed(images)
    assert len(calls) == 2
    masked(images)  # the corruption is hooked into the same function
    assert len(calls) == 3 and calls[2] is not None


def test_patch_hook_changes_the_patch_tokens_before_the_class_token_and_positions():
    keras.utils.set_random_seed(4)
    model = perturb(keras_vit.ViT(tiny_config(), image_size=16, num_classes=3))
    images = np.random.default_rng(3).uniform(-1, 1, size=(2, 16, 16, 3)).astype("float32")
    seen = []

    def zero(tokens):
        seen.append(tuple(tokens.shape))
        return tokens * 0.0

    tokens = np.asarray(model.embed(images, patch_hook=zero))
    assert seen == [(2, 16, 32)]  # the 16 patch tokens, no class token yet
    table = np.asarray(model.position_embedding.pos_embedding)[0]
    cls = np.asarray(model.class_token.cls)[0, 0]
    np.testing.assert_allclose(tokens[:, 0], np.broadcast_to(cls + table[0], (2, 32)), atol=1e-6)
    np.testing.assert_allclose(tokens[:, 1:], np.broadcast_to(table[1:], (2, 16, 32)), atol=1e-6)
    np.testing.assert_array_equal(np.asarray(model.embed(images, patch_hook=lambda t: t)),
                                  np.asarray(model.embed(images)))


def test_the_training_flag_reaches_the_embedding_dropout_in_the_graph_and_in_embed():
    keras.utils.set_random_seed(5)
    model = perturb(keras_vit.ViT(tiny_config(dropout_rate=0.5), image_size=16, num_classes=3))
    images = np.random.default_rng(4).uniform(-1, 1, size=(2, 16, 16, 3)).astype("float32")
    np.testing.assert_array_equal(np.asarray(model(images)), np.asarray(model(images, training=False)))
    assert not np.allclose(np.asarray(model(images, training=True)), np.asarray(model(images)))
    dropped = np.asarray(model.embed(images, training=True))
    kept = np.asarray(model.embed(images))
    zeroed = np.mean(dropped == 0.0)
    assert 0.35 < zeroed < 0.65 and np.mean(kept == 0.0) == 0.0
    np.testing.assert_allclose(dropped[dropped != 0], 2.0 * kept[dropped != 0], rtol=1e-6)
