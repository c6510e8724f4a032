"""Contrastive image-text training: SigLIP's sigmoid loss and CLIP's softmax loss over every
replica's pairs.

Each example is an image and its caption (fields image and text; `captions:` data). The text is
tokenized in the input pipeline by the model's own tokenizer (`encode`), so a batch holds
"token_ids" and "token_mask". The loss compares each image with every caption of the step,
all replicas' (keras_vit.tasks.across_replicas), the pair's own caption positive:

- sigmoid (SigLIP, Zhai et al. 2023): -sum_j log sigmoid(z_ij (t <x_i, y_j> + b)), z = +1 on the
  pair, -1 elsewhere; t = exp(logit_scale) starts at 10 and b at -10, as the paper's;
- softmax (CLIP, Radford et al. 2021): the mean of the image-to-text and the text-to-image
  cross-entropies; the temperature starts at 1/0.07.

A run starts from an image-text checkpoint (--weights: both towers, the tokenizer and the logit
scale read from it) or from scratch: the image tower of --model, a text tower of the same sizes,
and a tokenizer learned from the captions (keras_vit.text.tokenizer.learn_tokenizer). Either way
the tokenizer is kept inside the run's model.keras, which zero-shot, search, evaluate --zero-shot
and export read as any image-text model.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Optional

import keras
import numpy as np
import tensorflow as tf

from keras_vit.errors import UserError
from keras_vit.tasks.base import Task, across_replicas
from keras_vit.tasks.fields import IMAGE, TEXT

# The recipes of keras_vit.training.config that train this task, and the loss each trains.
RECIPE_LOSSES = {"siglip": "sigmoid", "clip": "softmax"}
# A text tower from scratch: positions for a caption, and the size of a tokenizer learned from the captions.
SCRATCH_POSITIONS = 32
SCRATCH_VOCABULARY = 2000


class ImageTextTask(Task):
    name = "image_text"
    fields = {"image": IMAGE, "text": TEXT}
    gathers_across_replicas = True
    adapts_encoder = True  # --lora-rank adapts both towers' blocks alike (logit scale and bias train too)

    def __init__(self, loss: str = "sigmoid", tokenizer=None, weights: Optional[str] = None):
        if loss not in ("sigmoid", "softmax"):
            raise UserError(f"ImageTextTask loss={loss!r}: choose 'sigmoid' (SigLIP) or 'softmax' (CLIP).")
        self.loss = loss
        self.tokenizer = tokenizer
        self.weights = weights  # an image-text checkpoint folder, or None (from scratch)

    @classmethod
    def from_train_config(cls, config):
        loss = RECIPE_LOSSES.get(config.recipe.name, "sigmoid")
        weights = config.weights if _is_image_text_folder(config.weights) else None
        if config.weights and weights is None:
            raise UserError(f"--weights {config.weights}: image-text training starts from both towers of a SigLIP, "
                            f"SigLIP2, CLIP or MetaCLIP 2 folder (transformers' save_pretrained, with its tokenizer), "
                            f"or from scratch without --weights.")
        return cls(loss, _tokenizer(config, weights), weights)

    # --- the pipeline's part: text to token ids ---

    def encode(self, example):
        """The example with its "text" turned into "token_ids" and "token_mask" (int32, the text
        tower's positions), by the model's tokenizer."""
        tokenizer, length = self.tokenizer, self.tokenizer.max_length

        def tokenize(text):
            tokens = tokenizer([text.decode("utf-8") if isinstance(text, bytes) else str(text)])
            ids, mask = (np.zeros((1, length), np.int32) for _ in range(2))
            ids[:] = tokenizer.pad_id
            width = min(length, tokens["token_ids"].shape[1])
            # Every text padded to the tower's positions: the families that pad to the longest text
            # read the end token through a causal tower, which padding cannot change.
            at = slice(length - width, length) if tokenizer.padding_side == "left" else slice(0, width)
            ids[0, at], mask[0, at] = tokens["token_ids"][0, :width], tokens["token_mask"][0, :width]
            return ids[0], mask[0]

        example = dict(example)
        ids, mask = tf.numpy_function(tokenize, [example.pop("text")], [tf.int32, tf.int32], stateful=False)
        ids.set_shape([length])
        mask.set_shape([length])
        return {**example, "token_ids": ids, "token_mask": mask}

    # --- the model ---

    def build_model(self, plan) -> keras.Model:
        from keras_vit.model import ViT
        from keras_vit.model.image_text import ImageTextModel
        from keras_vit.variants import get_variant

        tower = ViT(get_variant(plan.model), image_size=plan.image_size, include_top=False,
                    num_channels=plan.num_channels)
        text = _text_half(self.weights) if self.weights else None
        config = text.config if text else _scratch_text_config(tower.config, self)
        config = dataclasses.replace(config, lora=tower.config.lora)  # the run's LoRA (None: none) on both towers
        model = ImageTextModel(tower, config, loss=self.loss, uses_token_mask=self.tokenizer.returns_mask,
                               family=text.family if text else ("SigLIP" if self.loss == "sigmoid" else "CLIP"),
                               tokenizer=self.tokenizer, name="image_text")
        if text:
            from keras_vit.weights.hf_text import load_text_params

            load_text_params(model.text_tower, text.params, self.weights)
            model.logit_scale.assign(text.logit_scale)
            if model.logit_bias is not None:
                model.logit_bias.assign(text.logit_bias)
        elif self.loss == "sigmoid":
            model.logit_scale.assign(math.log(10.0))
            model.logit_bias.assign(-10.0)
        else:
            model.logit_scale.assign(math.log(1 / 0.07))
        return model

    # --- the loss ---

    def compute_loss(self, model, batch, training):
        images = tf.cast(model.image_tower(batch["image"], training=training), tf.float32)
        mask = batch["token_mask"] if model.uses_token_mask else None
        texts = tf.cast(model.text_tower(batch["token_ids"], mask, training=training), tf.float32)
        images, texts = tf.math.l2_normalize(images, -1), tf.math.l2_normalize(texts, -1)
        every_image, every_text = across_replicas(images), across_replicas(texts)
        # This replica's rows begin where its share of the gathered batch does.
        local = tf.shape(images)[0]
        replica = tf.distribute.get_replica_context()
        first = (replica.replica_id_in_sync_group if replica is not None else 0) * local
        own = first + tf.range(local)
        scale = tf.exp(tf.cast(model.logit_scale, tf.float32))
        if self.loss == "sigmoid":
            replicas = replica.num_replicas_in_sync if replica is not None else 1
            return _chunked_sigmoid(images, every_text, own, scale, tf.cast(model.logit_bias, tf.float32), local,
                                    replicas)
        image_to_text = tf.matmul(images, every_text, transpose_b=True) * scale  # (B, R*B)
        text_to_image = tf.matmul(texts, every_image, transpose_b=True) * scale
        loss = 0.5 * (tf.nn.sparse_softmax_cross_entropy_with_logits(own, image_to_text)
                      + tf.nn.sparse_softmax_cross_entropy_with_logits(own, text_to_image))
        hits = tf.cast(tf.equal(tf.argmax(image_to_text, axis=-1, output_type=tf.int32), own), tf.float32)
        return loss, {"retrieval": hits}

    def describe(self, figures) -> str:
        return (f"loss {figures['loss']:.4f}, image-to-caption retrieval in the batch "
                f"{figures.get('retrieval', 0.0):.2%}")

    def export_model(self, model):
        """The run's model.keras: LoRA's updates merged into both towers (ImageTextModel.merged)."""
        return model.merged()

    def serving_outputs(self, model, images):
        return {"embeddings": model.image_tower(images, training=False)}


def _chunked_sigmoid(images, every_text, own, scale, bias, local, replicas: int):
    """SigLIP's loss of this replica's images against every replica's texts, one replica's share
    of texts at a time (the paper's chunked form: a (B, B) block of logits alive at once, never
    (B, R*B)); with the best-scoring text kept as it goes, for the retrieval figure. The sum is
    the whole matrix's: -sum_j log sigmoid(z_ij (t <x_i, y_j> + b))."""
    loss = tf.zeros(tf.shape(images)[:1], tf.float32)
    best_score = tf.fill(tf.shape(images)[:1], -math.inf)
    best_text = tf.zeros(tf.shape(images)[:1], tf.int32)
    for chunk in range(replicas):
        first = chunk * local
        texts = every_text[first:first + local]
        logits = tf.matmul(images, texts, transpose_b=True) * scale + bias
        signs = 2.0 * tf.one_hot(own - first, tf.shape(texts)[0]) - 1.0  # an own text outside the block: no +1
        loss += -tf.reduce_sum(tf.math.log_sigmoid(signs * logits), axis=-1)
        score, text = tf.reduce_max(logits, axis=-1), tf.argmax(logits, axis=-1, output_type=tf.int32) + first
        better = score > best_score
        best_score, best_text = tf.where(better, score, best_score), tf.where(better, text, best_text)
    return loss, {"retrieval": tf.cast(tf.equal(best_text, own), tf.float32)}


def _is_image_text_folder(path) -> bool:
    import json

    from keras_vit.weights.hf_text import FAMILIES

    if not path or not os.path.isdir(str(path)):
        return False
    try:
        with open(os.path.join(str(path), "config.json"), encoding="utf-8") as f:
            return json.load(f).get("model_type") in FAMILIES
    except (OSError, ValueError):
        return False


def _text_half(folder):
    from keras_vit.weights.checkpoint import read_json
    from keras_vit.weights.hf import read_hf_tensors
    from keras_vit.weights.hf_text import read_text_half

    return read_text_half(read_json(os.path.join(folder, "config.json")), read_hf_tensors(folder, folder), folder)


def _tokenizer(config, weights):
    """The checkpoint's tokenizer, or one learned from the run's captions."""
    from keras_vit.text.tokenizer import learn_tokenizer, read_tokenizer

    if weights:
        text = _text_half(weights)
        return read_tokenizer(weights, text.model_type, text.config.max_positions, weights, text.pad_token_id)
    spec = str(config.dataset)
    if not spec.startswith("captions:"):
        raise UserError(f"Image-text training from scratch learns its tokenizer from captions: give --dataset "
                        f"captions:FILE (not {spec}), or --weights an image-text checkpoint with its own.")
    from keras_vit.text.captions import captions

    return learn_tokenizer(captions(spec[len("captions:"):]), SCRATCH_VOCABULARY, SCRATCH_POSITIONS)


def _scratch_text_config(image, task):
    """A text tower of the image tower's sizes, its vector the image tower's width."""
    from keras_vit.config import TextConfig

    tokenizer = task.tokenizer
    sigmoid = task.loss == "sigmoid"
    return TextConfig(vocab_size=tokenizer.vocab_size, max_positions=tokenizer.max_length, width=image.hidden_size,
                      num_layers=image.num_layers, num_heads=image.num_heads, mlp_dim=image.mlp_dim,
                      layer_norm_epsilon=1e-6, mlp_activation="gelu", gelu_approximate=True, causal=not sigmoid,
                      pooling="last" if sigmoid else "eos", eos_token_id=None if sigmoid else 1,
                      projection_size=image.hidden_size, projection_bias=sigmoid)
