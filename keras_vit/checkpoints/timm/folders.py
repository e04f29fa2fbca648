"""timm's Hub folders: `read_timm_folder` reads one with the reader of the class its `config.json` names.

A timm folder (`config.json` with `architecture`, beside `model.safetensors`)
is read by its class's module: `VisionTransformer` and DeiT distilled
(`layout`), `Eva` (`eva_layout`), `NaFlexVit` (`naflex`), `Beit` (`beit`),
`VisionTransformerRelPos` (`relpos`), `Cait` (`cait`), `VisionTransformerSAM`
(`sam`) and Gemma 4's `Gemma4VitEncoder` and `Gemma4VitClassifier` (`gemma4`). A name of none of them is
refused with the reason `families.timm_architecture` gives, before any
tensor is read.

Example:
>>> from keras_vit import checkpoints
>>> source = checkpoints.read_timm_folder("vit_base_patch16_dinov3", config)  # doctest: +SKIP
"""

import os

from keras_vit.checkpoints.source import CheckpointError
from keras_vit.checkpoints.state_dict_files import folder_weights
from keras_vit.checkpoints.timm import beit, cait, eva_layout, gemma4, relpos, sam
from keras_vit.checkpoints.timm.eva_families import EVA_ARCHITECTURES
from keras_vit.checkpoints.timm.families import timm_architecture
from keras_vit.checkpoints.timm.layout import read_timm
from keras_vit.checkpoints.timm.naflex import NAFLEX_ARCHITECTURES, read_timm_naflex

# The architecture names of the classes besides timm's VisionTransformer that `save_timm` writes too -> the class's
# config reader, file reader, timm keywords and state dict writer (Eva's writer runs after the rebuild check, which
# names its refusals, so it is not here).
CLASSES = {
    **{name: (eva_layout.configured_eva_architecture, eva_layout.read_timm_eva, eva_layout.eva_arguments, None)
       for name in EVA_ARCHITECTURES},
    **{name: (beit.configured_beit_architecture, beit.read_timm_beit, beit.beit_arguments, beit.to_timm_beit)
       for name in beit.BEIT_ARCHITECTURES},
    **{name: (relpos.configured_relpos_architecture, relpos.read_timm_relpos, relpos.relpos_arguments,
              relpos.to_timm_relpos) for name in relpos.RELPOS_ARCHITECTURES},
    **{name: (cait.configured_cait_architecture, cait.read_timm_cait, cait.cait_arguments, cait.to_timm_cait)
       for name in cait.CAIT_ARCHITECTURES},
    **{name: (sam.configured_sam_architecture, sam.read_timm_sam, sam.sam_arguments, sam.to_timm_sam)
       for name in sam.SAM_ARCHITECTURES},
    **{name: (gemma4.configured_gemma4_architecture, gemma4.read_timm_gemma4, gemma4.gemma4_arguments,
              gemma4.to_timm_gemma4) for name in gemma4.GEMMA4_ARCHITECTURES},
}
# Each architecture name of the classes other than timm's VisionTransformer -> its reader.
READERS = {**{name: entry[1] for name, entry in CLASSES.items()}, **dict.fromkeys(NAFLEX_ARCHITECTURES, read_timm_naflex)}


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
