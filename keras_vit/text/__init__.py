"""Text for image-text models: tokenizers that give a checkpoint's own token ids."""

from keras_vit.text.tokenizer import Tokenizer, read_tokenizer

__all__ = ["Tokenizer", "read_tokenizer"]
