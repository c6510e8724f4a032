"""ViT's relatives in HF transformers (DeiT, DINOv2 with and without
registers, DINOv3, the SigLIP, SigLIP2 (NaFlex), AIMv2, CLIP and MetaCLIP 2 vision towers)
against transformers itself:
small random models with odd sizes (48 wide, 3 heads, MLP 80, 5 classes),
every weight perturbed (LayerNorms, LayerScale, tokens and position tables
included), written by their own save_pretrained, load with
keras_vit.from_pretrained and give transformers' outputs, at the trained
size and at another one (resized at load, and in a dynamic model).

The first tests check the adapter alone (keras_vit.weights.hf_families):
every tensor a file holds is mapped to the key the model has, or dropped on
purpose, with the shape that key has."""

import json

import keras
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file

import keras_vit
from keras_vit.weights.checkpoint import POSEMB_KEY
from keras_vit.weights.hf_families import FAMILY_MODEL_TYPES, map_family
from tests.sources_helpers import perturb_torch

D, HEADS, LAYERS, MLP, CLASSES = 48, 3, 2, 80, 5
NAMES = {0: "ant", 1: "bee", 2: "cat", 3: "dog", 4: "eel"}
TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=40, vocab_size=50)
SIGLIP2_TEXT = dict(TEXT, bos_token_id=0, eos_token_id=2, pad_token_id=1)  # its token ids in the tiny vocabulary


def small(image_size=32, patch_size=4, **extra):
    return dict(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS, image_size=image_size,
                patch_size=patch_size, **extra)


def labelled():
    return dict(num_labels=CLASSES, id2label=NAMES, label2id={v: k for k, v in NAMES.items()})


def pixels(x):
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


def mean_of(attribute, start=0):
    return lambda hf, x, **kw: getattr(hf(pixel_values=pixels(x), **kw), attribute)[:, start:].mean(1)


def attribute(name):
    return lambda hf, x, **kw: getattr(hf(pixel_values=pixels(x), **kw), name)


def cls_of_last_hidden_state(hf, x, **kw):
    return hf(pixel_values=pixels(x), **kw).last_hidden_state[:, 0]


def cls_and_patch_mean(skip):
    def output(hf, x, **kw):
        tokens = hf(pixel_values=pixels(x), **kw).last_hidden_state
        return torch.cat([tokens[:, 0], tokens[:, skip:].mean(1)], dim=1)
    return output


def vision_pooler(hf, x, **kw):  # a full SiglipModel / CLIPModel: its tower's pooled output
    return hf.vision_model(pixel_values=pixels(x), **kw).pooler_output


def clip_image_features(hf, x, **kw):
    return hf.visual_projection(hf.vision_model(pixel_values=pixels(x), **kw).pooler_output)


def naflex_inputs(images, patch, length=None):
    """What Siglip2's processor hands its model for NHWC images (each its own size): each image's
    patches flattened in (row, column, channel) order, padded to `length` (the longest by
    default), the mask of the real ones, and each image's grid (written from the processor's
    convert_image_to_patches and pad_along_first_dim)."""
    grids = [(image.shape[0] // patch, image.shape[1] // patch) for image in images]
    length = length or max(rows * cols for rows, cols in grids)
    values, masks = [], []
    for image, (rows, cols) in zip(images, grids):
        patches = image.reshape(rows, patch, cols, patch, -1).transpose(0, 2, 1, 3, 4).reshape(rows * cols, -1)
        values.append(np.pad(patches, ((0, length - rows * cols), (0, 0))))
        masks.append(np.arange(length) < rows * cols)
    return dict(pixel_values=torch.from_numpy(np.stack(values).astype(np.float32)),
                pixel_attention_mask=torch.from_numpy(np.stack(masks).astype(np.int32)),
                spatial_shapes=torch.tensor(grids))


def naflex(patch, read):
    """A Siglip2 model's output for NHWC images: `read(model, inputs)` of their naflex_inputs."""
    return lambda hf, x, **kw: read(hf, naflex_inputs(list(x), patch))


def siglip2_vision(**extra):
    return transformers.Siglip2VisionConfig(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                            intermediate_size=MLP, **extra)


# name -> (build the transformers model, its output the keras_vit model gives,
#          does the model interpolate without being asked (DINOv2), image size, patch size)
CASES = {
    "deit_teacher": (
        lambda: transformers.DeiTForImageClassificationWithTeacher(
            transformers.DeiTConfig(**small(intermediate_size=MLP), **labelled())),
        attribute("logits"), False, 32, 4),
    "deit_classifier": (
        lambda: transformers.DeiTForImageClassification(
            transformers.DeiTConfig(**small(28, 7, intermediate_size=MLP, hidden_act="gelu_pytorch_tanh"),
                                    num_labels=CLASSES)),
        attribute("logits"), False, 28, 7),
    "deit_pooler": (
        lambda: transformers.DeiTModel(transformers.DeiTConfig(**small(intermediate_size=MLP),
                                                               pooler_output_size=40), add_pooling_layer=True),
        attribute("pooler_output"), False, 32, 4),
    "deit_no_pooler": (
        lambda: transformers.DeiTModel(transformers.DeiTConfig(**small(intermediate_size=MLP)),
                                       add_pooling_layer=False),
        cls_of_last_hidden_state, False, 32, 4),
    "dinov2": (
        lambda: transformers.Dinov2Model(transformers.Dinov2Config(**small(28, 7), mlp_ratio=3)),
        attribute("pooler_output"), True, 28, 7),
    "dinov2_swiglu_classifier": (
        lambda: transformers.Dinov2ForImageClassification(
            transformers.Dinov2Config(**small(), use_swiglu_ffn=True, layerscale_value=0.3, **labelled())),
        attribute("logits"), True, 32, 4),
    "dinov2_registers": (
        lambda: transformers.Dinov2WithRegistersModel(
            transformers.Dinov2WithRegistersConfig(**small(), num_register_tokens=3)),
        attribute("pooler_output"), True, 32, 4),
    "dinov2_registers_classifier": (
        lambda: transformers.Dinov2WithRegistersForImageClassification(
            transformers.Dinov2WithRegistersConfig(**small(28, 7), mlp_ratio=2, num_register_tokens=3,
                                                   num_labels=CLASSES)),
        attribute("logits"), True, 28, 7),
    # DINOv3: rotary positions (no table: "always" interpolates), registers, LayerScale, no key bias.
    "dinov3": (
        lambda: transformers.DINOv3ViTModel(transformers.DINOv3ViTConfig(
            **small(intermediate_size=MLP), num_register_tokens=3, layerscale_value=0.3)),
        attribute("pooler_output"), True, 32, 4),
    "dinov3_gated": (
        lambda: transformers.DINOv3ViTModel(transformers.DINOv3ViTConfig(
            **small(28, 7, intermediate_size=MLP), use_gated_mlp=True, hidden_act="silu", rope_theta=50.0)),
        attribute("pooler_output"), True, 28, 7),
    "siglip_vision": (
        lambda: transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**small(intermediate_size=MLP))),
        attribute("pooler_output"), False, 32, 4),
    "siglip_vision_no_head": (
        lambda: transformers.SiglipVisionModel(
            transformers.SiglipVisionConfig(**small(28, 7, intermediate_size=MLP), vision_use_head=False)),
        mean_of("last_hidden_state"), False, 28, 7),
    "siglip": (
        lambda: transformers.SiglipModel(transformers.SiglipConfig(
            vision_config=small(intermediate_size=MLP), text_config=TEXT)),
        vision_pooler, False, 32, 4),
    "siglip_classifier": (
        lambda: transformers.SiglipForImageClassification(transformers.SiglipConfig(
            vision_config=small(intermediate_size=MLP), text_config=TEXT, **labelled())),
        attribute("logits"), False, 32, 4),
    "clip_vision": (
        lambda: transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**small(28, 7, intermediate_size=MLP))),
        attribute("pooler_output"), False, 28, 7),
    "clip_vision_projection": (
        lambda: transformers.CLIPVisionModelWithProjection(
            transformers.CLIPVisionConfig(**small(intermediate_size=MLP, hidden_act="gelu"), projection_dim=24)),
        attribute("image_embeds"), False, 32, 4),
    "clip": (
        lambda: transformers.CLIPModel(transformers.CLIPConfig(
            vision_config=small(intermediate_size=MLP), text_config=TEXT, projection_dim=24)),
        clip_image_features, False, 32, 4),
    # SigLIP2 (NaFlex): patches at each image's own grid, the num_patches table resized to it.
    "siglip2_vision": (
        lambda: transformers.Siglip2VisionModel(siglip2_vision(patch_size=4, num_patches=64)),
        naflex(4, lambda hf, inputs: hf(**inputs).pooler_output), True, 32, 4),
    "siglip2_vision_no_head": (
        lambda: transformers.Siglip2VisionModel(siglip2_vision(patch_size=7, num_patches=16, vision_use_head=False)),
        naflex(7, lambda hf, inputs: hf(**inputs).last_hidden_state.mean(1)), True, 28, 7),
    "siglip2": (
        lambda: transformers.Siglip2Model(transformers.Siglip2Config(
            vision_config=siglip2_vision(patch_size=4, num_patches=36).to_dict(), text_config=SIGLIP2_TEXT)),
        naflex(4, lambda hf, inputs: hf.vision_model(**inputs).pooler_output), True, 24, 4),
    "siglip2_classifier": (
        lambda: transformers.Siglip2ForImageClassification(transformers.Siglip2Config(
            vision_config=siglip2_vision(patch_size=4, num_patches=64).to_dict(), text_config=SIGLIP2_TEXT,
            **labelled())),
        naflex(4, lambda hf, inputs: hf(**inputs).logits), True, 32, 4),
    # AIMv2: RMSNorm (after the patch embedding too), gated MLP, no projection biases, its own
    # attention pooling; the native tower computes 2-D sin-cos positions for each grid.
    "aimv2_vision": (
        lambda: transformers.Aimv2VisionModel(transformers.Aimv2VisionConfig(**small(intermediate_size=MLP))),
        attribute("pooler_output"), False, 32, 4),
    "aimv2_native_biases": (
        lambda: transformers.Aimv2VisionModel(transformers.Aimv2VisionConfig(
            **small(28, 7, intermediate_size=MLP), is_native=True, qkv_bias=True, mlp_bias=True)),
        attribute("pooler_output"), True, 28, 7),
    "aimv2_vision_no_head": (
        lambda: transformers.Aimv2VisionModel(transformers.Aimv2VisionConfig(**small(28, 7, intermediate_size=MLP),
                                                                             use_head=False)),
        mean_of("last_hidden_state"), False, 28, 7),
    "aimv2": (
        lambda: transformers.Aimv2Model(transformers.Aimv2Config(
            vision_config=small(intermediate_size=MLP, is_native=True), text_config=TEXT, projection_dim=24)),
        lambda hf, x, **kw: hf.get_image_features(pixel_values=pixels(x)).pooler_output, True, 32, 4),
    # MetaCLIP 2: CLIP's architecture under transformers' MetaClip2 classes and model_types.
    "metaclip_2_vision_projection": (
        lambda: transformers.MetaClip2VisionModelWithProjection(
            transformers.MetaClip2VisionConfig(**small(28, 7, intermediate_size=MLP), projection_dim=24)),
        attribute("image_embeds"), False, 28, 7),
    "metaclip_2": (
        lambda: transformers.MetaClip2Model(transformers.MetaClip2Config(
            vision_config=small(intermediate_size=MLP), text_config=dict(TEXT, bos_token_id=0, eos_token_id=2),
            projection_dim=24)),
        clip_image_features, False, 32, 4),
}

# What each case must read as: the ViTConfig fields that make it that family.
FIELDS = {
    "deit_teacher": dict(classifier="token", distillation_token=True, distillation_head=True,
                         representation_size=None, layer_norm_epsilon=1e-12, gelu_approximate=False,
                         mlp_activation="gelu", mlp_dim=MLP, position_interpolation="bicubic",
                         pixel_normalization="imagenet"),
    "deit_classifier": dict(distillation_token=True, distillation_head=False, gelu_approximate=True, patch_size=7),
    "deit_pooler": dict(representation_size=40, distillation_head=False),
    "deit_no_pooler": dict(representation_size=None),
    "dinov2": dict(classifier="token", layer_scale_init=1.0, mlp_dim=3 * D, mlp_activation="gelu",
                   layer_norm_epsilon=1e-6, num_register_tokens=0, position_interpolation="bicubic",
                   pixel_normalization="imagenet"),
    # Dinov2SwiGLUFFN: 2/3 of 4 * 48, rounded up to a multiple of 8.
    "dinov2_swiglu_classifier": dict(classifier="token_gap", mlp_activation="swiglu", mlp_dim=128,
                                     layer_scale_init=0.3),
    "dinov2_registers": dict(classifier="token", num_register_tokens=3, mlp_dim=4 * D,
                             position_interpolation="bicubic_antialias"),
    "dinov2_registers_classifier": dict(classifier="token_gap", num_register_tokens=3, mlp_dim=2 * D),
    "dinov3": dict(classifier="token", position_embedding="rope", rope_theta=100.0, num_register_tokens=3,
                   layer_scale_init=0.3, mlp_dim=MLP, mlp_activation="gelu", gelu_approximate=False,
                   layer_norm_epsilon=1e-5, pixel_normalization="imagenet"),
    "dinov3_gated": dict(mlp_activation="swiglu", mlp_dim=MLP, num_register_tokens=0, rope_theta=50.0, patch_size=7),
    "siglip_vision": dict(classifier="map", layer_norm_epsilon=1e-6, gelu_approximate=True, mlp_activation="gelu",
                          final_norm="tokens", position_interpolation="bicubic",
                          pixel_normalization="minus_one_to_one"),
    "siglip_vision_no_head": dict(classifier="gap"),
    "siglip": dict(classifier="map"),
    "siglip_classifier": dict(classifier="gap"),
    "siglip2_vision": dict(classifier="map", layer_norm_epsilon=1e-6, gelu_approximate=True, mlp_activation="gelu",
                           final_norm="tokens", position_interpolation="bilinear_antialias",
                           pixel_normalization="minus_one_to_one", patch_bias=True),
    "siglip2_vision_no_head": dict(classifier="gap", patch_size=7),
    "siglip2": dict(classifier="map"),
    "siglip2_classifier": dict(classifier="gap"),
    "aimv2_vision": dict(classifier="attention_pool", norm="rms_norm", patch_norm=True, mlp_activation="swiglu",
                         projection_biases=(), layer_norm_epsilon=1e-5, position_embedding="learned_1d",
                         pixel_normalization="clip", projection_size=None),
    "aimv2_native_biases": dict(position_embedding="sincos_2d", projection_biases=("query", "key", "value", "out",
                                                                                   "mlp"), patch_size=7),
    "aimv2_vision_no_head": dict(classifier="gap", norm="rms_norm", patch_size=7),
    "aimv2": dict(classifier="attention_pool", position_embedding="sincos_2d", projection_size=24),
    "clip_vision": dict(classifier="token", mlp_activation="quick_gelu", layer_norm_epsilon=1e-5, pre_norm=True,
                        patch_bias=False, final_norm="pooled", projection_size=None,
                        position_interpolation="bicubic", pixel_normalization="clip"),
    "clip_vision_projection": dict(mlp_activation="gelu", gelu_approximate=False, projection_size=24),
    "clip": dict(mlp_activation="quick_gelu", projection_size=24),
    "metaclip_2_vision_projection": dict(classifier="token", mlp_activation="quick_gelu", layer_norm_epsilon=1e-5,
                                         pre_norm=True, patch_bias=False, final_norm="pooled", projection_size=24,
                                         position_interpolation="bicubic", pixel_normalization="clip", patch_size=7),
    "metaclip_2": dict(mlp_activation="quick_gelu", projection_size=24),
}

LABELLED = {"deit_teacher", "dinov2_swiglu_classifier", "siglip_classifier", "siglip2_classifier"}
HAS_HEAD = {"deit_teacher", "deit_classifier", "dinov2_swiglu_classifier", "dinov2_registers_classifier",
            "siglip_classifier", "siglip2_classifier"}
# Models that take every image at its own grid (NaFlex): from_pretrained builds them dynamic.
ANY_SIZE = {"siglip2_vision", "siglip2_vision_no_head", "siglip2", "siglip2_classifier"}


def saved(tmp_path, name, seed=1, positions=1.0):
    """The case's transformers model, every weight random, written by save_pretrained to
    tmp_path/name; `positions` scales the position table (to make its resizing count)."""
    torch.manual_seed(0)
    hf = CASES[name][0]().eval()
    perturb_torch(hf, seed)
    with torch.no_grad():
        for key, param in hf.named_parameters():
            if key.endswith(("position_embeddings", "position_embedding.weight")):
                param.mul_(positions)
    directory = tmp_path / name
    hf.save_pretrained(directory)
    return hf, directory


def expected_shapes(c, grid, num_classes):
    """{key: shape} of the official layout for a model of this ViTConfig."""
    p, mlp, head_dim = c.patch_size, c.mlp_dim, D // HEADS
    classifier = c.classifier
    positioned = int(classifier in ("token", "token_gap")) + int(c.distillation_token)
    shapes = {"embedding/kernel": (p, p, 3, D)}
    if c.position_embedding not in ("rope", "sincos_2d"):
        shapes[POSEMB_KEY] = (1, positioned + grid, D)
    if c.patch_norm:
        shapes["embedding_norm/scale"] = (D,)
    if c.patch_bias:
        shapes["embedding/bias"] = (D,)
    if classifier in ("token", "token_gap"):
        shapes["cls"] = (1, 1, D)
    if c.distillation_token:
        shapes["dist_token"] = (1, 1, D)
    if c.num_register_tokens:
        shapes["reg_tokens"] = (1, c.num_register_tokens, D)
    if c.pre_norm:
        shapes.update({"pre_norm/scale": (D,), "pre_norm/bias": (D,)})

    def attention(a, biases=("query", "key", "value", "out")):
        for part in ("query", "key", "value"):
            shapes[a + part + "/kernel"] = (D, HEADS, head_dim)
            if part in biases:
                shapes[a + part + "/bias"] = (HEADS, head_dim)
        shapes[a + "out/kernel"] = (HEADS, head_dim, D)
        if "out" in biases:
            shapes[a + "out/bias"] = (D,)

    def norm_shapes(name):
        shapes[name + "/scale"] = (D,)
        if c.norm == "layer_norm":  # RMSNorm has no bias
            shapes[name + "/bias"] = (D,)

    gated = 2 if c.mlp_activation == "swiglu" else 1
    for i in range(LAYERS):
        o = f"Transformer/encoderblock_{i}/"
        attention(o + "MultiHeadDotProductAttention_1/", c.projection_biases)
        for norm in ("LayerNorm_0", "LayerNorm_2"):
            norm_shapes(o + norm)
        shapes[o + "MlpBlock_3/Dense_0/kernel"] = (D, gated * mlp)
        shapes[o + "MlpBlock_3/Dense_1/kernel"] = (mlp, D)
        if "mlp" in c.projection_biases:
            shapes[o + "MlpBlock_3/Dense_0/bias"], shapes[o + "MlpBlock_3/Dense_1/bias"] = (gated * mlp,), (D,)
        if c.layer_scale_init is not None:
            shapes[o + "ls1/scale"] = shapes[o + "ls2/scale"] = (D,)
    norm_shapes("pooled_norm" if c.final_norm == "pooled" else "Transformer/encoder_norm")
    if classifier == "attention_pool":
        shapes["AttentionPool_0/probe"] = (1, 1, D)
        for part in ("key", "value"):
            shapes[f"AttentionPool_0/{part}/kernel"] = (D, HEADS, head_dim)
            if "key" in c.projection_biases:
                shapes[f"AttentionPool_0/{part}/bias"] = (HEADS, head_dim)
        shapes["AttentionPool_0/out/kernel"], shapes["AttentionPool_0/out/bias"] = (D, D), (D,)
    if classifier == "map":
        shapes["MAPHead_0/probe"] = (1, 1, D)
        attention("MAPHead_0/MultiHeadDotProductAttention_0/")
        shapes["MAPHead_0/LayerNorm_0/scale"] = shapes["MAPHead_0/LayerNorm_0/bias"] = (D,)
        shapes["MAPHead_0/MlpBlock_0/Dense_0/kernel"] = (D, mlp)
        shapes["MAPHead_0/MlpBlock_0/Dense_0/bias"] = (mlp,)
        shapes["MAPHead_0/MlpBlock_0/Dense_1/kernel"], shapes["MAPHead_0/MlpBlock_0/Dense_1/bias"] = (mlp, D), (D,)
    if c.projection_size:
        shapes["projection/kernel"] = (D, c.projection_size)
    width = c.representation_size or D
    if c.representation_size:
        shapes["pre_logits/kernel"], shapes["pre_logits/bias"] = (D, width), (width,)
    if num_classes:
        width *= 2 if classifier == "token_gap" else 1
        shapes["head/kernel"], shapes["head/bias"] = (width, num_classes), (num_classes,)
        if c.distillation_head:
            shapes["head_dist/kernel"], shapes["head_dist/bias"] = (width, num_classes), (num_classes,)
    return shapes


def read(directory):
    return (json.loads((directory / "config.json").read_text()),
            load_file(str(directory / "model.safetensors")))


# --- the adapter alone ---

@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.slow
def test_every_tensor_is_mapped_to_the_models_key_and_shape(tmp_path, name):
    _, directory = saved(tmp_path, name)
    hf, tensors = read(directory)
    assert hf["model_type"] in FAMILY_MODEL_TYPES
    mapped = map_family(hf, tensors, str(directory))
    config = keras_vit.ViTConfig(**mapped.fields)
    for field, value in FIELDS[name].items():
        assert getattr(config, field) == value, field
    size, patch = CASES[name][3], CASES[name][4]
    assert mapped.image_size == (size, size) and mapped.num_channels == 3
    want = expected_shapes(config, (size // patch) ** 2, CLASSES if name in HAS_HEAD else None)
    got = {k: tuple(v.shape) for k, v in mapped.params.items()}
    assert got == want
    assert all(v.dtype == np.float32 for v in mapped.params.values())
    assert mapped.labels == ([NAMES[i] for i in range(CLASSES)] if name in LABELLED else None)


def test_values_and_layouts(tmp_path):
    # The layouts, value by value, on one file of each naming scheme.
    _, directory = saved(tmp_path, "deit_teacher")
    hf, t = read(directory)
    p = map_family(hf, t, "deit").params
    np.testing.assert_array_equal(p["embedding/kernel"],
                                  t["deit.embeddings.patch_embeddings.projection.weight"].transpose(2, 3, 1, 0))
    query = t["deit.encoder.layer.1.attention.attention.query.weight"]  # (heads * head_dim, D)
    np.testing.assert_array_equal(p["Transformer/encoderblock_1/MultiHeadDotProductAttention_1/query/kernel"],
                                  query.T.reshape(D, HEADS, D // HEADS))
    out = t["deit.encoder.layer.0.attention.output.dense.weight"]  # (D, heads * head_dim)
    np.testing.assert_array_equal(p["Transformer/encoderblock_0/MultiHeadDotProductAttention_1/out/kernel"],
                                  out.T.reshape(HEADS, D // HEADS, D))
    np.testing.assert_array_equal(p["head_dist/kernel"], t["distillation_classifier.weight"].T)

    _, directory = saved(tmp_path, "siglip_vision")
    hf, t = read(directory)
    p = map_family(hf, t, "siglip").params
    packed, bias = t["head.attention.in_proj_weight"], t["head.attention.in_proj_bias"]  # q, k, v stacked
    for n, part in enumerate(("query", "key", "value")):
        a = f"MAPHead_0/MultiHeadDotProductAttention_0/{part}/"
        np.testing.assert_array_equal(p[a + "kernel"], packed[n * D:(n + 1) * D].T.reshape(D, HEADS, -1))
        np.testing.assert_array_equal(p[a + "bias"], bias[n * D:(n + 1) * D].reshape(HEADS, -1))
    np.testing.assert_array_equal(p[POSEMB_KEY][0], t["embeddings.position_embedding.weight"])

    model, directory = saved(tmp_path, "dinov2_swiglu_classifier")
    hf, t = read(directory)
    p = map_family(hf, t, "dinov2").params
    # weights_in (2H, D): the gate's H rows (silu), then the value's, as transformers 5 splits it
    # into gate_proj and up_proj.
    mlp = model.dinov2.encoder.layer[0].mlp
    packed = t["dinov2.encoder.layer.0.mlp.weights_in.weight"]
    np.testing.assert_array_equal(packed, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach().numpy())
    np.testing.assert_array_equal(p["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"],
                                  t["dinov2.encoder.layer.0.mlp.weights_in.weight"].T)
    np.testing.assert_array_equal(p["Transformer/encoderblock_1/ls2/scale"],
                                  t["dinov2.encoder.layer.1.layer_scale2.lambda1"])

    _, directory = saved(tmp_path, "dinov3_gated")
    hf, t = read(directory)
    p = map_family(hf, t, "dinov3").params
    assert "layer.0.attention.k_proj.bias" not in t  # key_bias=False: a zero bias, which computes the same
    np.testing.assert_array_equal(p["Transformer/encoderblock_0/MultiHeadDotProductAttention_1/key/bias"], 0)
    np.testing.assert_array_equal(p["Transformer/encoderblock_1/MlpBlock_3/Dense_0/kernel"],  # the gate, then up
                                  np.concatenate([t["layer.1.mlp.gate_proj.weight"], t["layer.1.mlp.up_proj.weight"]]).T)
    assert POSEMB_KEY not in p and "embeddings.mask_token" in t and "embeddings.mask_token" not in p

    _, directory = saved(tmp_path, "clip_vision_projection")
    hf, t = read(directory)
    p = map_family(hf, t, "clip").params
    np.testing.assert_array_equal(p["cls"][0, 0], t["vision_model.embeddings.class_embedding"])
    np.testing.assert_array_equal(p["projection/kernel"], t["visual_projection.weight"].T)


@pytest.mark.parametrize("name", ["clip_vision", "siglip_vision"])
def test_transformers_4_tower_names_and_buffers(tmp_path, name):
    # transformers 4 wrote a lone tower under "vision_model." and some files hold the position_ids buffer.
    _, directory = saved(tmp_path, name)
    hf, tensors = read(directory)
    old = {"vision_model." + k: v for k, v in tensors.items()}
    old["vision_model.embeddings.position_ids"] = np.arange(64, dtype=np.int64)[None]
    now, then = map_family(hf, tensors, "now").params, map_family(hf, old, "then").params
    assert sorted(now) == sorted(then)
    for key in now:
        np.testing.assert_array_equal(now[key], then[key])


def test_dropped_on_purpose(tmp_path):
    # DINOv2's mask token (masked pre-training only) and a full model's text tower are left out, by name.
    _, directory = saved(tmp_path, "dinov2_registers")
    hf, tensors = read(directory)
    assert "embeddings.mask_token" in tensors and "embeddings.mask_token" not in map_family(hf, tensors, "d").params
    for name in ("siglip", "clip"):
        _, directory = saved(tmp_path, name)
        hf, tensors = read(directory)
        assert any(k.startswith("text_model.") for k in tensors) and "logit_scale" in tensors
        assert not [k for k in map_family(hf, tensors, name).params if "." in k]
    # Anything else keeps its name, for the strict loader to report.
    tensors["vision_model.surprise"] = np.zeros(3, np.float32)
    assert "vision_model.surprise" in map_family(hf, tensors, "clip").params


def test_defaults_are_transformers(tmp_path):
    # A config.json that leaves fields out reads them at transformers' defaults (copied, not imported).
    from keras_vit.weights import hf_families

    for config, defaults in ((transformers.DeiTConfig(), hf_families._DEIT_DEFAULTS),
                             (transformers.Dinov2Config(), hf_families._DINOV2_DEFAULTS),
                             (transformers.Dinov2WithRegistersConfig(), hf_families._DINOV2_REGISTERS_DEFAULTS),
                             (transformers.SiglipVisionConfig(), hf_families._SIGLIP_DEFAULTS),
                             (transformers.Siglip2VisionConfig(), hf_families._SIGLIP2_DEFAULTS),
                             (transformers.Aimv2VisionConfig(), hf_families._AIMV2_DEFAULTS),
                             (transformers.CLIPVisionConfig(), hf_families._CLIP_DEFAULTS),
                             (transformers.MetaClip2VisionConfig(), hf_families._CLIP_DEFAULTS),
                             (transformers.DINOv3ViTConfig(), hf_families._DINOV3_DEFAULTS)):
        for field, value in defaults.items():
            if value is not None:  # None: derived (DeiT's pooler_output_size is hidden_size)
                assert getattr(config, field) == value, (type(config).__name__, field)


@pytest.mark.parametrize("name,change,match", [
    ("deit_classifier", {"qkv_bias": False}, "qkv_bias=False"),
    ("dinov2", {"hidden_act": "relu"}, "hidden_act='relu'"),
    ("dinov2", {"patch_size": [7, 14]}, "non-square patches"),
    ("clip_vision", {"head_dim": 8}, "head_dim=8"),
    ("dinov3", {"value_bias": False}, "value_bias=False"),
    ("dinov3_gated", {"hidden_act": "gelu"}, "gated MLP with hidden_act='gelu'"),
])
def test_what_cannot_be_expressed_is_refused_in_one_line(tmp_path, name, change, match):
    _, directory = saved(tmp_path, name)
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(ValueError, match=match) as error:
        keras_vit.from_pretrained(str(directory))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("family", ["clip", "metaclip_2"])
def test_clip_s_image_classifier_gives_its_logits(tmp_path, family):
    """CLIPForImageClassification (MetaClip2's): the mean of the patch tokens as the last block leaves
    them (no post_layernorm, no projection), then the classifier."""
    if family == "clip":
        config = transformers.CLIPConfig(vision_config=small(intermediate_size=MLP), text_config=TEXT, num_labels=3)
        hf = transformers.CLIPForImageClassification(config)
    else:
        config = transformers.MetaClip2Config(vision_config=small(intermediate_size=MLP),
                                              text_config=dict(TEXT, bos_token_id=0, eos_token_id=2), num_labels=3)
        hf = transformers.MetaClip2ForImageClassification(config)
    perturb_torch(hf, 3)
    hf.eval().save_pretrained(tmp_path / family)
    model = keras_vit.from_pretrained(str(tmp_path / family))
    assert (model.config.classifier, model.config.final_norm, model.config.projection_size) == ("gap", "none", None)
    x = images(32)
    with torch.no_grad():
        expected = hf(pixel_values=pixels(x)).logits.numpy()
    np.testing.assert_allclose(model(x), expected, atol=1e-4, rtol=1e-4)


def test_other_files_are_refused(tmp_path):
    # A ViT's files under model_type "deit": no distillation token to read.
    transformers.ViTModel(transformers.ViTConfig(**small(intermediate_size=MLP))).save_pretrained(tmp_path / "vit")
    path = tmp_path / "vit" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "model_type": "deit"}))
    with pytest.raises(ValueError, match="distillation token"):
        keras_vit.from_pretrained(str(tmp_path / "vit"))


# --- against transformers ---

def images(size, count=2, seed=0):
    """Normalised images (NHWC): what every family's processor hands the model, here random."""
    height, width = (size, size) if np.isscalar(size) else size
    return np.random.default_rng(seed).normal(size=(count, height, width, 3)).astype(np.float32)


def expected(hf, name, x, interpolate=False):
    output, always = CASES[name][1], CASES[name][2]
    with torch.no_grad():
        if interpolate and not always:
            return output(hf, x, interpolate_pos_encoding=True).numpy()
        return output(hf, x).numpy()


@pytest.mark.parametrize("name", sorted(CASES))
def test_outputs_match_transformers(tmp_path, name):
    hf, directory = saved(tmp_path, name)
    size = CASES[name][3]
    x = images(size)
    want = expected(hf, name, x)
    assert np.abs(want).max() > 0.3  # a real signal
    model = keras_vit.from_pretrained(str(directory))
    assert model.include_top == (name in HAS_HEAD) and model.image_size == (size, size)
    assert model.dynamic_image_size == (name in ANY_SIZE)
    for field, value in FIELDS[name].items():
        assert getattr(model.config, field) == value, field
    np.testing.assert_allclose(np.asarray(model(x)), want, atol=1e-4, rtol=0)
    if name in LABELLED:
        assert model.labels == [NAMES[i] for i in range(CLASSES)]


@pytest.mark.parametrize("name,features", [
    ("deit_teacher", cls_of_last_hidden_state),
    ("dinov2_registers_classifier", cls_and_patch_mean(1 + 3)),  # registers are not patches
    ("siglip_classifier", mean_of("last_hidden_state")),
    ("siglip2_classifier", naflex(4, lambda hf, inputs: hf(**inputs).last_hidden_state.mean(1))),
])
def test_features_of_a_classifier(tmp_path, name, features):
    # include_top=False on a classifier's directory: the head's input.
    hf, directory = saved(tmp_path, name)
    size = CASES[name][3]
    x = images(size)
    base = getattr(hf, {"deit_teacher": "deit", "dinov2_registers_classifier": "dinov2_with_registers",
                        "siglip_classifier": "vision_model", "siglip2_classifier": "vision_model"}[name])
    with torch.no_grad():
        want = features(base, x).numpy()
    model = keras_vit.from_pretrained(str(directory), include_top=False)
    assert not model.include_top
    np.testing.assert_allclose(np.asarray(model(x)), want, atol=1e-4, rtol=0)


# One case per family at another size, and the registers' antialiased resize both ways.
RESIZED = [("deit_teacher", 44), ("dinov2_swiglu_classifier", 44), ("dinov2", 42),
           ("dinov2_registers", 44), ("dinov2_registers", 24), ("siglip_vision", 40),
           ("clip_vision_projection", (36, 44)), ("dinov3", (24, 40)), ("dinov3_gated", 21),
           ("siglip2_vision", (16, 44)), ("siglip2_classifier", 48), ("siglip2_vision_no_head", (63, 14)),
           ("aimv2_native_biases", (21, 42))]


@pytest.mark.parametrize("name,size", RESIZED)
def test_another_size_matches_transformers_interpolation(tmp_path, name, size):
    # Larger position tables make the resize count; the right rule is within ~1e-6 of transformers
    # here, while a near miss (bicubic without antialias for the registers' table, linear for the
    # others) is off by 2e-4 or more: hence the tighter tolerance.
    hf, directory = saved(tmp_path, name, positions=5.0)
    x = images(size, seed=3)
    want = expected(hf, name, x, interpolate=True)
    resized = keras_vit.from_pretrained(str(directory), image_size=size)
    np.testing.assert_allclose(np.asarray(resized(x)), want, atol=2e-5, rtol=0)
    dynamic = keras_vit.from_pretrained(str(directory), dynamic_image_size=True)
    np.testing.assert_allclose(np.asarray(dynamic(x)), want, atol=2e-5, rtol=0)
    native = images(CASES[name][3], seed=4)
    np.testing.assert_allclose(np.asarray(dynamic(native)), expected(hf, name, native), atol=1e-4, rtol=0)


def test_weights_argument_takes_a_family_directory(tmp_path):
    # The constructors' weights= reads the same directories into a model built with its config.
    hf, directory = saved(tmp_path, "clip_vision")
    source = keras_vit.from_pretrained(str(directory))
    model = keras_vit.ViT(source.config, image_size=28, include_top=False, weights=str(directory))
    x = images(28)
    np.testing.assert_allclose(np.asarray(model(x)), expected(hf, "clip_vision", x), atol=1e-4, rtol=0)


def test_hf_name_reaches_the_family_reader(tmp_path, monkeypatch):
    # "hf:ORG/NAME" goes through the same read_hf_directory (the download stubbed out).
    from keras_vit.weights import download

    _, directory = saved(tmp_path, "siglip_vision")
    monkeypatch.setattr(download, "hf_directory", lambda repo, revision=None: str(directory))
    model = keras_vit.from_pretrained("hf:google/tiny-siglip")
    assert model.config.classifier == "map" and not model.include_top


@pytest.mark.parametrize("name,match", [
    ("deit_no_pooler", "distillation token"),
    ("dinov2_registers", "3 register tokens.*LayerScale"),
    ("clip_vision_projection", "pre_norm.*no bias.*pooled.*projection"),
    ("siglip_vision", "classifier='map'"),
    ("aimv2_vision", "classifier='attention_pool'.*'rms_norm'.*patch_norm.*key, mlp, out, query, value projections "
                     "have no bias"),
])
def test_family_models_are_not_written_as_an_hf_vit(tmp_path, name, match):
    # HF's ViT would silently compute something else: refused, naming each difference, before writing.
    _, directory = saved(tmp_path, name)
    model = keras_vit.from_pretrained(str(directory))
    with pytest.raises(ValueError, match=match):
        keras_vit.save_pretrained(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_written_preprocessor_has_the_models_normalisation(tmp_path):
    model = keras_vit.ViT(keras_vit.ViTConfig(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=4, num_layers=1,
                                              pixel_normalization="imagenet"), image_size=16, num_classes=2)
    keras_vit.save_pretrained(model, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "preprocessor_config.json").read_text())
    assert (written["image_mean"], written["image_std"]) == ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])


@pytest.mark.parametrize("mean, std, normalization", [
    ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225], "imagenet"),  # facebook/deit-*-patch16-224: a "vit" repo
    ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5], "minus_one_to_one"),  # google/vit-*
])
def test_a_vit_directory_normalises_as_its_image_processor(tmp_path, mean, std, normalization):
    from keras_vit.images import model_inputs

    hf = transformers.ViTModel(transformers.ViTConfig(**small(intermediate_size=MLP)), add_pooling_layer=False)
    hf.save_pretrained(tmp_path / "vit")
    processor = transformers.ViTImageProcessor(image_mean=mean, image_std=std, size={"height": 32, "width": 32})
    processor.save_pretrained(tmp_path / "vit")
    model = keras_vit.from_pretrained(str(tmp_path / "vit"))
    assert model.config.pixel_normalization == normalization
    pixels = np.random.default_rng(0).integers(0, 256, size=(1, 32, 32, 3)).astype(np.uint8)
    want = processor(images=list(pixels), return_tensors="np", do_resize=False)["pixel_values"].transpose(0, 2, 3, 1)
    np.testing.assert_allclose(model_inputs(model, pixels), want, atol=1e-5)


# --- NaFlex: images of different grids in one padded batch ---

@pytest.mark.parametrize("name", ["siglip2_vision", "siglip2_classifier"])
def test_a_padded_batch_gives_each_image_its_own_output(tmp_path, name):
    # Grids 8x8 (the table's), 4x10, 11x3 and 2x2 in one batch. transformers pads the patch
    # sequence to the longest image's (64 tokens); keras_vit pads the images to 44 x 40 pixels
    # (110 tokens): different padding, the same result per image, which is each image alone.
    hf, directory = saved(tmp_path, name, positions=5.0)
    patch = CASES[name][4]
    rng = np.random.default_rng(5)
    x = [rng.normal(size=(h, w, 3)).astype(np.float32) for h, w in ((32, 32), (16, 40), (44, 12), (8, 8))]
    with torch.no_grad():
        want = CASES[name][1](hf, x).numpy()
    model = keras_vit.from_pretrained(str(directory))
    batch, grids = keras_vit.pad_batch(x, patch)
    assert batch.shape == (4, 44, 40, 3) and grids.tolist() == [[8, 8], [4, 10], [11, 3], [2, 2]]
    got = np.asarray(model.call_padded(batch, grids))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    for row, image in enumerate(x):
        np.testing.assert_allclose(np.asarray(model(image[None]))[0], got[row], atol=1e-5, rtol=0)


def test_naflex_size_is_the_processors_rule():
    # The PIL processor's copy of the rule (the default processor's module needs torchvision).
    from transformers.models.siglip2.image_processing_pil_siglip2 import get_image_size_for_max_num_patches

    for height, width in ((480, 640), (1000, 10), (7, 7), (224, 224), (3000, 2000), (16, 17), (333, 1)):
        for patch, most in ((16, 256), (14, 1024), (16, 64), (4, 9)):
            assert keras_vit.naflex_size(height, width, patch, most) == \
                get_image_size_for_max_num_patches(height, width, patch, most), (height, width, patch, most)


def test_padding_what_padding_would_change_is_refused_in_one_line(tmp_path):
    # A table resized by another rule, or rotary positions over the whole grid, cannot be padded.
    for fields in (dict(position_interpolation="bicubic"), dict(position_embedding="rope")):
        model = keras_vit.ViT(keras_vit.ViTConfig(4, 24, 40, 3, 1, classifier="gap", **fields), image_size=16,
                              include_top=False)
        with pytest.raises(ValueError, match="call_padded cannot run .*Call the model on each image alone") as error:
            model.call_padded(np.zeros((1, 16, 16, 3), np.float32), np.array([[4, 4]]))
        assert "\n" not in str(error.value)
    for shape in ((6, 8, 3), (0, 8, 3)):  # not a multiple; no patch at all
        with pytest.raises(ValueError, match=r"multiples of the patch size 4 \(at least one patch\), got "):
            keras_vit.pad_batch([np.zeros(shape)], 4)


def test_an_explicit_null_turns_dinov3_s_coordinate_augmentation_off(tmp_path):
    # transformers' pos_embed_rescale=None is no rescale: read as None, not as the default 2.0.
    _, directory = saved(tmp_path, "dinov3")
    path = directory / "config.json"
    assert json.loads(path.read_text())["pos_embed_rescale"] == 2.0
    assert keras_vit.from_pretrained(str(directory)).config.rope_rescale == 2.0
    path.write_text(json.dumps({**json.loads(path.read_text()), "pos_embed_rescale": None, "pos_embed_jitter": 1.1}))
    config = keras_vit.from_pretrained(str(directory)).config
    assert (config.rope_rescale, config.rope_jitter, config.rope_shift) == (None, 1.1, None)


def test_padded_rows_with_prefix_tokens_and_one_patch_sides_equal_each_image_alone():
    # A class token and registers (always real), 1-patch sides, and a grid larger than the table.
    config = keras_vit.ViTConfig(4, 24, 40, 3, 2, classifier="token_gap", num_register_tokens=2,
                                 position_interpolation="bilinear_antialias")
    model = keras_vit.ViT(config, image_size=16, num_classes=3, dynamic_image_size=True)
    rng = np.random.default_rng(2)
    model.set_weights([w + rng.normal(0, 0.3, w.shape).astype("float32") for w in model.get_weights()])
    x = [rng.normal(size=shape).astype(np.float32) for shape in ((4, 36, 3), (28, 4, 3), (16, 16, 3), (24, 20, 3))]
    batch, grids = keras_vit.pad_batch(x, 4)
    padded = np.asarray(model.call_padded(batch, grids))
    for row, image in enumerate(x):
        np.testing.assert_allclose(padded[row], np.asarray(model(image[None]))[0], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"one \(rows, cols\) grid per image.*within the padded images' 7 x 9"):
        model.call_padded(batch, np.array([[1, 9], [7, 1], [4, 4], [6, 10]]))


def test_a_padded_mean_under_mixed_bfloat16_is_the_image_alone_s(tmp_path):
    hf, directory = saved(tmp_path, "siglip2_classifier", positions=5.0)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = keras_vit.from_pretrained(str(directory))
        rng = np.random.default_rng(3)
        x = [rng.normal(size=shape).astype(np.float32) for shape in ((32, 32), (12, 40))]
        x = [image[..., None].repeat(3, -1) for image in x]
        batch, grids = keras_vit.pad_batch(x, 4)
        padded = np.asarray(model.call_padded(batch, grids), np.float32)
        alone = [np.asarray(model(image[None]), np.float32)[0] for image in x]
    finally:
        keras.mixed_precision.set_global_policy("float32")
    # bfloat16 keeps 8 bits: the padded batch may differ from the image alone by its rounding only.
    for row, want in zip(padded, alone):
        np.testing.assert_allclose(row, want, atol=0.05 * np.abs(want).max(), rtol=0)
