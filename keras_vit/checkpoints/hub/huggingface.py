"""Hugging Face Hub handles: `hf://org/name[@revision]`, resolved into the Hugging Face cache.

`keras_vit.checkpoints.loading.read_weights` resolves a handle here, so
every reader of weights (`ViT(weights=...)`, `from_pretrained`, the
commands) takes one. Needs the `[hub]` extra (`huggingface_hub`); once
cached, a handle resolves offline.
"""

from keras_vit.checkpoints.source import CheckpointError
from keras_vit.utils.names import HF_PREFIX

# The files a ViT repository on the Hub may hold that keras_vit reads (transformers keeps the pixel
# statistics in preprocessor_config.json).
HUB_FILES = ["config.json", "preprocessor_config.json", "model.safetensors", "pytorch_model.bin", "*.npz"]


def resolve_handle(handle):
    """The local folder of an `hf://org/name[@revision]` handle, downloaded into the Hugging Face cache once.

    With `HF_HUB_OFFLINE=1` (or no network) a cached snapshot is used; a
    handle that is not cached is a `CheckpointError` that names it. A handle
    of another form is refused before the Hub or the cache is asked.
    """
    repo, _, revision = handle.removeprefix(HF_PREFIX).partition("@")  # a revision may hold "/": refs/pr/1
    parts = repo.split("/")
    if len(parts) > 2 and all(parts):
        whole = HF_PREFIX + "/".join(parts[:2]) + (f"@{revision}" if revision else "")
        raise CheckpointError(f"{handle} names a subfolder ({'/'.join(parts[2:])}), and hf:// handles take none: "
                              f"pass {whole} (the form hf://org/name[@revision]), or download the subfolder and pass "
                              "its local path.")
    if len(parts) != 2 or not all(parts):
        raise CheckpointError(f"{handle} is not an hf://org/name handle (for example hf://timm/vit_base_patch16_224).")
    try:
        import huggingface_hub
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError as error:
        raise CheckpointError(
            f"{handle}: hf:// handles need huggingface_hub: pip install 'keras-vision-transformer[hub]'."
        ) from error
    try:
        return huggingface_hub.snapshot_download(repo, revision=revision or None, allow_patterns=HUB_FILES)
    except LocalEntryNotFoundError as error:
        raise CheckpointError(
            f"{handle} is not in the Hugging Face cache ({huggingface_hub.constants.HF_HUB_CACHE}) and the Hub "
            "cannot be reached (offline, or HF_HUB_OFFLINE=1): download it once with network access, or pass a "
            "local path."
        ) from error
    except Exception as error:  # huggingface_hub raises many types (missing repo, gated, HTTP).
        raise CheckpointError(f"{handle} could not be fetched from the Hugging Face Hub: {error}") from error
