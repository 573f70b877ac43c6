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
        # where each parameter sits in the module's parameter block (a pass
        # may have permuted them): position in ``params`` -> offset
        self._offsets = np.asarray(program.param_slots, dtype=np.intp) - program.param_start
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
        """The parameters, in ``params`` order (float64)."""
        return self._in_params_order(self.module.read_params)

    def grads(self):
        """The parameters' gradients, in ``params`` order (float64)."""
        return self._in_params_order(self.module.read_grads)

    def _in_params_order(self, read):
        block = np.empty(self.n_params)
        read(block)
        return block[self._offsets]

    def set_params(self, values):
        """Set the parameters (in ``params`` order) from a sequence or array of
        finite real numbers (converted to float64)."""
        try:
            values = np.asarray(values)
        except (TypeError, ValueError) as e:
            raise TypeError(f"set_params(): values must be a sequence of {self.n_params} numbers ({e})") from None
        if values.dtype.kind not in 'fiu':
            raise TypeError(f"set_params(): values must be real numbers, got an array of dtype {values.dtype}")
        if values.shape != (self.n_params,):
            raise ValueError(f"set_params(): values must have shape ({self.n_params},), got {values.shape}")
        values = np.ascontiguousarray(values, dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise ValueError(f"set_params(): values[{bad[0]}] is not finite ({values[bad[0]]!r})")
        block = np.empty(self.n_params)
        block[self._offsets] = values
        self.module.write_params(block)

    def train_batch(self, X, lr):
        """One SGD step on the mean gradient over the rows of ``X``; returns the mean loss.

        ``X`` is a C-contiguous float64 array ``[rows, n_inputs]``.
        """
        return self.module.train_batch(X, lr)

    def predict(self, X):
        """Forward only on every row of ``X`` (a C-contiguous float64 array
        ``[rows, n_inputs]``): float64 ``[rows, n_outputs]``."""
        shape = getattr(X, 'shape', None)
        if not isinstance(shape, tuple) or len(shape) != 2:
            raise TypeError(f"predict(): X must be a 2-D float64 array [rows, {self.n_inputs}], "
                            f"not {type(X).__name__}" + (f" of shape {shape}" if shape is not None else ""))
        out = np.empty((shape[0], self.n_outputs))
        self.module.predict(X, out)
        return out

    def __repr__(self):
        b = self.build
        return (f'<CompiledModel {self.n_inputs} inputs, {self.n_params} params, '
                f'{self.n_outputs} outputs; {b.toolchain.family} {" ".join(b.flags)}>')
