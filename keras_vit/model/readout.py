"""What a ViT's heads and feature APIs read from its tokens: the pooled embedding
(one read-out for the head, include_top=False, few-shot and exports), every stage, chosen
blocks as feature maps (a mixin of keras_vit.model.ViT)."""

from __future__ import annotations

import functools

import keras

from keras_vit import layers as vit_layers
from keras_vit.errors import UserError


class FeatureAPI:
    """ViT's feature APIs: the backbone, every stage, blocks as feature maps."""

    def forward_stages(self, images, training=False, attention=True):
        """One pass through the model's own layers, keeping what every stage made.

        The same layers and weights as `model(images)` (with attention=True
        the attention of each block is computed explicitly, so the result
        can differ from the fused kernel by float rounding, ~1e-6).

        Args:
            images: what `model(...)` takes (B, H, W, C).
            training: dropout and stochastic depth on or off.
            attention: also return every block's attention probabilities.

        Returns a dict:
            "embeddings": (B, T, D) the tokens entering the encoder;
            "blocks": [(B, T, D)] the output of each encoder block (before the
                final LayerNorm);
            "attention": [(B, heads, T, T)] each block's probabilities
                (only with attention=True);
            "tokens": (B, T, D) the encoder's output (after its LayerNorm,
                where the model normalises tokens);
            "pooled": (B, D) the read-out (class token, mean, MAP head; after
                the pooled norm of a family that has one);
            "pre_logits": the head's input, the pooled image embedding
                (`pooled_embedding`: after any projection and representation
                layer; = "pooled" without them);
            "logits": (B, num_classes) the model's output, the head's
                classifier_activation applied if it has one (only with a head).
        """
        out = {"embeddings": self.embed(images, training=training)}
        encoded = self.encoder(out["embeddings"], training=training, return_attention_scores=attention,
                               return_block_outputs=True, **block_inputs(images, self, training))
        if attention:
            out["tokens"], out["attention"], out["blocks"] = encoded
        else:
            out["tokens"], out["blocks"] = encoded
        out["pooled"] = read_pooled(out["tokens"], self)
        out["pre_logits"] = embedding_of_pooled(out["pooled"], self)
        if self.head is not None:
            out["logits"] = read_out(out["tokens"], self)
        return out

    def forward_intermediates(self, images, indices=None, output_format="NHWC", norm=False, prefix_tokens=False,
                              training=False):
        """The outputs of chosen encoder blocks as dense features (timm's
        `forward_intermediates(..., intermediates_only=True)`), for detection
        and segmentation heads; `keras_vit.feature_model` builds the same as a
        Keras model that exports.

        Args:
            images: what `model(...)` takes (B, H, W, C).
            indices: None for every block, an int n for the last n, or a list
                of block indices (negative counts from the end).
            output_format: "NHWC" (B, rows, cols, D) feature maps of the
                patch tokens, or "NLC" (B, N, D) token sequences.
            norm: apply the model's final LayerNorm to each (where the model
                normalises its tokens).
            prefix_tokens: also return each block's prefix tokens (B, P, D)
                (class, distillation, register tokens): a list of (features,
                prefix) pairs.

        Returns a list, one entry per chosen block, in block order.
        """
        chosen = block_indices(self.config.num_layers, indices)
        x = self.embed(images, training=training)
        inputs = block_inputs(images, self, training)
        out = []
        for i, block in enumerate(self.encoder.blocks[:max(chosen) + 1]):
            x = block(x, training=training, **inputs)
            if i in chosen:
                out.append(self.dense_features(x, images, output_format, norm, prefix_tokens))
        return out

    def dense_features(self, tokens, images, output_format="NHWC", norm=False, prefix_tokens=False):
        """One block's tokens (B, T, D) -> its patch features, as `forward_intermediates` returns them."""
        if output_format not in ("NHWC", "NLC"):
            raise UserError(f"output_format must be 'NHWC' or 'NLC', got {output_format!r}.")
        if norm and self.encoder.encoder_norm is not None:
            tokens = self.encoder.encoder_norm(tokens)
        prefix = self.num_prefix_tokens
        if output_format == "NHWC":
            features = self.feature_map_layer()(tokens, images)
        else:
            features = tokens[:, prefix:]
        return (features, tokens[:, :prefix]) if prefix_tokens else features

    def feature_map_layer(self, name=None):
        """The layer putting this model's patch tokens back on their grid (TokensToMap)."""
        return vit_layers.TokensToMap(self.num_prefix_tokens, self.config.total_stride, pad=self.dynamic_image_pad,
                                      name=name)

    @functools.cached_property
    def backbone(self):
        """The model up to its encoded tokens: a keras.Model images -> (B, T, D)
        (embedding, prefix tokens, encoder, final norm) sharing this model's
        layers and weights; heads (pooling, projection, classifier) read its output.
        Built on first use and kept (cached_property writes the instance's
        __dict__, past Keras' attribute tracking: it is no part of the saved model)."""
        return keras.Model(self.inputs[0], self.encoder.output, name=f"{self.name}_backbone")


def block_inputs(images, parts, training=None) -> dict:
    """What every encoder block takes besides the tokens, for these images: the
    rotary embedding's (cos, sin) of their grid in a position_embedding="rope"
    model (`block(x, **block_inputs(images, model))`), its coordinates moved in
    training where the model augments them; nothing for the others. training=None
    leaves the mode to the caller's context (inside the functional graph: the model's call)."""
    if parts.rotary_embedding is None:
        return {}
    return {"rope": parts.rotary_embedding(images, training=training)}


def read_out(tokens, parts, attention_mask=None):
    """The encoded tokens (B, T, D) -> the model's output: the head's (logits,
    or probabilities with its activation), or without a head the pooled image
    embedding (after [pooled norm], [projection], [pre-logits]).
    attention_mask (B, T): False on padding tokens (keras_vit.model.naflex)."""
    if isinstance(parts.head, vit_layers.DistillationHead):
        return parts.head(tokens)  # reads the class and distillation tokens itself
    x = pooled_embedding(tokens, parts, attention_mask)
    return parts.head(x) if parts.head is not None else x


def pooled_embedding(tokens, parts, attention_mask=None):
    """pooling -> [pooled norm] -> [projection] -> [pre-logits]: the image
    embedding a head reads (what transformers calls pooler_output, or CLIP's
    image_embeds)."""
    return embedding_of_pooled(read_pooled(tokens, parts, attention_mask), parts)


def read_pooled(tokens, parts, attention_mask=None):
    """The read-out: pooling -> [pooled norm] (B, D), or (B, 2 D) for "token_gap"."""
    x = parts.pooling(tokens) if attention_mask is None else parts.pooling(tokens, attention_mask=attention_mask)
    return parts.pooled_norm(x) if parts.pooled_norm is not None else x


def embedding_of_pooled(pooled, parts):
    """The read-out -> [projection] -> [pre-logits]: what a head reads."""
    x = pooled
    for layer in (parts.projection, parts.pre_logits):
        if layer is not None:
            x = layer(x)
    return x


def head_layers(model) -> list:
    """The Dense layers making a ViT's logits: its head, or DeiT's pair
    (DistillationHead: .head and .head_dist); [] without a head."""
    head = model.head
    if head is None:
        return []
    if isinstance(head, vit_layers.DistillationHead):
        return [head.head, head.head_dist]
    return [head]


def block_indices(num_layers, indices=None):
    """forward_intermediates' `indices` -> sorted block numbers: None for all,
    an int n for the last n, a list of indices (negative from the end)."""
    if indices is None:
        return list(range(num_layers))
    if isinstance(indices, int):
        if not 0 < indices <= num_layers:
            raise UserError(f"indices={indices} asks for the last {indices} blocks of {num_layers}: use 1 to "
                            f"{num_layers}, or a list of block indices.")
        return list(range(num_layers - indices, num_layers))
    chosen = []
    for index in indices:
        if not -num_layers <= int(index) < num_layers:
            raise UserError(f"Block index {index} is out of range for {num_layers} blocks (0 to {num_layers - 1}, "
                            f"or negative from the end).")
        chosen.append(int(index) % num_layers)
    return sorted(set(chosen))
