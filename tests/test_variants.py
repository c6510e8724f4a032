"""The variant table: names, lookup, and every variant's exact parameter count."""

import pytest

import keras_vit
from keras_vit.variants import canonical_name

# Parameter counts with a 1000-class head and no representation layer. The
# ViT-B/16, L/16, H/14 and R50+B/16 figures are the ones the official
# implementation reports; the others agree with timm's published counts
# (Ti/16 5.72M, S/16 22.05M, S/32 22.88M, B/8 86.58M, B/32 88.22M,
# L/32 306.54M, R26+S/32 36.43M, R50+L/32 328.99M).
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
    "Mu/4": 402_984,  # the CPU demo's micro size (not from the paper)
}


def test_every_variant_has_a_pinned_count():
    assert set(keras_vit.list_variants()) == set(PARAMETER_COUNTS)


@pytest.mark.parametrize("name", sorted(PARAMETER_COUNTS))
def test_parameter_count(name):
    model = keras_vit.ViT(name, image_size=224, num_classes=1000)
    assert model.count_params() == PARAMETER_COUNTS[name]


def test_b16_with_representation_and_21k_head():
    model = keras_vit.ViT_B16(num_classes=21843, representation_size=768)
    assert model.count_params() == 103_186_515


@pytest.mark.parametrize("spelling,expected", [
    ("B/16", "B/16"), ("b16", "B/16"), ("ViT-B/16", "B/16"), ("ViT-B_16", "B/16"),
    ("R50+B/16", "R50+B/16"), ("R50+ViT-B_16", "R50+B/16"), ("ti/16", "Ti/16"), ("H/14", "H/14"),
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
    (keras_vit.R50_ViT_L32, "R50+L/32"),
])
def test_named_constructors_follow_the_table(constructor, name, monkeypatch):
    # Records the call instead of building (every variant twice would be slow).
    calls = []
    monkeypatch.setattr(keras_vit, "ViT", lambda variant, **kw: calls.append((variant, kw)))
    constructor(image_size=384, num_classes=10, weights="w.npz", representation_size=64)
    assert calls == [(name, dict(image_size=384, num_classes=10, weights="w.npz", representation_size=64))]
