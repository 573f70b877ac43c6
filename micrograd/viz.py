"""Draw a ``Value`` graph with graphviz, as in the micrograd notebooks."""
from micrograd.engine import topological_order


def draw_dot(root, format='svg', rankdir='LR'):
    """A ``graphviz.Digraph`` of every node below ``root``: data, grad and op."""
    try:
        import graphviz
    except ImportError:
        raise ImportError(
            "draw_dot needs the graphviz Python package: pip install 'micrograd-compiler[viz]' "
            "(and the Graphviz 'dot' program, e.g. apt-get install graphviz, to render)") from None
    dot = graphviz.Digraph(format=format, graph_attr={'rankdir': rankdir})
    for node in topological_order([root]):
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
