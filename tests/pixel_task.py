"""A Task with a second field per example, for the tests of the Task interface (not a test
module): each patch token of the ViT predicts the class of every pixel it covers, so the mask
must move with every crop and flip of its image. Named on the command line as
`--task tests.pixel_task:PixelTask`."""

import keras
import tensorflow as tf

from keras_vit.model import ViT
from keras_vit.tasks import PatchGridModel, Task, across_replicas
from keras_vit.tasks.fields import IMAGE, MASK
from keras_vit.tasks.segmentation import pixel_cross_entropy
from keras_vit.variants import get_variant


class PixelTask(Task):
    name = "pixel_classes"
    fields = {"image": IMAGE, "mask": MASK}
    adapts_encoder = True  # its ViT is whole in the model: LoRA adapts it, the head trains in full

    def build_model(self, plan):
        vit = ViT(get_variant(plan.model), image_size=plan.image_size, include_top=False,
                  num_channels=plan.num_channels)
        head = keras.Sequential([keras.layers.Dense(plan.num_classes, dtype="float32", name="pixel_logits"),
                                 keras.layers.UpSampling2D(vit.config.total_stride, name="to_pixels")],
                                name="pixel_head")
        return PatchGridModel(vit, head, name="pixel_" + vit.name)

    def compute_loss(self, model, batch, training):
        logits = tf.cast(model(batch["image"], training=training), tf.float32)  # (B, H, W, K)
        loss, accuracy = pixel_cross_entropy(logits, batch["mask"])  # the segmentation Task's, per image
        return loss, {"pixel_accuracy": accuracy}

    def serving_outputs(self, model, images):
        logits = model(images, training=False)
        return {"mask": tf.argmax(logits, -1, output_type=tf.int32), "probabilities": tf.nn.softmax(logits)}

    def describe(self, figures):
        return f"pixel accuracy {figures['pixel_accuracy']:.2%}, loss {figures['loss']:.4f}"


class CentredTask(Task):
    """Classification whose loss also pulls each example's logits towards the mean logits of the
    step's whole batch, across replicas (keras_vit.tasks.across_replicas): trained on one device or
    on several replicas, the same run."""

    name = "centred_classes"
    gathers_across_replicas = True
    exports_classifier = True

    def build_model(self, plan):
        return ViT(get_variant(plan.model), image_size=plan.image_size, num_classes=plan.num_classes,
                   num_channels=plan.num_channels)

    def compute_loss(self, model, batch, training):
        logits = tf.cast(model(batch["image"], training=training), tf.float32)
        # weighted by the examples that count: the blank stand-in of a padding example pulls nothing
        weight = tf.cast(batch["weight"], tf.float32)[:, None]
        every_logit, every_weight = self.gather(logits * weight), self.gather(weight)
        centre = tf.reduce_sum(every_logit, 0) / tf.maximum(tf.reduce_sum(every_weight), 1.0)
        spread = tf.reduce_sum(tf.square(logits - centre), -1)
        cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(batch["label"], logits)
        hits = tf.cast(tf.argmax(logits, -1, output_type=tf.int32) == batch["label"], tf.float32)
        return cross_entropy + spread, {"accuracy": hits}

    def gather(self, values):
        return across_replicas(values)


class LocalCentredTask(CentredTask):
    """CentredTask with each replica's own centre (no gather): what the gathered loss must not equal."""

    gathers_across_replicas = False

    def gather(self, values):
        return values
