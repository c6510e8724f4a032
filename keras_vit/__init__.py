"""keras-vit: the Vision Transformer ("An Image is Worth 16x16 Words") for Keras 3.

    import keras_vit
    model = keras_vit.ViT_B16(image_size=384, num_classes=10, weights="imagenet21k")
    model = keras_vit.load_model("runs/demo")   # a .keras file or a training workdir

Importing keras_vit imports Keras (and with it TensorFlow or your
KERAS_BACKEND): it registers the ViT layers in Keras' registry, the only place
`keras.saving.load_model("model.keras")` looks for them. Nothing else in your
process changes: no environment variable, no import hook, no filtered output
(TensorFlow logs as it would without keras_vit). The `keras-vit` command
(keras_vit_cli) starts without Keras, so that `--help` answers at once.

Models take images in [-1, 1] (`keras_vit.preprocess_input(pixels)` maps
0..255 there) unless built with include_preprocessing=True; `model.input_range`
says which, `model.summary()` prints it.
"""

import sys as _sys

from keras_vit.utils.lazy import lazy_exports
from keras_vit.config import ResNetConfig, ViTConfig
from keras_vit.variants import VARIANTS, get_variant, list_variants

__version__ = "0.1.0"

_LAZY = {
    "layers": "keras_vit.layers",
    "model": "keras_vit.model",
    "weights": "keras_vit.weights",
    "available_weights": "keras_vit.weights",
    "load_weights": "keras_vit.weights",
    "resize_position_embedding": "keras_vit.weights",
    "save_weights": "keras_vit.weights",
    "from_pretrained": "keras_vit.model.pretrained",
    "feature_model": "keras_vit.model.features",
    "save_pretrained": "keras_vit.weights",
    "ViT": "keras_vit.model",
    "preprocess_input": "keras_vit.model",
    "load_model": "keras_vit.runs",
    "merge_lora": "keras_vit.model.lora",
    "quantize": "keras_vit.model.quantization",
    "naflex_size": "keras_vit.model.naflex",
    "pad_batch": "keras_vit.model.naflex",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

def _constructor(variant):
    def build(image_size=224, num_classes=1000, weights=None, **kwargs):
        import keras_vit  # the package's ViT (loaded on first use; replaceable in tests)

        return keras_vit.ViT(variant, image_size=image_size, num_classes=num_classes, weights=weights, **kwargs)

    build.__name__ = build.__qualname__ = "ViT_" + variant.replace("/", "").replace("+", "_")
    build.__doc__ = (
        f"ViT {variant} (sizes from keras_vit.VARIANTS[{variant!r}]). "
        f"Arguments as keras_vit.ViT; available weights: see keras_vit.available_weights({variant!r})."
    )
    return build


ViT_Ti16 = _constructor("Ti/16")
ViT_S16 = _constructor("S/16")
ViT_S32 = _constructor("S/32")
ViT_B8 = _constructor("B/8")
ViT_B16 = _constructor("B/16")
ViT_B32 = _constructor("B/32")
ViT_L16 = _constructor("L/16")
ViT_L32 = _constructor("L/32")
ViT_H14 = _constructor("H/14")
R50_ViT_B16 = _constructor("R50+B/16")
R26_ViT_S32 = _constructor("R26+S/32")
R50_ViT_L32 = _constructor("R50+L/32")
R26_ViT_B32 = _constructor("R26+B/32")
R_ViT_Ti16 = _constructor("R+Ti/16")

__all__ = [
    "R26_ViT_B32", "R26_ViT_S32", "R50_ViT_B16", "R50_ViT_L32", "R_ViT_Ti16", "ResNetConfig", "VARIANTS", "ViT",
    "ViTConfig",
    "ViT_B16", "ViT_B32", "ViT_B8", "ViT_H14", "ViT_L16", "ViT_L32", "ViT_S16", "ViT_S32", "ViT_Ti16",
    "available_weights", "feature_model", "from_pretrained", "get_variant", "layers", "list_variants", "load_model",
    "load_weights", "merge_lora", "naflex_size", "pad_batch", "preprocess_input", "quantize", "resize_position_embedding", "save_pretrained", "save_weights",
]
# Keras imports the module a .keras file names only for its own packages
# (keras, keras_hub, ...): ours must be registered before a file is read, and
# Keras has no deferred registration, so the model module is imported now.
# The command line (keras_vit_cli, imported first) imports it when a command needs it.
if "keras_vit_cli" not in _sys.modules:
    from keras_vit import model as _model  # noqa: F401 - its import registers ViT and its layers
    del _model
del _sys
