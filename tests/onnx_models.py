"""Small ONNX files written with onnx.helper, for importer tests."""

from pathlib import Path


def save_det_model(path: Path) -> Path:
    """A model whose only operator (Det) TVM's ONNX importer does not support."""
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("Det", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def save_relu_model(path: Path, batch: int | str = "n") -> Path:
    """Relu over a (batch, 3, 8, 8) float input; a string batch leaves that dimension symbolic."""
    import onnx
    from onnx import TensorProto, helper

    shape = [batch, 3, 8, 8]
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path
