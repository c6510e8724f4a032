"""The text tower of an image-text model: token ids in, one embedding per text out.

SigLIP's and CLIP's text towers are the same Transformer as the image tower's encoder (the
layers of keras_vit.layers), reading tokens instead of patches; TextConfig says where they
differ: CLIP's blocks are causal and its vector is read at the end-of-text token, SigLIP's
at the last position; SigLIP projects with a bias, CLIP without."""

import keras
from keras import ops

from keras_vit.config import TextConfig
from keras_vit.layers.encoder import Encoder
from keras_vit.layers.text_embedding import TextEmbedding


@keras.saving.register_keras_serializable(package="keras_vit")
class TextTower(keras.layers.Layer):
    """`call(token_ids, token_mask=None)`: ids (B, L) -> embeddings (B, projection_size or width),
    not normalised (transformers' get_text_features). token_mask (B, L), 1 on real tokens, keeps
    padding out of every token's attention where the family's tokenizer hands it to the model."""

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        self.config = config if isinstance(config, TextConfig) else TextConfig.from_dict(config)
        c = self.config
        policy = self.dtype_policy
        self.embedding = TextEmbedding(c.vocab_size, c.max_positions, c.width, name="embedding", dtype=policy)
        self.encoder = Encoder(c.num_layers, c.num_heads, c.mlp_dim, layer_norm_epsilon=c.layer_norm_epsilon,
                               gelu_approximate=c.gelu_approximate, mlp_activation=c.mlp_activation,
                               lora=c.lora, name="Transformer", dtype=policy)
        self.projection = (keras.layers.Dense(c.projection_size, use_bias=c.projection_bias, name="projection",
                                              dtype=policy) if c.projection_size else None)

    def build(self, input_shape=None):
        self.embedding.build()
        self.encoder.build((None, None, self.config.width))
        if self.projection is not None:
            self.projection.build((None, self.config.width))
        if self.config.lora:  # LoRA trains the updates alone, as the image tower's (model.lora.freeze_for_lora)
            from keras_vit.weights.layout import is_lora_key, text_variables_by_key

            for key, variable in text_variables_by_key(self).items():
                variable.trainable = is_lora_key(key)

    def call(self, token_ids, token_mask=None, training=False):
        x = self.embedding(token_ids)
        mask = self._attention_mask(token_ids, token_mask)
        x = self.encoder(x, training=training, **({} if mask is None else {"attention_mask": mask}))
        pooled = ops.take_along_axis(x, self._pooled_position(token_ids)[:, None, None], axis=1)[:, 0]
        return pooled if self.projection is None else self.projection(pooled)

    def _attention_mask(self, token_ids, token_mask):
        """(B, L) keys, or (B, L, L) keys per query under a causal tower; None: every token sees all."""
        if token_mask is not None:
            # A text with no real token (an empty string under a tokenizer that adds none) attends
            # to every position alike, as transformers' finite masking value makes it.
            token_mask = ops.cast(token_mask, "bool")
            token_mask = ops.logical_or(token_mask, ops.logical_not(ops.any(token_mask, axis=1, keepdims=True)))
        if not self.config.causal:
            return token_mask
        length = ops.shape(token_ids)[1]
        positions = ops.arange(length)
        causal = positions[None, :] <= positions[:, None]  # query i sees keys 0..i
        causal = ops.broadcast_to(causal[None], (ops.shape(token_ids)[0], length, length))
        if token_mask is None:
            return causal
        return ops.logical_and(causal, token_mask[:, None, :])

    def _pooled_position(self, token_ids):
        ids = ops.cast(token_ids, "int32")
        if self.config.pooling == "last":
            return ops.zeros_like(ids[:, 0]) + (ops.shape(ids)[1] - 1)
        if self.config.pooling == "max_id":
            return ops.cast(ops.argmax(ids, axis=1), "int32")
        # The first end-of-text token (padding may repeat it).
        return ops.cast(ops.argmax(ops.cast(ops.equal(ids, self.config.eos_token_id), "int32"), axis=1), "int32")

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.config.embedding_size)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}
