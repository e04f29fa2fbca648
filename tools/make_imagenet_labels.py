"""Write keras_vit/data/imagenet1k_labels.txt from timm's ImageNet synset tables.

Run in the fixture venv that has timm (see tools/README.md):
    python tools/make_imagenet_labels.py
Each line is `wnid<TAB>name`, in class-index order (sorted WordNet ids); the
name is the synset's first lemma, as keras.applications' class index uses.
"""

import os

import timm

info = os.path.join(os.path.dirname(timm.__file__), "data", "_info")
with open(os.path.join(info, "imagenet_synsets.txt")) as f:
    synsets = f.read().split()
lemmas = {}
with open(os.path.join(info, "imagenet_synset_to_lemma.txt")) as f:
    for line in f:
        wnid, _, names = line.rstrip("\n").partition("\t")
        lemmas[wnid] = names.split(",")[0].strip().replace(" ", "_")
assert len(synsets) == 1000 and synsets == sorted(synsets)
out = os.path.join(os.path.dirname(__file__), "..", "keras_vit", "data", "imagenet1k_labels.txt")
with open(out, "w") as f:
    f.writelines(f"{wnid}\t{lemmas[wnid]}\n" for wnid in synsets)
print("wrote", os.path.normpath(out))
