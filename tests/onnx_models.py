"""Small ONNX files written with onnx.helper, for importer tests."""

from pathlib import Path


def save_det_model(path: Path) -> Path:
    """A model whose only operator (Det) TVM's ONNX importer does not support."""
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("Det", ["x"], ["y"])
    graph = helper.make_graph(
        [node], "det", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])]
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path
