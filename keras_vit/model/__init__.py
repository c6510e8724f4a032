"""The model: `ViT`, keras_vit.layers assembled (vit), its input guard (guard), its
descriptions (description), what its heads and feature APIs read (readout), and walks of
a built model (blocks). Everything is importable from here, as from the one module it was."""

from keras_vit.model.blocks import (  # noqa: F401
    encoder_blocks, fuse_gelu, output_activation, rematerialize_blocks, returns_probabilities, text_towers_in,
    vits_in, weight_parts_of)
from keras_vit.model.description import (  # noqa: F401
    MODEL_RANGE, PIXEL_RANGE, PIXELS_ABOVE, PROBABILITY_ACTIVATIONS, activation_name)
from keras_vit.model.readout import (  # noqa: F401
    block_indices, embedding_of_pooled, head_layers, pooled_embedding, read_out, read_pooled)
from keras_vit.model.vit import PARTS, ViT, block_inputs, embed_images, preprocess_input  # noqa: F401
from keras_vit.model.patch_grid import PatchGridModel, task_model  # noqa: F401  (after ViT: it holds one)
from keras_vit.model.image_text import ImageTextModel  # noqa: F401  (registered: a run of the image-text Task)
