"""timm's Hub folders: `read_timm_folder` reads one with the reader of the class its `config.json` names.

A timm folder (`config.json` with `architecture`, beside `model.safetensors`)
is read by its class's module: `VisionTransformer` and DeiT distilled
(`layout`), `Eva` (`eva_layout`), `NaFlexVit` (`naflex`), `Beit` (`beit`)
and `VisionTransformerRelPos` (`relpos`). A name of none of them is
refused with the reason `families.timm_architecture` gives, before any
tensor is read.

Example:
>>> from keras_vit import checkpoints
>>> source = checkpoints.read_timm_folder("vit_base_patch16_dinov3", config)  # doctest: +SKIP
"""

import os

from keras_vit.checkpoints.source import CheckpointError
from keras_vit.checkpoints.state_dict_files import folder_weights
from keras_vit.checkpoints.timm.beit import BEIT_ARCHITECTURES, read_timm_beit
from keras_vit.checkpoints.timm.eva_families import EVA_ARCHITECTURES
from keras_vit.checkpoints.timm.eva_layout import read_timm_eva
from keras_vit.checkpoints.timm.families import timm_architecture
from keras_vit.checkpoints.timm.layout import read_timm
from keras_vit.checkpoints.timm.naflex import NAFLEX_ARCHITECTURES, read_timm_naflex
from keras_vit.checkpoints.timm.relpos import RELPOS_ARCHITECTURES, read_timm_relpos

# Each architecture name of the classes other than timm's VisionTransformer -> its reader.
READERS = {**dict.fromkeys(EVA_ARCHITECTURES, read_timm_eva), **dict.fromkeys(NAFLEX_ARCHITECTURES, read_timm_naflex),
           **dict.fromkeys(BEIT_ARCHITECTURES, read_timm_beit), **dict.fromkeys(RELPOS_ARCHITECTURES, read_timm_relpos)}


def read_timm_folder(folder, config, budget=None):
    """A timm Hub folder (its parsed `config.json`, beside the weights file timm's `local-dir:` reads) as a
    `WeightsSource`."""
    where = os.path.join(folder, "config.json")
    architecture = config.get("architecture")
    if not isinstance(architecture, str):
        raise CheckpointError(f"{where}: architecture is {architecture!r}; expected timm's model name (a string "
                              "such as 'vit_base_patch16_224').")
    if architecture not in READERS:
        timm_architecture(architecture, where)  # Refused by name before any tensor is read.
    return READERS.get(architecture, read_timm)(folder_weights(folder, "timm"), budget, config, where)
