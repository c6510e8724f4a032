"""hf:ORG/NAME and timm:NAME: files fetched once through huggingface_hub into
its own cache (HF_HUB_CACHE, with its progress bar; HF_HUB_OFFLINE=1 reads the
cache only). Only config.json and model.safetensors are ever fetched: pickled
pytorch_model.bin files are refused, never downloaded."""

from __future__ import annotations

import os
from typing import Optional, Tuple

# require, not the module: _fetch's `errors` is huggingface_hub's.
from keras_vit.errors import CannotContinue, UserError, require


def _hub():
    """huggingface_hub, or one line naming the extra that brings it."""
    return require("huggingface_hub", "hub", "Downloading an hf: or timm: checkpoint")


def _fetch(repo: str, filename: str, revision: Optional[str], source: str, required: bool = True) -> Optional[str]:
    hub = _hub()
    from huggingface_hub import errors

    try:
        return hub.hf_hub_download(repo, filename, revision=revision, library_name="keras-vit")
    except errors.RemoteEntryNotFoundError:
        if not required:
            return None
        if filename == "model.safetensors":
            _refuse_pickle_only(repo, revision, source)
        raise UserError(f"{source}: the repository {repo} has no {filename}.")
    except errors.LocalEntryNotFoundError as error:
        if not required:
            return None
        if filename == "model.safetensors":
            cached = hub.try_to_load_from_cache(repo, "pytorch_model.bin", revision=revision)
            if isinstance(cached, str):
                _refuse_pickle_only(repo, revision, source)
        from keras_vit import _console

        local = f"/path/to/{repo.split('/')[-1]}"
        example = (f"{local} in place of {source}" if _console.COMMAND_LINE else
                   f"keras_vit.from_pretrained('{local}')")
        raise UserError(  # a ValueError, as before: the fix is a local path
            f"Could not get {filename} of {source} ({repo}{'@' + revision if revision else ''}): this machine is "
            f"offline (or HF_HUB_OFFLINE=1) and it is not in the Hugging Face cache. Download the repository "
            f"elsewhere (`hf download {repo}`, or `save_pretrained`) and pass its local directory, e.g. {example}."
        ) from error
    except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError, errors.GatedRepoError) as error:
        raise UserError(f"{source}: {type(error).__name__}: {str(error).splitlines()[0]}") from error


def _refuse_pickle_only(repo, revision, source):
    raise UserError(
        f"{source}: the repository {repo} has no model.safetensors (only a pickled pytorch_model.bin, which "
        f"keras-vit never unpickles). Convert it to safetensors where you trust it (transformers: "
        f"from_pretrained then save_pretrained) and pass the local directory."
    )


def hf_directory(repo: str, revision: Optional[str] = None) -> str:
    """The local snapshot directory of an HF transformers repo (config.json + model.safetensors)."""
    source = f"hf:{repo}" + (f"@{revision}" if revision else "")
    config = _fetch(repo, "config.json", revision, source)
    weights = _fetch(repo, "model.safetensors", revision, source)
    directory = os.path.dirname(config)
    if os.path.dirname(weights) != directory:  # pragma: no cover - one snapshot holds both
        raise CannotContinue(f"{source}: config.json and model.safetensors came from different snapshots.")
    return directory


def timm_files(name: str, revision: Optional[str] = None) -> Tuple[str, Optional[str]]:
    """(model.safetensors, config.json or None) of timm's HF Hub repo timm/NAME."""
    repo = name if "/" in name else f"timm/{name}"
    source = f"timm:{name}" + (f"@{revision}" if revision else "")
    config = _fetch(repo, "config.json", revision, source, required=False)
    return _fetch(repo, "model.safetensors", revision, source), config
