"""The parts of keras-vit that exist only on TensorFlow say so on import."""

import keras


def require_tensorflow(feature: str) -> None:
    """ImportError naming the backend and the fix unless Keras runs on TensorFlow."""
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise ImportError(
            f"{feature} needs the TensorFlow backend of Keras, but KERAS_BACKEND is {backend!r}. "
            f"Run it with KERAS_BACKEND=tensorflow. The model library (keras_vit.ViT, checkpoints, "
            f"inspection) works on every backend, and model.fit fine-tunes there."
        )
