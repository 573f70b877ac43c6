"""``CompiledModel``: the Python face of one compiled graph."""
import numpy as np


class CompiledModel:
    """A traced graph running as C. See ``compiler.compile``.

    The hot calls (``set_input``, ``forward``, ``backward``, ``zero_grad``,
    ``update``) are the extension's own ``METH_FASTCALL`` functions, bound
    directly; the rest wrap them to return numpy arrays.
    """

    def __init__(self, module, program, build, timings):
        self.module = module
        self.program = program
        self.build = build
        self.timings = timings      # seconds: trace, passes, codegen, compile, load
        self.set_input = module.set_input
        self.forward = module.forward
        self.backward = module.backward
        self.zero_grad = module.zero_grad
        self.update = module.update

    @property
    def n_inputs(self):
        return self.program.n_inputs

    @property
    def n_params(self):
        return self.program.n_params

    @property
    def n_outputs(self):
        return len(self.program.outputs)

    def outputs(self):
        """The values of ``outputs`` after the last ``forward``."""
        out = np.empty(self.n_outputs)
        self.module.read_outputs(out)
        return out

    def params(self):
        out = np.empty(self.n_params)
        self.module.read_params(out)
        return out

    def grads(self):
        out = np.empty(self.n_params)
        self.module.read_grads(out)
        return out

    def set_params(self, values):
        """Set the parameters (in ``params`` order) from a sequence or float64 array."""
        values = np.asarray(values, dtype=np.float64)
        if values.shape != (self.n_params,):
            raise ValueError(f"params must have shape ({self.n_params},), got {values.shape}")
        self.module.write_params(np.ascontiguousarray(values))

    def train_batch(self, X, lr):
        """One SGD step on the mean gradient over the rows of ``X``; returns the mean loss.

        ``X`` is a C-contiguous float64 array ``[rows, n_inputs]``.
        """
        return self.module.train_batch(X, lr)

    def predict(self, X):
        """Forward only on every row of ``X``: float64 ``[rows, n_outputs]``."""
        rows = len(X) if hasattr(X, '__len__') else 0
        out = np.empty((rows, self.n_outputs))
        self.module.predict(X, out)
        return out

    def __repr__(self):
        b = self.build
        return (f'<CompiledModel {self.n_inputs} inputs, {self.n_params} params, '
                f'{self.n_outputs} outputs; {b.toolchain.family} {" ".join(b.flags)}>')
