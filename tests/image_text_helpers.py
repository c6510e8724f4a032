"""Small image-text checkpoints as transformers writes them: SigLIP, SigLIP2, CLIP and MetaCLIP 2,
each with a tokenizer of its own family's class, learned in a second from a few captions and
saved by transformers' own save_pretrained beside perturbed random weights."""

import io
import json

import numpy as np
import sentencepiece
import tokenizers
import torch
import transformers

from tests.sources_helpers import perturb_torch

CORPUS = [
    "a photo of a cat", "a photo of a dog", "a blurry photo of a bird", "A picture of the digit seven.",
    "the number zero, handwritten", "two dogs playing in the snow", "a cat sleeping on a red sofa",
    "an apple and an orange on a table", "a black and white photo of a horse", "a close-up of a fish",
    "The quick brown fox jumps over the lazy dog!", "photo: a ship at sea; sunset", "numbers 1 2 3 4 5 6 7 8 9",
]
VISION = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=80)
TEXT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=40)


def sentencepiece_model(vocab_size=120, **extra):
    """The bytes of a unigram sentencepiece model learned from CORPUS."""
    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 4), model_writer=out, vocab_size=vocab_size, model_type="unigram",
        character_coverage=1.0, hard_vocab_limit=False, minloglevel=2, **extra)
    return out.getvalue()


def bpe(vocab_size, specials, suffix=None, lowercase=False, metaspace=False):
    """(vocab, merges) of a byte-level-free BPE learned from CORPUS."""
    extra = {} if suffix is None else {"end_of_word_suffix": suffix}
    model = tokenizers.models.BPE(unk_token=specials[-1], **extra)
    tokenizer = tokenizers.Tokenizer(model)
    if lowercase:
        tokenizer.normalizer = tokenizers.normalizers.Lowercase()
    tokenizer.pre_tokenizer = (tokenizers.pre_tokenizers.Metaspace() if metaspace
                               else tokenizers.pre_tokenizers.Whitespace())
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                             show_progress=False, **extra)
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    saved = json.loads(tokenizer.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in saved["merges"]]
    return saved["vocab"], merges


def siglip_tokenizer(directory):
    path = directory / "spiece.model"
    path.write_bytes(sentencepiece_model())
    return transformers.SiglipTokenizer(vocab_file=str(path))


def siglip2_tokenizer(directory):
    vocab, merges = bpe(90, ["<pad>", "<eos>", "<bos>", "<unk>"], metaspace=True)
    vocab = {k.replace(" ", "\u2581"): v for k, v in vocab.items()}
    return transformers.Siglip2Tokenizer(vocab=vocab, merges=merges)


def clip_tokenizer(directory):
    vocab, merges = bpe(110, ["<|startoftext|>", "<|endoftext|>"], suffix="</w>", lowercase=True)
    return transformers.CLIPTokenizer(vocab=vocab, merges=merges)


def metaclip_2_tokenizer(directory):
    processor = sentencepiece.SentencePieceProcessor(model_proto=sentencepiece_model())
    pieces = [(processor.id_to_piece(i), processor.get_score(i)) for i in range(processor.get_piece_size())]
    specials = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces = specials + [p for p in pieces if p[0] not in ("<s>", "</s>", "<unk>", "<pad>")] + [("<mask>", 0.0)]
    return transformers.XLMRobertaTokenizer(vocab=pieces)


def models(vocab):
    text = dict(TEXT, vocab_size=vocab)
    return {
        "siglip": lambda: transformers.SiglipModel(transformers.SiglipConfig(
            vision_config=dict(VISION, image_size=32, patch_size=8), text_config=dict(text, max_position_embeddings=16, projection_size=48))),
        "siglip2": lambda: transformers.Siglip2Model(transformers.Siglip2Config(
            vision_config=dict(VISION, patch_size=8, num_patches=16),
            text_config=dict(text, max_position_embeddings=16, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                             projection_size=48))),
        "clip": lambda: transformers.CLIPModel(transformers.CLIPConfig(
            vision_config=dict(VISION, image_size=32, patch_size=8),
            text_config=dict(text, max_position_embeddings=20, bos_token_id=0, eos_token_id=1, pad_token_id=1),
            projection_dim=24)),
        "metaclip_2": lambda: transformers.MetaClip2Model(transformers.MetaClip2Config(
            vision_config=dict(VISION, image_size=32, patch_size=8),
            text_config=dict(text, max_position_embeddings=20, bos_token_id=0, eos_token_id=2, pad_token_id=1),
            projection_dim=24)),
    }


TOKENIZERS = {"siglip": siglip_tokenizer, "siglip2": siglip2_tokenizer, "clip": clip_tokenizer,
              "metaclip_2": metaclip_2_tokenizer}


def save_family(family, directory, seed=0):
    """(the transformers model, its tokenizer) of `family`, saved to `directory` with perturbed weights."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = TOKENIZERS[family](directory)
    model = models(len(tokenizer))[family]()
    perturb_torch(model, seed)
    model.eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model, tokenizer
