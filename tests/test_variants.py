"""The variant table: names, lookup, and every variant's exact parameter count."""

import json
import os
import subprocess
import sys

import pytest

import keras_vit
from keras_vit.variants import canonical_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Parameter counts with a 1000-class head and no representation layer. The
# ViT-B/16, L/16, H/14 and R50+B/16 figures are the ones the official
# implementation reports; the others agree with timm's published counts
# (Ti/16 5.72M, S/16 22.05M, S/32 22.88M, B/8 86.58M, B/32 88.22M,
# L/32 306.54M, R26+S/32 36.43M, R50+L/32 328.99M). R+Ti/16 and R26+B/32 are
# summed by hand from vit_jax's configs (R_Ti_16: root conv 7x7x3x64 + GroupNorm,
# 8x8x64x192 patch embedding, 7x7+1 tokens at 224; R26+B/32: R26+S/32's ResNet,
# 13,946,176, plus a B/32-sized transformer on 2048-channel 1x1 patches).
PARAMETER_COUNTS = {
    "Ti/16": 5_717_416,
    "S/16": 22_050_664,
    "S/32": 22_878_952,
    "B/8": 86_576_872,
    "B/16": 86_567_656,
    "B/32": 88_224_232,
    "L/16": 304_326_632,
    "L/32": 306_535_400,
    "H/14": 632_045_800,
    "R50+B/16": 98_659_112,
    "R26+S/32": 36_431_912,
    "R50+L/32": 328_994_856,
    "R+Ti/16": 6_337_704,
    "R26+B/32": 101_383_976,
    "Mu/4": 1_067_112,  # the CPU demo's micro size (not from the paper)
    # one block of width 32, summed by hand: patches 4*4*3*32 + 32, class token 32, positions
    # (56*56 + 1) * 32, the block 8,544, the final norm 64, the head 32*1000 + 1000
    "Nano/4": 143_592,
}


# The descendants at 224 px: DeiT's with its two 1000-class heads, the others their image
# towers without a head (CLIP's with its projection). Each equals the parameter count of
# the transformers model of the same config (DeiTForImageClassificationWithTeacher,
# Dinov2Model less its mask token, Dinov2WithRegistersModel likewise, SiglipVisionModel,
# CLIPVisionModelWithProjection, MetaClip2VisionModelWithProjection), counted on 2026-11-25 with transformers 5.24 (the
# registers models with patch_size=14: transformers' default config has 16).
FAMILY_COUNTS = {
    "DeiT-Ti/16": 5_910_800,
    "DeiT-S/16": 22_436_432,
    "DeiT-B/16": 87_338_192,
    "DINOv2-S/14": 21_628_800,
    "DINOv2-B/14": 85_724_928,
    "DINOv2-L/14": 303_227_904,
    "DINOv2-reg-S/14": 21_630_336,
    "DINOv2-reg-B/14": 85_728_000,
    # DINOv3ViTModel's count less its mask token, plus a zero key bias per block (key_bias=False
    # in transformers: keras_vit's blocks hold one, loaded as zeros), counted 2026-11-26.
    "DINOv3-S/16": 21_600_768,
    "DINOv3-B/16": 85_668_864,
    "DINOv3-L/16": 303_153_152,
    "SigLIP-B/16": 92_884_224,
    # Siglip2VisionModel (num_patches=256: these two are built at 256 px, their table's 16 x 16
    # patches of 16 px), counted 2026-11-27.
    "SigLIP2-B/16": 92_930_304,
    "SigLIP2-So400m/16": 427_888_064,
    "AIMv2-L/14": 312_345_600,  # Aimv2VisionModel (transformers' default config), counted 2026-11-27
    "CLIP-B/32": 87_849_216,
    "CLIP-B/16": 86_192_640,
    "CLIP-L/14": 303_966_208,
    "MetaCLIP2-H/14": 632_076_800,  # MetaClip2VisionModelWithProjection, counted 2026-11-26
}


def test_every_variant_has_a_pinned_count():
    assert set(keras_vit.list_variants()) == set(PARAMETER_COUNTS) | set(FAMILY_COUNTS)


# Building every variant at 224 px allocates 4 GB (H/14) that TensorFlow's CPU allocator
# keeps for the life of the process: the models are built in one process of their own,
# which gives the memory back when it ends, instead of in a test worker.
BUILD_ALL = """
import json, sys
import keras
import keras_vit
from keras_vit.variants import canonical_name

# A count reads shapes only: every initializer gives zeros, which draws no random numbers
# (half of the build's time: 632M random numbers for H/14 alone).
def zeros(self, shape, dtype=None):
    return keras.ops.zeros(shape, dtype=dtype)

def every_subclass(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from every_subclass(sub)

for initializer in set(every_subclass(keras.initializers.Initializer)):
    initializer.__call__ = zeros
counts = {}
for name, (include_top, image_size) in json.loads(sys.argv[1]).items():
    model = keras_vit.ViT(name, image_size=image_size, num_classes=1000, include_top=include_top)
    counts[name] = [model.count_params(), canonical_name(model.config), include_top]
    del model
print("COUNTS", json.dumps(counts))
"""


@pytest.fixture(scope="module")
def built():
    """{variant: [parameter count, canonical name of its config, include_top]}, from one fresh process."""
    # Plain ViTs and DeiT with their heads, the other families' towers without.
    include_top = {**{name: True for name in PARAMETER_COUNTS},
                   **{name: name.startswith("DeiT") for name in FAMILY_COUNTS}}
    jobs = {name: [top, 256 if name.startswith("SigLIP2") else 224] for name, top in include_top.items()}
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", BUILD_ALL, json.dumps(jobs)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("COUNTS ")]
    return json.loads(line[len("COUNTS "):])


@pytest.mark.parametrize("name", sorted(FAMILY_COUNTS))
@pytest.mark.slow
def test_family_parameter_count(name, built):
    count, canonical, _ = built[name]
    assert count == FAMILY_COUNTS[name]
    assert canonical == name


@pytest.mark.parametrize("name", sorted(PARAMETER_COUNTS))
@pytest.mark.slow
def test_parameter_count(name, built):
    count, canonical, _ = built[name]
    assert count == PARAMETER_COUNTS[name]
    assert canonical == name


def test_b16_with_representation_and_21k_head():
    model = keras_vit.ViT_B16(num_classes=21843, representation_size=768)
    assert model.count_params() == 103_186_515


@pytest.mark.parametrize("spelling,expected", [
    ("B/16", "B/16"), ("b16", "B/16"), ("ViT-B/16", "B/16"), ("ViT-B_16", "B/16"),
    ("R50+B/16", "R50+B/16"), ("R50+ViT-B_16", "R50+B/16"), ("ti/16", "Ti/16"), ("H/14", "H/14"),
    ("dinov2-reg-s/14", "DINOv2-reg-S/14"), ("DeiT-B/16", "DeiT-B/16"), ("clip-l/14", "CLIP-L/14"),
    ("siglip2-so400m/16", "SigLIP2-So400m/16"), ("SigLIP-B/16", "SigLIP-B/16"), ("aimv2-l/14", "AIMv2-L/14"),
])
def test_name_lookup(spelling, expected):
    assert canonical_name(spelling) == expected
    assert keras_vit.get_variant(spelling) is keras_vit.VARIANTS[expected]


def test_unknown_variant_is_a_clear_error():
    with pytest.raises(ValueError, match="Unknown ViT variant 'X/7'.*Known variants: Ti/16"):
        keras_vit.get_variant("X/7")


@pytest.mark.parametrize("constructor,name", [
    (keras_vit.ViT_Ti16, "Ti/16"), (keras_vit.ViT_S16, "S/16"), (keras_vit.ViT_S32, "S/32"),
    (keras_vit.ViT_B8, "B/8"), (keras_vit.ViT_B16, "B/16"), (keras_vit.ViT_B32, "B/32"),
    (keras_vit.ViT_L16, "L/16"), (keras_vit.ViT_L32, "L/32"), (keras_vit.ViT_H14, "H/14"),
    (keras_vit.R50_ViT_B16, "R50+B/16"), (keras_vit.R26_ViT_S32, "R26+S/32"),
    (keras_vit.R50_ViT_L32, "R50+L/32"), (keras_vit.R_ViT_Ti16, "R+Ti/16"), (keras_vit.R26_ViT_B32, "R26+B/32"),
])
def test_named_constructors_follow_the_table(constructor, name, monkeypatch):
    # Records the call instead of building (every variant twice would be slow).
    calls = []
    monkeypatch.setattr(keras_vit, "ViT", lambda variant, **kw: calls.append((variant, kw)))
    constructor(image_size=384, num_classes=10, weights="w.npz", representation_size=64)
    assert calls == [(name, dict(image_size=384, num_classes=10, weights="w.npz", representation_size=64))]


def test_r_ti16_is_the_root_block_under_8x8_patches():
    # vit_jax's R_Ti_16: ResNet num_layers=() (conv_root, gn_root, max-pool: stride 4), patches 8 -> 32 px/token.
    config = keras_vit.get_variant("R+ViT-Ti_16")
    assert config.resnet.num_layers == () and config.resnet.stride == 4 and config.total_stride == 32
    model = keras_vit.R_ViT_Ti16(image_size=384, num_classes=10)
    assert model.grid_size == (12, 12) and model.resnet.units == []


def test_recommended_augreg_checkpoints_by_name():
    url = keras_vit.weights.checkpoint_url("R+Ti/16", "augreg-recommended-imagenet21k+imagenet2012-384")
    assert url.endswith("augreg/R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0--imagenet2012-steps_20k-"
                        "lr_0.03-res_384.npz")
    assert keras_vit.weights.checkpoint_url("L/16", "augreg-recommended-imagenet21k").endswith(
        "augreg/L_16-i21k-300ep-lr_0.001-aug_strong1-wd_0.1-do_0.0-sd_0.0.npz")
    assert len(keras_vit.weights.CHECKPOINTS["augreg-recommended-imagenet21k+imagenet2012-384"]) == 9
