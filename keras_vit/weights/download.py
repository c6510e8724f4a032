"""hf:ORG/NAME and timm:NAME: files fetched once through huggingface_hub into
its own cache (HF_HUB_CACHE, with its progress bar; HF_HUB_OFFLINE=1 reads the
cache only, and so does a Hub that does not answer, at once). Only config.json
and model.safetensors are ever fetched: pickled pytorch_model.bin files are
refused, never downloaded."""

from __future__ import annotations

import os
from typing import Optional, Tuple

# require, not the module: _fetch's `errors` is huggingface_hub's.
from keras_vit.errors import CannotContinue, UserError, require


def _hub():
    """huggingface_hub, or one line naming the extra that brings it."""
    return require("huggingface_hub", "hub", "Downloading an hf: or timm: checkpoint")


# Seconds the probe waits for the Hub's answer: huggingface_hub's own first try.
_PROBE_TIMEOUT = 10


def _connection_errors() -> tuple:
    """What huggingface_hub raises when it cannot reach the Hub: its HTTP
    client's failures to connect or to hear back (httpx from huggingface_hub
    1.0, requests before), and its offline mode (HF_HUB_OFFLINE=1)."""
    from huggingface_hub import errors, utils

    try:
        client = utils.httpx
    except AttributeError:  # huggingface_hub < 1.0
        import requests

        return requests.ConnectionError, requests.Timeout, errors.OfflineModeIsEnabled
    return client.ConnectError, client.TimeoutException, errors.OfflineModeIsEnabled


def _reachable(repo: str, filename: str, revision: Optional[str]) -> bool:
    """Whether the Hub answers one HEAD request for a file of `repo` (any
    answer, "not found" included), asked once, without retries.

    huggingface_hub retries an unreachable Hub for tens of seconds before it falls back
    to its cache; knowing at once that it is unreachable, _fetch reads the
    cache only (local_files_only, an argument: nothing in the process's
    environment is changed) and answers in a moment."""
    hub = _hub()
    from huggingface_hub import errors

    url = hub.hf_hub_url(repo, filename, revision=revision)
    try:
        hub.get_hf_file_metadata(url, timeout=_PROBE_TIMEOUT)
    except _connection_errors():
        return False
    except errors.HfHubHTTPError:
        pass  # the Hub answered: hf_hub_download reports what it said
    return True


def _fetch(repo: str, filename: str, revision: Optional[str], source: str, required: bool = True,
           online: bool = True) -> Optional[str]:
    """The local path of `filename` of `repo`, from the Hub or (not `online`) from the cache only."""
    hub = _hub()
    from huggingface_hub import errors

    try:
        return hub.hf_hub_download(repo, filename, revision=revision, library_name="keras-vit",
                                   local_files_only=not online)
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
        raise _offline(repo, filename, revision, source, "this machine is offline (or HF_HUB_OFFLINE=1)") from error
    except errors.GatedRepoError as error:  # (a kind of RepositoryNotFoundError: first)
        # DINOv3's repositories, among others: the Hub answers only to a token whose owner accepted the terms.
        raise UserError(f"{source}: {repo} is gated: accept its terms at https://huggingface.co/{repo} (logged in), "
                        f"then give this machine your token (`hf auth login`, or the HF_TOKEN variable) and run "
                        f"again.") from error
    except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError) as error:
        raise UserError(f"{source}: {type(error).__name__}: {str(error).splitlines()[0]}") from error
    except _connection_errors() as error:  # the connection failed during the download
        raise _offline(repo, filename, revision, source,
                       f"the download failed ({type(error).__name__}: {error})") from error


def _offline(repo, filename, revision, source, why: str) -> UserError:
    from keras_vit.utils import console as _console

    local = f"/path/to/{repo.split('/')[-1]}"
    example = (f"{local} in place of {source}" if _console.COMMAND_LINE else
               f"keras_vit.from_pretrained('{local}')")
    return UserError(  # a ValueError, as before: the fix is a local path
        f"Could not get {filename} of {source} ({repo}{'@' + revision if revision else ''}): {why} and it is not "
        f"in the Hugging Face cache. Download the repository elsewhere (`hf download {repo}`, or "
        f"`save_pretrained`) and pass its local directory, e.g. {example}."
    )


def _refuse_pickle_only(repo, revision, source):
    raise UserError(
        f"{source}: the repository {repo} has no model.safetensors (only a pickled pytorch_model.bin, which "
        f"keras-vit never unpickles). Convert it to safetensors where you trust it (transformers: "
        f"from_pretrained then save_pretrained) and pass the local directory."
    )


# What a tokenizer leaves beside an image-text checkpoint (keras_vit.text.tokenizer reads them).
TOKENIZER_FILES = ("tokenizer.json", "spiece.model", "tokenizer_config.json", "special_tokens_map.json")


def hf_directory(repo: str, revision: Optional[str] = None, also=()) -> str:
    """The local snapshot directory of an HF transformers repo (config.json + model.safetensors),
    with those of the files named in `also` (TOKENIZER_FILES) that the repo has."""
    source = f"hf:{repo}" + (f"@{revision}" if revision else "")
    online = _reachable(repo, "config.json", revision)
    config = _fetch(repo, "config.json", revision, source, online=online)
    weights = _fetch(repo, "model.safetensors", revision, source, online=online)
    # What pixels the weights expect (ViT repos of DeiT's weights normalise with ImageNet's mean/std).
    _fetch(repo, "preprocessor_config.json", revision, source, required=False, online=online)
    for name in also:
        _fetch(repo, name, revision, source, required=False, online=online)
    directory = os.path.dirname(config)
    if os.path.dirname(weights) != directory:  # pragma: no cover - one snapshot holds both
        raise CannotContinue(f"{source}: config.json and model.safetensors came from different snapshots.")
    return directory


def cached_file(repo: str, filename: str, revision: Optional[str] = None) -> Optional[str]:
    """The local path of `filename` of `repo` if the Hugging Face cache holds it, else None;
    never reaches the network (what a run that already downloaded the repo asks afterwards)."""
    found = _hub().try_to_load_from_cache(repo, filename, revision=revision)
    return found if isinstance(found, str) else None


def timm_files(name: str, revision: Optional[str] = None) -> Tuple[str, Optional[str]]:
    """(model.safetensors, config.json or None) of timm's HF Hub repo timm/NAME."""
    repo = name if "/" in name else f"timm/{name}"
    source = f"timm:{name}" + (f"@{revision}" if revision else "")
    online = _reachable(repo, "model.safetensors", revision)
    config = _fetch(repo, "config.json", revision, source, required=False, online=online)
    return _fetch(repo, "model.safetensors", revision, source, online=online), config
