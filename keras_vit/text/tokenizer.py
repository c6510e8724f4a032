"""Texts to token ids exactly as an image-text checkpoint's own tokenizer gives them.

The ids are the feature: SigLIP padded to the longest text instead of its 64 positions reads
a pad token where it was trained to read the text's last one, and SigLIP2 without its
lower-casing reads other tokens; both lose most of their zero-shot accuracy without a word of
warning. So the rules here are transformers' own, read off its tokenizer classes
(transformers 5.24), per family:

- a tokenizer.json (CLIP, SigLIP2, MetaCLIP 2: what transformers 5 writes for its
  tokenizers-backed classes) is run by the `tokenizers` library it was written for; SigLIP2's
  is lower-cased first, as Siglip2Tokenizer adds (transformers reads siglip2 checkpoints with
  that class whatever tokenizer_class their files name);
- SigLIP's spiece.model is run by `sentencepiece` after SiglipTokenizer's canonicalisation
  (lower case, punctuation removed, whitespace collapsed), with its end token appended;
- SigLIP and SigLIP2 pad to the text tower's positions (their processors' max_length, 64),
  CLIP and MetaCLIP 2 to the longest text (their tower is causal and reads the end token, so
  padding changes nothing); every family truncates at the tower's positions, keeping its
  special tokens, and says so once.
"""

from __future__ import annotations

import base64
import json
import os
import re
import string
from typing import Dict, List, Optional, Sequence

import numpy as np

from keras_vit.errors import UserError, require
from keras_vit.utils import console as _console

SPIECE_UNDERLINE = "\u2581"
_SIGMOID_FAMILIES = ("siglip", "siglip2")  # padded to the tower's full length
# transformers' tokenizer classes' padding_side, where their files do not say.
_PADDING_SIDES = {"Siglip2Tokenizer": "left"}


class Tokenizer:
    """`tokenizer(texts)` -> {"token_ids": (N, L) int32, "token_mask": (N, L) int32, 1 on real
    tokens}. `encode(text)` gives one text's ids before padding, `length` is the padded length
    (None: the longest text's), `pad_id` and `padding_side` how it pads."""

    def __init__(self, encode, max_length: int, pad_id: int, padding_side: str = "right",
                 pad_to_max: bool = False, source: str = "", kind: str = "", returns_mask: bool = True):
        self.encode = encode
        self.max_length = int(max_length)
        self.pad_id = int(pad_id)
        self.padding_side = padding_side
        self.pad_to_max = bool(pad_to_max)
        self.source = source
        self.kind = kind
        # Whether the model is handed the padding mask: transformers' tokenizers return one unless
        # their files' model_input_names leave it out (SigLIP's hub files do: its text tower was
        # trained attending to its padding).
        self.returns_mask = bool(returns_mask)
        self.vocab_size = None  # the ids run 0..vocab_size-1: set by the readers
        self.spec = None  # what rebuilds it (tokenizer_from_spec): set by the readers
        self._said_truncated = False

    def __call__(self, texts) -> Dict[str, np.ndarray]:
        texts = [texts] if isinstance(texts, str) else list(texts)
        for text in texts:
            if not isinstance(text, str):
                raise UserError(f"Texts must be strings; got {type(text).__name__} {text!r}.")
        rows = [self.encode(text) for text in texts]
        longest = max((len(row) for row in rows), default=0)
        length = self.max_length if self.pad_to_max else max(longest, 1)
        ids = np.full((len(rows), length), self.pad_id, np.int32)
        mask = np.zeros((len(rows), length), np.int32)
        for i, row in enumerate(rows):
            at = slice(length - len(row), length) if self.padding_side == "left" else slice(0, len(row))
            ids[i, at], mask[i, at] = row, 1
        return {"token_ids": ids, "token_mask": mask}

    def truncated(self, text: str) -> None:
        """Says once that texts longer than the tower's positions are cut, as the family cuts them."""
        if not self._said_truncated:
            self._said_truncated = True
            shown = text if len(text) <= 40 else text[:37] + "..."
            _console.warn(f"a text is longer than the text tower's {self.max_length} token positions and is cut "
                          f"there, as the checkpoint's own tokenizer cuts it (first: {shown!r}).")


def read_tokenizer(directory: str, model_type: str, max_positions: int, where: Optional[str] = None,
                   config_pad_id: Optional[int] = None) -> Tokenizer:
    """The tokenizer beside an image-text checkpoint in `directory` (tokenizer.json, or SigLIP's
    spiece.model), for a text tower of `max_positions` positions."""
    where = where or directory
    spec = dict(model_type=model_type, max_positions=int(max_positions), settings=_read_settings(directory),
                config_pad_id=config_pad_id)
    if os.path.isfile(os.path.join(directory, "tokenizer.json")):
        with open(os.path.join(directory, "tokenizer.json"), encoding="utf-8") as f:
            return tokenizer_from_spec(dict(spec, file="tokenizer.json", data=f.read()), where)
    if os.path.isfile(os.path.join(directory, "spiece.model")) and model_type == "siglip":
        with open(os.path.join(directory, "spiece.model"), "rb") as f:
            data = base64.b64encode(f.read()).decode("ascii")
        return tokenizer_from_spec(dict(spec, file="spiece.model", data=data), where)
    wanted = "spiece.model or tokenizer.json" if model_type == "siglip" else "tokenizer.json"
    raise UserError(f"{where} has no tokenizer files ({wanted}): save the checkpoint's tokenizer beside its weights, "
                    f"e.g. AutoProcessor.from_pretrained(NAME).save_pretrained(DIR) in transformers.")


def tokenizer_from_spec(spec: dict, where: str = "") -> Tokenizer:
    """A Tokenizer from what `Tokenizer.spec` holds (a tokenizer file's content and its settings):
    how a saved image-text model (model.keras) keeps its tokenizer inside it."""
    build = _from_tokenizer_json if spec["file"] == "tokenizer.json" else _from_sentencepiece
    tokenizer = build(spec, where)
    tokenizer.spec = spec
    return tokenizer


def learn_tokenizer(texts: Sequence[str], vocab_size: int, max_positions: int) -> Tokenizer:
    """A tokenizer learned from `texts` (a run from scratch on captions): lower-cased words and
    punctuation split apart, byte-pair merges up to `vocab_size` entries, an end token after
    each text; <pad> is 0, <eos> 1, <unk> 2."""
    tokenizers = require("tokenizers", "text", "Learning a tokenizer from captions")
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    backend.normalizer = tokenizers.normalizers.Sequence([tokenizers.normalizers.NFKC(),
                                                          tokenizers.normalizers.Lowercase()])
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<eos>", "<unk>"],
                                             show_progress=False)
    backend.train_from_iterator(list(texts), trainer)
    backend.post_processor = tokenizers.processors.TemplateProcessing(single="$A <eos>",
                                                                      special_tokens=[("<eos>", 1)])
    spec = dict(model_type="keras_vit", max_positions=int(max_positions), config_pad_id=0, file="tokenizer.json",
                data=backend.to_str(), settings={"pad_token": "<pad>", "padding_side": "right"})
    return tokenizer_from_spec(spec, "the captions")


def _read_settings(directory: str) -> dict:
    """tokenizer_config.json over special_tokens_map.json, either may be absent."""
    settings = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as f:
                    settings.update(json.load(f))
            except ValueError as error:
                raise UserError(f"{path} is not valid JSON ({error}): save the tokenizer again.") from None
    return settings


def _returns_mask(settings: dict) -> bool:
    names = settings.get("model_input_names")
    return names is None or "attention_mask" in names


def _token_text(value) -> Optional[str]:
    """A special token as tokenizer files write it: a string, or {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _from_tokenizer_json(spec, where) -> Tokenizer:
    model_type, max_positions, settings = spec["model_type"], spec["max_positions"], spec["settings"]
    config_pad_id = spec.get("config_pad_id")
    tokenizers = require("tokenizers", "text", "An image-text model's tokenizer")
    backend = tokenizers.Tokenizer.from_str(spec["data"])
    backend.no_padding()
    backend.no_truncation()
    if model_type == "siglip2":  # Siglip2Tokenizer lower-cases before Gemma's own normaliser
        lower = tokenizers.normalizers.Lowercase()
        current = backend.normalizer
        backend.normalizer = lower if current is None else tokenizers.normalizers.Sequence([lower, current])
    pad_text = _token_text(settings.get("pad_token"))
    pad_id = backend.token_to_id(pad_text) if pad_text is not None else None
    if pad_id is None:
        pad_id = config_pad_id if config_pad_id is not None else 0
    backend.enable_truncation(max_length=max_positions)
    vocab_size = backend.get_vocab_size(with_added_tokens=True)
    tokenizer = Tokenizer(None, max_positions, pad_id,
                          settings.get("padding_side") or _PADDING_SIDES.get(settings.get("tokenizer_class"), "right"),
                          pad_to_max=model_type in _SIGMOID_FAMILIES + ("keras_vit",), source=where,
                          kind="tokenizer.json",
                          returns_mask=_returns_mask(settings))

    def encode(text: str) -> List[int]:
        encoding = backend.encode(text)
        if encoding.overflowing:
            tokenizer.truncated(text)
        return list(encoding.ids)

    tokenizer.encode = encode
    tokenizer.vocab_size = vocab_size
    return tokenizer


def _canonical(text: str, lower: bool = True) -> str:
    """SiglipTokenizer.canonicalize_text: lower case, no punctuation, single spaces, stripped."""
    text = (text.lower() if lower else text).translate(str.maketrans("", "", string.punctuation))
    return re.sub(r"\s+", " ", text).strip()


def _from_sentencepiece(spec, where) -> Tokenizer:
    max_positions, settings = spec["max_positions"], spec["settings"]
    spm = require("sentencepiece", "text", "SigLIP's tokenizer")
    processor = spm.SentencePieceProcessor(model_proto=base64.b64decode(spec["data"]))
    unk = _token_text(settings.get("unk_token")) or "<unk>"
    eos = _token_text(settings.get("eos_token")) or "</s>"
    pad = _token_text(settings.get("pad_token")) or "</s>"
    lower = settings.get("do_lower_case", True)
    eos_id, pad_id = processor.piece_to_id(eos), processor.piece_to_id(pad)
    unk_length = len(processor.encode(unk, out_type=str))
    tokenizer = Tokenizer(None, max_positions, pad_id, settings.get("padding_side") or "right", pad_to_max=True,
                          source=where, kind="spiece.model", returns_mask=_returns_mask(settings))

    def encode(text: str) -> List[int]:
        # SiglipTokenizer.tokenize: a leading "▁"; _tokenize: canonicalised, then encoded after the
        # unknown token's text, whose pieces are cut off (sentencepiece would otherwise drop the "▁").
        text = SPIECE_UNDERLINE + text.replace(SPIECE_UNDERLINE, " ")
        text = _canonical(text, lower)
        pieces = processor.encode(unk + text, out_type=str)
        pieces = pieces[unk_length:] if len(pieces) >= unk_length else pieces
        ids = [processor.piece_to_id(piece) for piece in pieces]
        if len(ids) > max_positions - 1:
            tokenizer.truncated(text)
            ids = ids[:max_positions - 1]
        return ids + [eos_id]

    tokenizer.encode = encode
    tokenizer.vocab_size = processor.get_piece_size()
    return tokenizer

