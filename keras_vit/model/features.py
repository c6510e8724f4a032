"""Dense features: a ViT's chosen encoder blocks as a multi-output Keras model of
feature maps, for detection and segmentation heads (timm's `features_only`,
keras-hub's `pyramid_outputs`).

The feature model is built from the ViT's own layers (shared weights: training
it trains the ViT), so it saves, fine-tunes and exports like any Keras model.
"""

from __future__ import annotations

import keras

from keras_vit.model import ViT, block_indices, block_inputs, embed_images


def feature_model(model: ViT, indices=None, output_format="NHWC", norm=False, name=None) -> keras.Model:
    """A keras.Model: what `model` takes -> one output per chosen block.

    Args:
        model: a keras_vit.ViT (any family; a dynamic model gives maps of any size).
        indices: None (every block), an int n (the last n) or a list of block
            indices, as `ViT.forward_intermediates`.
        output_format: "NHWC" maps (B, rows, cols, D), or "NLC" tokens (B, N, D).
        norm: apply the model's final LayerNorm to each output.

    Outputs are named "block_<i>" (a dict when the model is called), and equal
    `model.forward_intermediates(images, indices, output_format, norm)`.
    """
    chosen = block_indices(model.config.num_layers, indices)
    images = keras.Input(model.inputs[0].shape[1:], name="images")
    x = embed_images(images, model)
    inputs = block_inputs(images, model)
    outputs = {}
    for i, block in enumerate(model.encoder.blocks[:max(chosen) + 1]):
        x = block(x, **inputs)
        if i in chosen:
            # The model's own rule for a block's features (norm, prefix dropped, grid), named for the output.
            features = model.dense_features(x, images, output_format, norm)
            outputs[f"block_{i}"] = keras.layers.Identity(name=f"block_{i}")(features)
    return keras.Model(images, outputs, name=name or f"{model.name}_features")

