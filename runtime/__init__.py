"""specexport runtime: load a bundle and run speculative decoding (numpy, onnxruntime, tokenizers)."""
