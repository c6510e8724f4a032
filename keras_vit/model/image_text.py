"""Two towers and the logit between them: SigLIP, SigLIP2, CLIP and MetaCLIP 2 as one Keras model.

The image tower is the ViT every family already loads into (its output is transformers'
get_image_features); the text tower is keras_vit.model.text_tower's. A logit is the cosine of
the two embeddings times exp(logit_scale), plus SigLIP's logit_bias. SigLIP's logits were
trained as independent sigmoids (each label yes or no), CLIP's as a softmax over the texts,
so zero-shot probabilities are read the way each was trained (`loss`).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence

import keras
import numpy as np
from keras import ops

from keras_vit.errors import UserError
from keras_vit.model.text_tower import TextTower

LOSSES = ("sigmoid", "softmax")


def normalized(x, axis=-1):
    """x / |x| along `axis` (numpy), as transformers normalises both embeddings."""
    return x / np.linalg.norm(x, axis=axis, keepdims=True)


@keras.saving.register_keras_serializable(package="keras_vit")
class ImageTextModel(keras.Model):
    """An image tower, a text tower and the logit scale (and bias) between them.

    `model({"images": x, "token_ids": ids, "token_mask": m})` gives logits_per_image (N, T);
    the methods below take numpy images (as the image tower takes them) and strings.

    Attributes: `image_tower` (a keras_vit.ViT without a head), `text_tower` (TextTower),
    `loss` ("sigmoid" or "softmax"), `tokenizer` (keras_vit.text.Tokenizer, or None for a model
    built without one), `family` ("SigLIP", "CLIP", ...), `uses_token_mask` (the family's
    tokenizer hands its padding mask to the text tower: SigLIP2's does, SigLIP's does not).
    """

    def __init__(self, image_tower, text_config, loss="softmax", uses_token_mask=False, family="",
                 tokenizer=None, **kwargs):
        super().__init__(**kwargs)
        if loss not in LOSSES:
            raise UserError(f"ImageTextModel loss={loss!r}: choose 'sigmoid' (SigLIP) or 'softmax' (CLIP).")
        self.image_tower = image_tower
        self.text_tower = TextTower(text_config, name="text_tower")
        self.text_tower.build()
        self.loss_kind = loss
        self.uses_token_mask = bool(uses_token_mask)
        self.family = family
        self.tokenizer = tokenizer
        self.logit_scale = self.add_weight(name="logit_scale", shape=(), initializer="zeros")
        self.logit_bias = (self.add_weight(name="logit_bias", shape=(), initializer="zeros")
                           if loss == "sigmoid" else None)
        self.built = True  # both towers are built: a model saved before any call holds every weight

    @property
    def text_config(self):
        return self.text_tower.config

    # --- the graph: two towers and their logits ---

    def call(self, inputs, training=False):
        images = self.image_tower(inputs["images"], training=training)
        texts = self.text_tower(inputs["token_ids"], self._mask(inputs.get("token_mask")), training=training)
        return self.logits_of(images, texts)

    def logits_of(self, image_embeddings, text_embeddings):
        """logits_per_image (N, T) of embeddings as the towers give them (tensors)."""
        def unit(x):
            x = ops.cast(x, "float32")
            return x / ops.sqrt(ops.sum(ops.square(x), axis=-1, keepdims=True))

        logits = ops.matmul(unit(image_embeddings), ops.transpose(unit(text_embeddings)))
        logits = logits * ops.exp(ops.cast(self.logit_scale, "float32"))
        return logits if self.logit_bias is None else logits + ops.cast(self.logit_bias, "float32")

    def _mask(self, token_mask):
        return token_mask if self.uses_token_mask else None

    # --- numpy in, numpy out ---

    def tokenize(self, texts) -> Dict[str, np.ndarray]:
        """{"token_ids", "token_mask"} (N, L) int32: the checkpoint's own tokenizer's ids, padded
        as the family pads them (keras_vit.text.tokenizer)."""
        if self.tokenizer is None:
            raise UserError(f"{self.name} has no tokenizer: give text_embeddings token ids, or load the model "
                            f"with from_pretrained(SOURCE, task='image_text') from a folder that holds one.")
        return self.tokenizer(texts)

    def image_embeddings(self, images, batch_size: int = 32) -> np.ndarray:
        """(N, E) float32: transformers' get_image_features (not normalised). `images` (N, H, W, C)
        as the image tower takes them, or a list of such images of their own sizes (SigLIP2)."""
        if isinstance(images, (list, tuple)):
            return np.concatenate([self.image_embeddings(np.asarray(image)[None]) for image in images])
        images = np.asarray(images, np.float32)
        tower = self._compiled("image")
        if hasattr(self.image_tower, "_check_input_range"):  # the eager guard a compiled call skips: pixels 0..255
            self.image_tower._check_input_range(images)
        parts = [np.asarray(ops.convert_to_numpy(tower(images[i:i + batch_size])), np.float32)
                 for i in range(0, len(images), batch_size)]
        return np.concatenate(parts) if parts else np.zeros((0, self.text_config.embedding_size), np.float32)

    def text_embeddings(self, texts, batch_size: int = 256) -> np.ndarray:
        """(T, E) float32: transformers' get_text_features (not normalised), of strings or of the
        {"token_ids", "token_mask"} that `tokenize` gives."""
        tokens = texts if isinstance(texts, dict) else self.tokenize(texts)
        ids, mask = np.asarray(tokens["token_ids"]), tokens.get("token_mask")
        if ids.shape[1] > self.text_config.max_positions:
            raise UserError(f"{ids.shape[1]} tokens do not fit the text tower's {self.text_config.max_positions} "
                            f"positions: tokenize with model.tokenize, which cuts them as the family does.")
        parts = []
        for i in range(0, len(ids), batch_size):
            chunk_mask = None if mask is None else np.asarray(mask)[i:i + batch_size]
            parts.append(np.asarray(ops.convert_to_numpy(self._compiled("text")(ids[i:i + batch_size],
                                                                                 self._mask(chunk_mask))),
                                    np.float32))
        return np.concatenate(parts) if parts else np.zeros((0, self.text_config.embedding_size), np.float32)

    def _compiled(self, tower: str):
        """A tower's inference call, inside a tf.function under TensorFlow: about 1.6x the eager
        call on a CPU (docs/image-text.md, "Speed"); as it is under JAX and PyTorch, and for an
        image tower of any size (a NaFlex one traces each grid of its own). Kept in the instance's
        __dict__, past Keras' tracking: no part of the saved model."""
        calls = self.__dict__.setdefault("_tower_calls", {})
        if tower not in calls:
            image, text = self.image_tower, self.text_tower
            call = ((lambda x: image(x, training=False)) if tower == "image"
                    else (lambda ids, mask=None: text(ids, mask, training=False)))
            dynamic = tower == "image" and getattr(image, "dynamic_image_size", False)
            if keras.backend.backend() == "tensorflow" and not dynamic:
                import tensorflow as tf

                call = tf.function(call, reduce_retracing=True)
            calls[tower] = call
        return calls[tower]

    def logits(self, images, texts) -> np.ndarray:
        """logits_per_image (N, T): transformers' model(...).logits_per_image."""
        return self.logits_of_embeddings(self.image_embeddings(images), self.text_embeddings(texts))

    def logits_of_embeddings(self, image_embeddings, text_embeddings) -> np.ndarray:
        return np.asarray(ops.convert_to_numpy(self.logits_of(np.asarray(image_embeddings, np.float32),
                                                              np.asarray(text_embeddings, np.float32))), np.float32)

    def label_embeddings(self, labels: Sequence[str], templates: Optional[Sequence[str]] = None) -> np.ndarray:
        """(K, E), one per label: the text's own embedding with no templates; with templates
        ("a photo of a {}."), the mean of the label's normalised template embeddings, normalised
        again (a prompt ensemble: the logit is a cosine either way)."""
        labels = check_labels(labels)
        if not templates:
            return self.text_embeddings(labels)
        templates = check_templates(templates)
        texts = [template.format(label) for label in labels for template in templates]
        embeddings = normalized(self.text_embeddings(texts)).reshape(len(labels), len(templates), -1)
        return normalized(embeddings.mean(axis=1))

    def zero_shot(self, images, labels: Sequence[str], templates: Optional[Sequence[str]] = None) -> np.ndarray:
        """(N, K) probabilities of each image over `labels`: the family's own reading of its
        logits, independent sigmoids (SigLIP, SigLIP2) or a softmax over the labels (CLIP,
        MetaCLIP 2)."""
        return self.probabilities(self.logits_of_embeddings(self.image_embeddings(images),
                                                            self.label_embeddings(labels, templates)))

    def probabilities(self, logits) -> np.ndarray:
        logits = np.asarray(logits, np.float64)
        if self.loss_kind == "sigmoid":
            return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return (shifted / shifted.sum(axis=-1, keepdims=True)).astype(np.float32)

    def merged(self) -> "ImageTextModel":
        """A model without LoRA updates computing what this one computes: each tower's updates
        added into its kernels (keras_vit.model.lora); this model itself when it has none."""
        if not self.text_config.lora and not self.image_tower.config.lora_rank:
            return self
        from keras_vit.layers.lora import check_lora
        from keras_vit.model.lora import merge_lora, merge_updates
        from keras_vit.weights.layout import text_variables_by_key

        plain = ImageTextModel(merge_lora(self.image_tower), dataclasses.replace(self.text_config, lora=None),
                               loss=self.loss_kind, uses_token_mask=self.uses_token_mask, family=self.family,
                               tokenizer=self.tokenizer, name=self.name)
        params = {key: np.asarray(variable) for key, variable in text_variables_by_key(self.text_tower).items()}
        lora = check_lora(self.text_config.lora)
        if lora:
            params = merge_updates(params, lora["alpha"] / lora["rank"])
        for key, variable in text_variables_by_key(plain.text_tower).items():
            variable.assign(params[key])
        plain.logit_scale.assign(self.logit_scale)
        if plain.logit_bias is not None:
            plain.logit_bias.assign(self.logit_bias)
        return plain

    def get_config(self):
        # The tokenizer travels inside the model's config (its file's content and settings), so that
        # a saved model (a run's model.keras) tokenizes as it was trained to.
        spec = getattr(self.tokenizer, "spec", None)
        return {**super().get_config(), "image_tower": keras.saving.serialize_keras_object(self.image_tower),
                "text_config": self.text_config.to_dict(), "loss": self.loss_kind,
                "uses_token_mask": self.uses_token_mask, "family": self.family,
                **({"tokenizer": spec} if spec else {})}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["image_tower"] = keras.saving.deserialize_keras_object(config["image_tower"])
        if isinstance(config.get("tokenizer"), dict):
            from keras_vit.text.tokenizer import tokenizer_from_spec

            config["tokenizer"] = tokenizer_from_spec(config["tokenizer"], config.get("name", "the model"))
        return cls(**config)


def check_labels(labels) -> List[str]:
    """Labels as zero-shot takes them: strings, at least one, none twice."""
    labels = [labels] if isinstance(labels, str) else list(labels)
    labels = [str(label).strip() for label in labels]
    if not labels or not all(labels):
        raise UserError("Zero-shot needs labels, each a non-empty text: e.g. --labels cat,dog,bird.")
    seen = set()
    repeated = [label for label in labels if label in seen or seen.add(label)]
    if repeated:
        raise UserError(f"The label {repeated[0]!r} is given twice: give each label once.")
    return labels


def check_templates(templates) -> List[str]:
    templates = [templates] if isinstance(templates, str) else list(templates)
    for template in templates:
        if template.count("{}") != 1:
            raise UserError(f"The template {template!r} must hold the label's place once as {{}}: "
                            f"e.g. 'a photo of a {{}}.'")
    return templates
