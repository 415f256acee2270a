"""specexport exporter: cut a causal LM into speculative-decoding pieces and export them."""
