"""The model registry: uploaded ONNX models, checked, described and stored by content."""
