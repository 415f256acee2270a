"""A small ONNX graph builder: named values in, nodes and initializers out.

Hand-building the graphs (rather than tracing PyTorch) gives exact control over what the runtime
and TensorRT see: the KV-cache contract, the op set per TensorRT version, and where argmax happens.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17  # the newest opset TensorRT 10.3 (JetPack 6) parses fully; LayerNormalization needs >= 17
MS_DOMAIN = "com.microsoft"

NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.bool_): TensorProto.BOOL,
}


class GraphBuilder:
    """Accumulates nodes, initializers and I/O; every helper returns the name of its output."""

    def __init__(self, name: str, float_dtype=np.float32) -> None:
        self.name = name
        self.float_dtype = np.dtype(float_dtype)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._ids = itertools.count()
        self._consts: dict[tuple, str] = {}
        self.uses_ms_domain = False

    def fresh(self, hint: str) -> str:
        return f"{hint}_{next(self._ids)}"

    def input(self, name: str, dtype: np.dtype, shape: list) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, NP_TO_ONNX[np.dtype(dtype)], shape))
        return name

    def output(self, value: str, name: str, dtype: np.dtype, shape: list) -> str:
        if value != name:
            self.op("Identity", [value], name=name)
        self.outputs.append(helper.make_tensor_value_info(name, NP_TO_ONNX[np.dtype(dtype)], shape))
        return name

    def weight(self, name: str, array: np.ndarray, dtype: np.dtype | None = None) -> str:
        array = np.ascontiguousarray(array.astype(dtype or self.float_dtype, copy=False))
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def const(self, values, dtype=np.int64) -> str:
        array = np.asarray(values, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            self._consts[key] = self.weight(self.fresh("const"), array, dtype=array.dtype)
        return self._consts[key]

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, name: str | None = None,
           domain: str = "", **attrs) -> str | list[str]:
        outs = [name] if name and n_out == 1 else [self.fresh(op_type.lower()) for _ in range(n_out)]
        if domain == MS_DOMAIN:
            self.uses_ms_domain = True
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.fresh(op_type),
                                           domain=domain or None, **attrs))
        return outs[0] if n_out == 1 else outs

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        opsets = [helper.make_opsetid("", OPSET)]
        if self.uses_ms_domain:
            opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
        model = helper.make_model(graph, opset_imports=opsets, producer_name="specexport")
        model.ir_version = 8  # readable by onnxruntime >= 1.14 and TensorRT 10.x
        return model


def save_model(model: onnx.ModelProto, path: Path) -> list[Path]:
    """Write `path` with its weights in one external-data file beside it; returns the files written."""
    data_name = path.name + ".data"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data_name, size_threshold=1024)
    files = [path]
    if (path.parent / data_name).exists():
        files.append(path.parent / data_name)
    return files
