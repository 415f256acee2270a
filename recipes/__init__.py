"""Recipes shipped as data: model settings and TensorRT targets."""
