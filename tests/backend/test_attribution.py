"""`memfit.backend.attribution.LayerTree`: resolving op names to layers (walks kept per scope)."""

from __future__ import annotations

from memfit.backend.attribution import LayerTree


def test_each_strip_policy_resolves_its_own_way_whatever_was_resolved_before():
    tree = LayerTree([("conv2d",), ("conv2d_1",)])
    name = "functional_1/conv2d_1/Relu"
    for _ in range(2):  # the second round reads what the first kept
        assert tree.resolve(name, True) == ("conv2d",)
        assert tree.resolve(name, False) == ("conv2d_1",)


def test_ops_under_one_parent_scope_resolve_to_their_own_layers():
    tree = LayerTree(
        [("box_head",), ("box_head", "conv2d_0"), ("class_head",), ("class_head", "conv2d_0")]
    )
    assert tree.resolve("model/box_head/conv2d_0/Conv2D") == ("box_head", "conv2d_0")
    assert tree.resolve("model/class_head/conv2d_0/Conv2D") == ("class_head", "conv2d_0")
    assert tree.resolve("model/box_head/conv2d_0/BiasAdd") == ("box_head", "conv2d_0")
    assert tree.resolve("model/box_head/Relu") == ("box_head",)
    assert tree.resolve("model/Relu") is None
    assert tree.resolve("Relu") is None
    assert tree.layer_of("StatefulPartitionedCall/model/class_head/conv2d_0/x") == (
        "class_head/conv2d_0"
    )
