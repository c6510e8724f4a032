"""The parts description (keras_vit.weights.parts, issue #38 item 1): every
weight of every family and variant in the group a hand-written table says,
and the rules that read it — layer-wise learning rates measured through an
optimizer step, weight decay, transfer's dropped heads, masked-patch
freezing — giving each family's head parts the head's treatment."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit.tasks import ModelPlan
from keras_vit.training import TrainConfig
from keras_vit.training import optimization, transfer
from keras_vit.variants import VARIANTS
from keras_vit.weights import parts
from keras_vit.weights.layout import variables_by_key

# The expectation, written out by hand from the families' papers and checkpoints
# (regular expressions over official keys -> group; "block" keys carry their index).
EXPECTED = [
    (r"embedding/(kernel|bias)", "stem"), (r"cls", "stem"), (r"dist_token", "stem"), (r"reg_tokens", "stem"),
    (r"pre_norm/(scale|bias)", "stem"), (r"Transformer/posembed_input/\w+", "stem"), (r"embedding_norm/scale", "stem"),
    (r"(conv_root/kernel|gn_root/(scale|bias))", "stem"), (r"block\d/unit\d/\w+/\w+", "stem"),
    (r"Transformer/encoderblock_(\d+)/.+", "block"),
    (r"Transformer/encoder_norm/(scale|bias)", "final_norm"),
    (r"MAPHead_0/.+", "readout"), (r"AttentionPool_0/.+", "readout"), (r"pooled_norm/(scale|bias)", "readout"), (r"projection/kernel", "readout"),
    (r"pre_logits/(kernel|bias)", "readout"),
    (r"head/(kernel|bias)", "classifier"), (r"head_dist/(kernel|bias)", "classifier"),
]

# One small model per family and per kind of stem/read-out (as tests/test_families_model.py's).
BASE = dict(patch_size=4, hidden_size=16, mlp_dim=24, num_heads=2, num_layers=3)
FAMILIES = {
    "vit": dict(),
    "vit_gap_repr": dict(classifier="gap", representation_size=8),
    "deit": dict(distillation_token=True, distillation_head=True),
    "dinov2_reg": dict(layer_scale_init=1.0, num_register_tokens=2, classifier="token_gap"),
    "siglip": dict(classifier="map"),
    "clip": dict(pre_norm=True, final_norm="pooled", patch_bias=False, projection_size=12),
    "relative": dict(position_embedding="relative"),
    "dinov3": dict(position_embedding="rope", num_register_tokens=2, layer_scale_init=1.0),  # no position weights
    # AIMv2: a patch norm in the stem, its attention pooling in the read-out, RMSNorms, no biases.
    "aimv2": dict(classifier="attention_pool", norm="rms_norm", patch_norm=True, mlp_activation="swiglu",
                  projection_biases=(), position_embedding="sincos_2d"),
    "hybrid": dict(patch_size=1, resnet=keras_vit.ResNetConfig(num_layers=(1, 1))),
}


def expected_part(key):
    for pattern, group in EXPECTED:
        match = re.fullmatch(pattern, key)
        if match:
            return group, (int(match.group(1)) if group == "block" else None)
    raise AssertionError(f"no hand-written expectation for {key}")


def build(config, include_top=True, seed=0):
    keras.utils.set_random_seed(seed)
    size = config.total_stride * max(1, 16 // config.total_stride)  # a grid of at least 1x1
    return keras_vit.ViT(config, image_size=size, num_classes=5, include_top=include_top)


def small(config):
    """A variant's structure at a width a test can afford (the parts do not depend on width)."""
    fields = dict(hidden_size=16, mlp_dim=24, num_heads=2, num_layers=2)
    if config.projection_size:
        fields["projection_size"] = 12
    if config.representation_size:
        fields["representation_size"] = 8
    if config.resnet is not None:  # every stage, one unit each
        fields["resnet"] = keras_vit.ResNetConfig(num_layers=tuple(min(n, 1) for n in config.resnet.num_layers))
    return config.replace(**fields)


def _check_groups(model):
    found = set()
    for key, variable in variables_by_key(model).items():
        part = parts.part_of(key)
        assert (part.group, part.block) == expected_part(key), key
        found.add(part.group)
    return found


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("include_top", [True, False])
def test_every_weight_of_every_family_is_in_its_hand_written_group(family, include_top):
    model = build(keras_vit.ViTConfig(**{**BASE, **FAMILIES[family]}), include_top)
    found = _check_groups(model)
    assert {"stem", "block", "final_norm" if family != "clip" else "readout"} <= found
    assert ("classifier" in found) == include_top


@pytest.mark.slow
def test_every_variant_is_described():
    """The named variants' structures (at a small width): every key has its hand-written group."""
    for name, config in VARIANTS.items():
        _check_groups(build(small(config)))


@pytest.mark.slow
def test_the_layer_handles_and_the_keys_agree():
    """parts.HANDLES (the layers by their handle on the model, what masked-patch
    freezing reads) puts each layer where its weights' keys put them."""
    for family, fields in FAMILIES.items():
        model = build(keras_vit.ViTConfig(**{**BASE, **fields}))
        by_path = {v.path: parts.part_of(k).group for k, v in variables_by_key(model).items()}
        for handle, group in parts.HANDLES.items():
            layer = getattr(model, handle)
            if layer is None:
                continue
            groups = {by_path[w.path] for w in layer.weights}
            allowed = {"block", "final_norm"} if handle == "encoder" else {group}
            assert groups <= allowed, (family, handle, groups)


def test_an_unknown_key_is_our_bug_with_the_fix_named():
    with pytest.raises(ValueError, match=r"no part for checkpoint key 'NewLayer_0/kernel'.*parts.py"):
        parts.part_of("NewLayer_0/kernel")


def _recipe(**fields):
    settings = dict(optimizer="sgd", momentum=0.0, learning_rate=0.1, schedule="constant", warmup_steps=0,
                    weight_decay=0.0)
    return TrainConfig.create("scratch", **{**settings, **fields}).recipe


def _measured_scales(model, optimizer):
    """The learning-rate scale each variable got in one plain SGD step of gradient 1."""
    variables = model.trainable_variables
    before = [v.numpy() for v in variables]
    optimizer.apply([tf.ones(v.shape) for v in variables], variables)
    return {v.path: float(np.mean((b - v.numpy()) / 0.1)) for v, b in zip(variables, before)}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_layer_decay_gives_every_familys_head_parts_the_heads_rate(family):
    """BEiT's rule on every family, measured: rate^(L+1) for the stem, rate^(L-i)
    for block i, 1 for the final norm, the MAP head, the pooled norm, the
    projection, the pre-logits and the heads (#38: CLIP's projection and
    SigLIP's MAP head were trained at the embeddings' rate)."""
    rate, depth = 0.5, BASE["num_layers"]
    model = build(keras_vit.ViTConfig(**{**BASE, **FAMILIES[family]}))
    measured = _measured_scales(model, optimization.make_optimizer(_recipe(layer_decay=rate), "float32", model))
    for key, variable in variables_by_key(model).items():
        group, block = expected_part(key)
        want = {"stem": rate ** (depth + 1), "block": rate ** (depth - (block or 0))}.get(group, 1.0)
        assert measured[variable.path] == pytest.approx(want, rel=1e-4), key


def test_weight_decay_reaches_the_kernels_of_every_part_only():
    model = build(keras_vit.ViTConfig(**{**BASE, **FAMILIES["siglip"]}))
    optimizer = optimization.make_optimizer(_recipe(optimizer="adamw", weight_decay=0.5), "float32", model)
    variables = model.trainable_variables
    before = {v.path: v.numpy() for v in variables}
    optimizer.apply([tf.zeros(v.shape) for v in variables], variables)  # zero gradients: the decay alone
    for key, variable in variables_by_key(model).items():
        factor = (1 - 0.1 * 0.5) if key.endswith("/kernel") else 1.0  # the MAP probe, norms, biases: none
        np.testing.assert_allclose(variable.numpy(), before[variable.path] * factor, rtol=1e-6, err_msg=key)


def test_a_tasks_own_head_outside_the_vit_gets_the_heads_rate():
    """Masked patch prediction wraps the ViT: its colour head is the task's head (scale 1), its
    mask token sits at the stem's depth, the ViT's parts keep theirs, and the read-out and
    classifier it does not use are frozen."""
    from keras_vit.tasks.masked_patch import MaskedPatchTask

    config = keras_vit.ViTConfig(**{**BASE, **FAMILIES["clip"]})
    task = MaskedPatchTask()
    model = task.build_model(ModelPlan(config, (16, 16), 5, 3))
    scales = optimization.layer_scales(model, 0.5)
    vit = transfer.find_vit(model)
    assert scales[model.colour_head.kernel.path] == 1.0
    assert scales[vit.patch_embedding.projection.kernel.path] == 0.5 ** 4
    assert scales[model.corruption.mask_embedding.path] == 0.5 ** 4  # the mask token: the stem's rate, as BEiT's
    frozen = {v.path for v in vit.weights} - {v.path for v in model.trainable_variables}
    expected_frozen = {v.path for k, v in variables_by_key(vit).items()
                       if expected_part(k)[0] in ("readout", "classifier")}
    assert frozen == expected_frozen and any("projection" in p for p in frozen)


def test_layer_decay_on_a_model_without_a_vit_is_one_line():
    from keras_vit.errors import UserError

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="dense")], name="plain")
    with pytest.raises(UserError, match="layer_decay needs a keras_vit.ViT in the model.*plain holds none"):
        optimization.make_optimizer(_recipe(layer_decay=0.5), "float32", model)


def test_transfer_drops_the_classifiers_and_keeps_every_other_part():
    model = build(keras_vit.ViTConfig(**{**BASE, **FAMILIES["deit"]}))
    params = {k: np.asarray(v) for k, v in variables_by_key(model).items()}
    kept = transfer._encoder(params)
    assert set(params) - set(kept) == {"head/kernel", "head/bias", "head_dist/kernel", "head_dist/bias"}
    assert {"dist_token", "cls", "Transformer/encoder_norm/scale"} <= set(kept)


@pytest.mark.parametrize("family", ["deit", "clip", "siglip", "vit_gap_repr"])
def test_few_shot_include_top_false_and_forward_stages_read_one_vector(family):
    """One read-out (#38 item 4): the few-shot probe's features, the model
    without its head (the same weights) and forward_stages' pre-logits are one
    vector; for DeiT's distillation head, the class token's embedding."""
    from keras_vit.tasks.classification import ClassificationTask

    config = keras_vit.ViTConfig(**{**BASE, **FAMILIES[family]})
    model = build(config)
    perturbed = [w + np.random.default_rng(1).normal(size=w.shape).astype("float32") * 0.3
                 for w in model.get_weights()]
    model.set_weights(perturbed)
    headless = build(config, include_top=False)
    headless.set_weights(perturbed[:len(headless.get_weights())])  # the head's weights come last
    images = np.random.default_rng(2).uniform(-1, 1, (2, 16, 16, 3)).astype("float32")
    probe = np.asarray(ClassificationTask().feature_model(model)(images))
    np.testing.assert_allclose(probe, np.asarray(headless(images)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(probe, np.asarray(model.forward_stages(images, attention=False)["pre_logits"]),
                               rtol=1e-5, atol=1e-5)
    if family == "deit":  # the class token's embedding, not the mean with the distillation token
        tokens = np.asarray(model.forward_stages(images, attention=False)["tokens"])
        np.testing.assert_allclose(probe, tokens[:, 0], rtol=1e-5, atol=1e-5)
