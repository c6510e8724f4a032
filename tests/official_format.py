"""Writes checkpoints in the official google-research/vision_transformer
`.npz` layout, spelled out here from the Flax module names of the official
code (independently of keras_vit.weights.layout), with random values."""

import numpy as np


def official_params(config, grid, num_classes=None, representation_size=None, rng=None,
                    group_norm_4d=False):
    rng = rng or np.random.default_rng(0)
    D, H, M = config.hidden_size, config.num_heads, config.mlp_dim
    K = D // H
    p = {}

    def put(key, *shape, scale=0.2, offset=0.0):
        p[key] = (rng.normal(size=shape) * scale + offset).astype(np.float32)

    def gn(prefix, channels):
        shape = (1, 1, 1, channels) if group_norm_4d else (channels,)
        put(f"{prefix}/scale", *shape, offset=1.0)
        put(f"{prefix}/bias", *shape)

    in_channels = 3
    if config.resnet is not None:
        width = 64 * config.resnet.width_factor
        put("conv_root/kernel", 7, 7, 3, width)
        gn("gn_root", width)
        in_channels = width
        for s, units in enumerate(config.resnet.num_layers):
            features = width * 2**s
            for u in range(units):
                unit = f"block{s + 1}/unit{u + 1}"
                if u == 0:
                    put(f"{unit}/conv_proj/kernel", 1, 1, in_channels, 4 * features)
                    gn(f"{unit}/gn_proj", 4 * features)
                put(f"{unit}/conv1/kernel", 1, 1, in_channels if u == 0 else 4 * features, features)
                gn(f"{unit}/gn1", features)
                put(f"{unit}/conv2/kernel", 3, 3, features, features)
                gn(f"{unit}/gn2", features)
                put(f"{unit}/conv3/kernel", 1, 1, features, 4 * features)
                gn(f"{unit}/gn3", 4 * features)
            in_channels = 4 * features
    ps = config.patch_size
    put("embedding/kernel", ps, ps, in_channels, D)
    put("embedding/bias", D)
    tokens = grid[0] * grid[1]
    if config.classifier == "token":
        put("cls", 1, 1, D)
        tokens += 1
    put("Transformer/posembed_input/pos_embedding", 1, tokens, D)
    for i in range(config.num_layers):
        b = f"Transformer/encoderblock_{i}"
        for ln in ("LayerNorm_0", "LayerNorm_2"):
            put(f"{b}/{ln}/scale", D, offset=1.0)
            put(f"{b}/{ln}/bias", D)
        for name in ("query", "key", "value"):
            put(f"{b}/MultiHeadDotProductAttention_1/{name}/kernel", D, H, K)
            put(f"{b}/MultiHeadDotProductAttention_1/{name}/bias", H, K)
        put(f"{b}/MultiHeadDotProductAttention_1/out/kernel", H, K, D)
        put(f"{b}/MultiHeadDotProductAttention_1/out/bias", D)
        put(f"{b}/MlpBlock_3/Dense_0/kernel", D, M)
        put(f"{b}/MlpBlock_3/Dense_0/bias", M)
        put(f"{b}/MlpBlock_3/Dense_1/kernel", M, D)
        put(f"{b}/MlpBlock_3/Dense_1/bias", D)
    put("Transformer/encoder_norm/scale", D, offset=1.0)
    put("Transformer/encoder_norm/bias", D)
    width = D
    if representation_size:
        put("pre_logits/kernel", D, representation_size)
        put("pre_logits/bias", representation_size)
        width = representation_size
    if num_classes:
        put("head/kernel", width, num_classes)
        put("head/bias", num_classes)
    return p


def write_npz(path, params):
    np.savez(path, **params)
    return str(path)
