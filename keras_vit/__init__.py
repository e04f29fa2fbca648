"""keras_vit: the Vision Transformer of Dosovitskiy et al. (2020) for Keras 3.

Example:
>>> import keras_vit
>>> model = keras_vit.ViT_B16(weights=None, image_size=224, classes=10)

The Keras backend is the one chosen with KERAS_BACKEND or keras.json. With
none chosen and TensorFlow, Keras' default, not installed (Keras would fail
to import), importing keras_vit takes JAX or PyTorch and says which in a
warning: `keras_vit.startup.choose_backend`.
"""

from keras_vit import startup

__version__ = "0.1.0"

if not startup.started_as_command():  # the command imports the API after parsing its flags: see keras_vit.cli
    startup.choose_backend(startup.log)  # before Keras is first imported
    from keras_vit.api import *  # noqa: E402,F401,F403
    from keras_vit.api import __all__  # noqa: E402,F401
