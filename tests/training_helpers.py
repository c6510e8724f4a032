"""Shared tiny settings of the trainer tests (not a test module)."""

import dataclasses

import numpy as np

from keras_vit.config import ViTConfig

# One block, 16 tokens of width 16: a few milliseconds a step on a CPU.
TINY = ViTConfig(patch_size=7, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1)


def tiny_config(workdir, **overrides):
    from keras_vit.training import TrainConfig

    settings = dict(
        model=TINY, dataset="mnist5k", workdir=str(workdir), steps=4, batch_size=16, warmup_steps=0,
        learning_rate=1e-3, train_augment="none", label_smoothing=0.0, checkpoint_every=2,
        eval_batch_size=500, log_every=1, progress=False, jit_compile=False, strategy="default",
    )
    recipe = overrides.pop("recipe", "scratch")
    settings.update(overrides)
    return TrainConfig.create(recipe, **settings)


def weights_of(model_path):
    import keras

    return [np.asarray(w) for w in keras.models.load_model(model_path, compile=False).get_weights()]


def checkpoint_arrays(path):
    with np.load(path) as data:
        return {k: data[k] for k in data.files if k != "meta"}


def plan_of(source, image_size, num_channels, config=None, eval_batch=None, num_replicas=1):
    """The run's plan of `config` (default: a tiny scratch run) on `source`,
    at `image_size` with `num_channels`: what the data pipeline reads."""
    from keras_vit.training import TrainConfig
    from keras_vit.training import plan as plan_lib

    config = config or TrainConfig.create("scratch", model=TINY, train_augment="none")
    changes = {"image_size": tuple(image_size)}
    if eval_batch is not None:
        changes["eval_batch_size"] = eval_batch
    changes["model"] = TINY.replace(patch_size=1)
    # The data as a model of `num_channels` takes it (pre-trained weights fix a model's channels).
    source = dataclasses.replace(source, num_channels=num_channels)
    return plan_lib.resolve(config.replace(**changes), source, num_replicas=num_replicas)
