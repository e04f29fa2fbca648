"""The model: its sizes (`variants`), its `Architecture`, the Keras graph, the `VisionTransformer` class."""
