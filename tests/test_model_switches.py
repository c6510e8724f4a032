"""The trainer's switches (remat, fused GELU) reach every encoder block through the
encoders' own lists of blocks, in a bare ViT and in a task's wrapper (#23 item 6:
no walk through Keras' private layer tracking)."""

import keras

import keras_vit
from keras_vit.model import encoder_blocks, fuse_gelu, rematerialize_blocks
from tests.conftest import tiny_config


class _Wrapper(keras.Model):
    """A task's model holding a ViT as an attribute, as the masked-patch task does."""

    def __init__(self, vit):
        super().__init__()
        self.vit = vit
        self.head = keras.layers.Dense(3)

    def call(self, x):
        return self.head(self.vit(x))


def test_the_switches_reach_every_block_of_a_vit_and_of_a_wrapped_vit():
    vit = keras_vit.ViT(tiny_config(num_layers=3), image_size=8, num_classes=2)
    blocks = vit.encoder.blocks
    assert encoder_blocks(vit) == blocks and len(blocks) == 3
    for model in (vit, _Wrapper(vit), keras.Sequential([vit])):
        assert rematerialize_blocks(model) == 3 and all(block.rematerialize for block in blocks)
        assert rematerialize_blocks(model, False) == 3 and not any(block.rematerialize for block in blocks)
        assert fuse_gelu(model) == 3 and all(block.mlp.fused_gelu for block in blocks)
        assert fuse_gelu(model, False) == 3 and not any(block.mlp.fused_gelu for block in blocks)


def test_a_model_without_a_vit_has_no_blocks():
    assert rematerialize_blocks(keras.Sequential([keras.layers.Dense(2)])) == 0
