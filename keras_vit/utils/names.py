"""What a `weights=` string names: a path, an `hf://org/name` handle or a published checkpoint's name.

Read before Keras is imported, so that the command checks its flags at once.

Example:
>>> looks_like_path("runs/finetune/model.keras"), looks_like_path("imagenet21k+imagenet2012")
(True, False)
"""

import os

HF_PREFIX = "hf://"


def looks_like_path(weights):
    """A path has a folder, an extension or exists; published names (`imagenet21k+imagenet2012`) have none."""
    return os.sep in weights or "." in os.path.basename(weights) or os.path.exists(weights)
