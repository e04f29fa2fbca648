"""Using a trained model: inference, analysis, feature maps."""
