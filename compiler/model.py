"""``CompiledModel``: the Python face of one compiled graph; ``load`` makes
one from an exported folder."""
import os

import numpy as np

from compiler import weights as weights_file
from compiler.build.process import usable_cores
from compiler.constants import MAX_THREADS
from compiler.export import check_module, export, open_folder
from compiler.ir import features


class CompiledModel:
    """A traced graph running as C. See ``compiler.compile``.

    The hot calls (``set_input``, ``forward``, ``backward``, ``zero_grad``,
    ``update``, ``step``, ``backward_step``) are the generated ``nn`` module's own
    ``METH_FASTCALL`` functions, bound directly; the rest wrap them to return
    numpy arrays. Every vector is in the order of the lists given to
    ``compile`` (a pass may store the parameters otherwise; the module
    translates at its boundary).
    """

    def __init__(self, module, program, build, timings, source, optimizer=None, params=None,
                 input_labels=None, param_labels=None, input_grads=False):
        self.module = module
        self.program = program
        self.build = build
        self.timings = timings      # seconds: trace, passes, codegen, compile, load
        self.source = source
        self.optimizer = optimizer
        self.has_input_grads = input_grads
        self._param_values = params     # the Values given as params (for write_back), or None
        self.input_labels = list(input_labels) if input_labels is not None else [''] * program.n_inputs
        self.param_labels = list(param_labels) if param_labels is not None else [''] * program.n_params
        self.features = _features(module, program)
        self.set_input = module.set_input
        self.forward = module.forward
        self.backward = module.backward
        self.zero_grad = module.zero_grad
        self.update = module.update
        self.step = module.step
        # (a module exported before backward_step existed: the two calls)
        self.backward_step = getattr(module, 'backward_step', None) or self._backward_then_step

    def _backward_then_step(self, lr=None, zero_grad=False):
        self.backward()
        self.step(lr, zero_grad=zero_grad)

    @property
    def n_inputs(self):
        return self.module.n_inputs

    @property
    def n_params(self):
        return self.module.n_params

    @property
    def n_outputs(self):
        return self.module.n_outputs

    @property
    def threads(self):
        """Threads ``train_batch`` and ``predict`` may use (the results are the
        same bits for any number)."""
        return self.module.get_threads()

    @threads.setter
    def threads(self, n):
        """``n`` threads (1 to ``MAX_THREADS``); ``None``: the default, as
        ``compile(threads=None)`` chooses it. Waits while another thread uses
        the model."""
        self.module.set_threads(resolve_threads(n))

    def _read(self, read, n):
        out = np.empty(n)
        read(out)
        return out

    def outputs(self):
        """The values of ``outputs`` after the last ``forward``."""
        return self._read(self.module.read_outputs, self.n_outputs)

    def params(self):
        """The parameters (float64, ``params`` order)."""
        return self._read(self.module.read_params, self.n_params)

    def grads(self):
        """The parameters' gradients (float64, ``params`` order)."""
        return self._read(self.module.read_grads, self.n_params)

    def input_grads(self):
        """d loss / d input, accumulated over ``backward()`` calls since the
        last ``zero_grad()`` (float64, ``inputs`` order; zeros unless
        compiled with ``input_grads=True``)."""
        return self._read(self.module.read_input_grads, self.n_inputs)

    def optimizer_state(self):
        """The optimizer's state: its step count, then its vectors (``params`` order)."""
        return self._read(self.module.read_state, self.module.state_size)

    def set_optimizer_state(self, state):
        """Set the optimizer's state (as ``optimizer_state()`` lays it out);
        ``WeightsError`` (a ValueError) names a field that would make the
        next step NaN: a step count that is not a whole number >= 0, a
        negative second moment."""
        try:
            values = np.asarray(state)
        except (TypeError, ValueError) as e:
            raise TypeError(f"set_optimizer_state(): state must be a sequence of numbers ({e})") from None
        weights_file.check_state(values, self.module.optimizer, self.n_params,
                                 'set_optimizer_state(): the optimizer state')
        if values.shape != (self.module.state_size,):   # SGD's other configuration (with or without momentum)
            raise weights_file.WeightsError(f"set_optimizer_state(): the optimizer state must have "
                                            f"{self.module.state_size} numbers, got {values.size}")
        self.module.write_state(np.ascontiguousarray(values, dtype=np.float64))

    def set_params(self, values):
        """Set the parameters (in ``params`` order) from a sequence or array of
        finite real numbers (converted to float64)."""
        self.module.write_params(_vector(values, self.n_params, 'set_params'))

    def train_batch(self, X, lr=None):
        """One step on the mean gradient over the rows of ``X`` (any 2-D
        array-like of real numbers ``[rows, n_inputs]``: a slice, a list of
        lists; copied to a C-contiguous float64 array when it is not one);
        returns the mean loss. ``lr`` overrides the compiled optimizer's
        learning rate (without an optimizer, it is required: plain SGD)."""
        return self.module.train_batch(_rows(X, 'train_batch', self.n_inputs), lr)

    def predict(self, X):
        """Forward only on every row of ``X`` (any 2-D array-like of real
        numbers ``[rows, n_inputs]``, or ``[rows, len(features)]`` holding only
        the inputs the outputs depend on; copied to a C-contiguous float64
        array when it is not one, e.g. ``X[:, :784]``): float64 ``[rows, n_outputs]``."""
        X = _rows(X, 'predict', self.n_inputs)
        out = np.empty((X.shape[0], self.n_outputs))
        self.module.predict(X, out)
        return out

    def write_back(self):
        """Copy the compiled parameters and their gradients into the ``Value``
        objects given as ``params``, so the interpreter (and ``draw_dot``)
        see the trained model."""
        if self._param_values is None:
            raise RuntimeError("write_back(): this model was loaded without its Values "
                               "(compiler.load); use params() instead")
        for v, p, g in zip(self._param_values, self.params().tolist(), self.grads().tolist()):
            v.data, v.grad = p, g

    def export(self, folder):
        """Write ``folder`` with ``nn.c``, ``nn.abi3.so`` (current weights built
        in) and ``nn.json``, so that ``sys.path.insert(0, folder); import nn``
        works anywhere (compiler/export.py)."""
        return export(self, folder)

    def save_weights(self, path, metadata=None):
        """Write the parameters (``params`` order), their labels and the
        optimizer's state to an ``.npz`` file (compiler/weights.py), with
        ``metadata`` (a dict of arrays) as ``meta_<key>``."""
        weights_file.save(path, self, metadata)

    def load_weights(self, path):
        """Read parameters (and optimizer state) written by ``save_weights``
        for this model; refuses a file of another model, changing nothing."""
        weights_file.load(path, self)

    def summary(self):
        """A table of what was built: one line per vector op and per run of
        scalar ops (kind, shape, parameters, labels), then the totals, the
        compiler and the seconds of each stage of ``compile()``."""
        from compiler.summary import summary
        return summary(self)

    def draw(self, path):
        """The compiled program as a picture (vector ops and runs of scalar
        ops) at ``path`` (.png, .svg, .pdf; needs graphviz)."""
        from compiler.summary import draw
        return draw(self, path)

    def _repr_html_(self):
        """A notebook shows the summary as a table."""
        from compiler.summary import summary_html
        return summary_html(self)

    def _repr_svg_(self):
        """``draw``'s picture, or None (no Graphviz): the notebook shows another form."""
        from compiler.summary import picture
        return picture(self, 'svg')

    def _repr_png_(self):
        from compiler.summary import picture
        return picture(self, 'png')

    def __repr__(self):
        b = self.build
        family = b.toolchain.family if b and b.toolchain else 'loaded'
        return (f'<CompiledModel {self.n_inputs} inputs, {self.n_params} params, '
                f'{self.n_outputs} outputs; {family} {b.flags_text() if b else ""}>')


def load(folder, cc=None, threads=None):
    """A ``CompiledModel`` from an exported folder (no graph needed): the
    folder is checked, and rebuilt from ``nn.c`` if its shared object does
    not fit, by ``compiler.export.open_folder``; ``nn.json``'s sizes, features
    and labels must be the module's."""
    found = open_folder(folder, cc)
    check_module(folder, found.info, found.module)
    model = CompiledModel(found.module, None, found.build, {}, found.source,
                          input_labels=found.info['input_labels'], param_labels=found.info['param_labels'])
    model.export_info = found.info
    model.threads = resolve_threads(threads)
    return model


def _rows(X, func, n_inputs):
    """``X`` as a C-contiguous float64 2-D array (the same object when it is one)."""
    if isinstance(X, np.ndarray) and X.dtype == np.float64 and X.flags.c_contiguous and X.ndim == 2:
        return X
    try:
        rows = np.asarray(X)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{func}(): X must be a 2-D array of real numbers [rows, {n_inputs}] ({e})") from None
    if rows.ndim != 2 or rows.dtype.kind not in 'fiu':
        raise TypeError(f"{func}(): X must be a 2-D array of real numbers [rows, {n_inputs}], not "
                        f"{type(X).__name__}" + (f" of shape {rows.shape} and dtype {rows.dtype}"
                                                  if rows.dtype.kind != 'O' else ''))
    return np.ascontiguousarray(rows, dtype=np.float64)


def _features(module, program):
    """Positions (in ``inputs``) of the inputs the outputs depend on."""
    return features(program) if program is not None else list(module.features)


def _vector(values, n, func):
    """``values`` as a float64 vector of ``n`` finite reals, or a clear error."""
    try:
        values = np.asarray(values)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{func}(): values must be a sequence of {n} numbers ({e})") from None
    if values.dtype.kind not in 'fiu':
        raise TypeError(f"{func}(): values must be real numbers, got an array of dtype {values.dtype}")
    if values.shape != (n,):
        raise ValueError(f"{func}(): values must have shape ({n},), got {values.shape}")
    values = np.ascontiguousarray(values, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise ValueError(f"{func}(): values[{bad[0]}] is not finite ({values[bad[0]]!r})")
    return values


def resolve_threads(threads):
    """``threads``, else ``$MICROGRAD_THREADS``, else the cores this process
    may use, capped silently at ``MAX_THREADS``. An explicit number (an
    argument or the variable) above ``MAX_THREADS`` is an error."""
    if threads is None:
        env = os.environ.get('MICROGRAD_THREADS', '').strip()
        if not env:
            return max(1, min(usable_cores(), MAX_THREADS))
        try:
            threads = int(env)
        except ValueError:
            raise ValueError(f"MICROGRAD_THREADS must be a whole number of threads, not {env!r}") from None
        if threads < 1:
            raise ValueError(f"MICROGRAD_THREADS must be at least 1, not {env!r}")
        if threads > MAX_THREADS:
            raise ValueError(f"MICROGRAD_THREADS must be from 1 to {MAX_THREADS}, not {env!r}")
        return threads
    if isinstance(threads, bool) or not isinstance(threads, int):
        raise TypeError(f"threads must be an int, not {type(threads).__name__}")
    if not 1 <= threads <= MAX_THREADS:
        raise ValueError(f"threads must be from 1 to {MAX_THREADS}, got {threads}")
    return threads
