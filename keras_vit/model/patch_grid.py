"""A ViT's patch tokens as a grid, read by a head of its own: the model of every Task whose
output is not one vector per image (a mask, a depth map, per-patch features; keras_vit.tasks).
Here, beside the ViT, so that `import keras_vit` registers it for keras.models.load_model.

    model = PatchGridModel(ViT("S/16", image_size=224, include_top=False), head)
    model(images)  ==  head(tokens)   # tokens: (B, 14, 14, 384), the encoder's patch tokens

The ViT is held whole (`model.vit`), so what reads a ViT's parts finds it: LoRA, layer-wise
decay, `--weights` (keras_vit.training.transfer.apply_weights) and few-shot features. Its
read-out and classifier get no gradient here and are frozen (out of the optimizer).
Saved and loaded as one Keras object (model.keras).
"""

from __future__ import annotations

import keras

from keras_vit.errors import UserError
from keras_vit.model.lora import merge_lora
from keras_vit.model.readout import block_inputs
from keras_vit.model.vit import ViT
from keras_vit.weights import parts as weight_parts


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchGridModel(keras.Model):
    """images (B, H, W, C) as the ViT takes them -> head((B, H / p, W / p, D) patch tokens).

    Args:
        vit: a keras_vit.ViT (its head, if any, is not used).
        head: a Keras layer on the token grid (its own output: a mask's logits, a depth map).
        blocks: None: the head reads the encoder's output (after its final norm); a tuple of
            block indices: the head reads a list of those blocks' grids, each through the final
            norm, in the tuple's order (a block may be named twice): DPT's four.
    """

    def __init__(self, vit: ViT, head: keras.layers.Layer, blocks=None, **kwargs):
        super().__init__(**kwargs)
        self.vit = vit
        self.head = head
        self.blocks = None if blocks is None else tuple(int(b) for b in blocks)
        rows, cols = vit.grid_size
        shape = (None, rows, cols, vit.config.hidden_size)
        if not self.head.built:  # a head handed on (exported(), quantize) is built already
            self.head.build(shape if self.blocks is None else [shape] * len(self.blocks))
        for unused in weight_parts.layers_in(vit, (weight_parts.READOUT, weight_parts.CLASSIFIER)):
            unused.trainable = False
        self.built = True

    @property
    def input_size(self):
        """(height, width, channels) of the images it takes: its ViT's."""
        return (*self.vit.image_size, self.vit.num_channels)

    def patch_grid(self, images, training=False):
        """The encoder's patch tokens as (B, rows, cols, D): the prefix tokens (class, registers) off."""
        vit = self.vit
        tokens = vit.encoder(vit.embed(images, training=training), training=training,
                             **block_inputs(images, vit, training))
        return vit.feature_map_layer()(tokens, images)  # the images' own grid: any size where the ViT takes it

    def block_grids(self, images, training=False):
        """The grids of `blocks` (B, rows, cols, D) each, through the encoder's final norm."""
        chosen = sorted(set(self.blocks))
        grids = dict(zip(chosen, self.vit.forward_intermediates(images, chosen, norm=True, training=training)))
        return [grids[b] for b in self.blocks]

    def call(self, images, training=False):
        grids = self.patch_grid(images, training) if self.blocks is None else self.block_grids(images, training)
        return self.head(grids, training=training)

    @property
    def dynamic_image_size(self) -> bool:
        return self.vit.dynamic_image_size

    def with_image_size(self, dynamic_image_size=True) -> "PatchGridModel":
        """The same model taking any height and width that are multiples of the patch size (its
        ViT's `with_image_size(dynamic_image_size=True)`: position weights interpolated in the
        graph, DINOv3's rotary embedding as it is), under the same head; `self` when it does."""
        vit = self.vit.with_image_size(dynamic_image_size=dynamic_image_size)
        return self if vit is self.vit else type(self)(vit, self.head, blocks=self.blocks, name=self.name)

    @property
    def rotary(self) -> bool:
        """Whether its ViT places tokens by rotary positions (DINOv3): the same weights answer at
        every grid, so its run is read and served at each image's own aspect ratio."""
        return self.vit.config.position_embedding == "rope"

    def own_size_rule(self):
        """(H, W) -> the size a model for any size reads such an image at: its own aspect ratio
        within the run's number of patches (the NaFlex rule, keras_vit.model.naflex.naflex_size)."""
        from keras_vit.model.naflex import naflex_size

        stride, budget = self.vit.config.total_stride, self.patch_budget
        return lambda height, width: naflex_size(height, width, stride, budget)

    @property
    def patch_budget(self) -> int:
        """The patches a model for any size reads each image within: the run's grid's."""
        rows, cols = self.vit.grid_size
        return rows * cols

    def exported(self) -> "PatchGridModel":
        """What a run keeps (model.keras): a float32 copy, whatever precision trained it, with a
        LoRA run's updates merged into the ViT's kernels (a plain ViT under the same head)."""
        previous = keras.config.dtype_policy()
        keras.config.set_dtype_policy("float32")
        try:
            copy = type(self).from_config(_float32(self.get_config()))
            copy.set_weights(self.get_weights())
            return type(self)(merge_lora(copy.vit), copy.head, blocks=self.blocks, name=self.name)
        finally:
            keras.config.set_dtype_policy(previous)

    def get_config(self):
        return {**super().get_config(), "vit": keras.saving.serialize_keras_object(self.vit),
                "head": keras.saving.serialize_keras_object(self.head),
                **({"blocks": list(self.blocks)} if self.blocks is not None else {})}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        vit = keras.saving.deserialize_keras_object(config.pop("vit"))
        head = keras.saving.deserialize_keras_object(config.pop("head"))
        return cls(vit, head, **config)


def _float32(config):
    """A layer config with every mixed precision policy made float32 (a head built under
    mixed_float16 records its policy in its config)."""
    if isinstance(config, dict):
        policy = str(config.get("config", {}).get("name", "")) if config.get("class_name") == "DTypePolicy" else ""
        if policy.startswith("mixed"):
            return "float32"
        return {k: _float32(v) for k, v in config.items()}
    if isinstance(config, list):
        return [_float32(v) for v in config]
    return config


def task_model(model, command: str) -> PatchGridModel:
    """`model` when it is a PatchGridModel (a ViT under a Task's head), else one line saying what
    `keras-vit COMMAND` reads a Task's run by."""
    if not isinstance(model, PatchGridModel):
        raise UserError(f"keras-vit {command} reads a run of a Task by its keras_vit.tasks.PatchGridModel (a ViT "
                        f"under the Task's head); this run's model.keras holds a {type(model).__name__}: "
                        f"build the Task's model as a PatchGridModel, or use it from Python.")
    return model
