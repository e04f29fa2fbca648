"""Small helpers every part of keras_vit shares: whole-or-nothing files, Keras internals, shapes."""
