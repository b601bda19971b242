"""The vision node: image bytes -> visual tokens (SigLIP tower on torch, onnxruntime or a Hailo device)."""
