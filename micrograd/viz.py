"""Draw a ``Value`` graph with graphviz, as in the micrograd notebooks."""
from micrograd.engine import topological_order


# Graphviz lays out 2,000 values in about 2 s (5,000: 17 s; Intel Xeon); the graph of a real model
# (an MNIST MLP: 80k values, 190k edges) keeps ``dot`` busy for many minutes.
MAX_NODES = 2000


def draw_dot(root, format='svg', rankdir='LR', max_nodes=MAX_NODES):
    """A ``graphviz.Digraph`` of every node below ``root``: data, grad and op.

    Graphs of more than ``max_nodes`` values are refused (``ValueError``):
    draw a compiled model at the level of its layers instead, with
    ``compiler.compile(...).draw(path)``.
    """
    try:
        import graphviz
    except ImportError:
        raise ImportError(
            "draw_dot needs the graphviz Python package: pip install 'micrograd-compiler[viz]' "
            "(and the Graphviz 'dot' program, e.g. apt-get install graphviz, to render)") from None
    nodes = topological_order([root])
    if len(nodes) > max_nodes:
        raise ValueError(f"draw_dot: the graph has {len(nodes):,} values, more than Graphviz lays out in "
                         f"seconds (max_nodes={max_nodes:,}); draw the compiled model instead, layer by "
                         f"layer: compiler.compile(loss, ...).draw('model.svg') (or pass a larger max_nodes)")
    dot = graphviz.Digraph(format=format, graph_attr={'rankdir': rankdir})
    for node in nodes:
        uid = str(id(node))
        label = f"{node.label} | " if node.label else ""
        dot.node(uid, label=f"{{ {label}data {node.data:.4f} | grad {node.grad:.4f} }}", shape='record')
        if node._op:
            op = node._op if node._arg is None else f"{node._op}{node._arg:g}"
            dot.node(uid + node._op, label=op)
            dot.edge(uid + node._op, uid)
        for child in node._prev:
            dot.edge(str(id(child)), uid + node._op)
    return dot
