"""A compiled model's weights on disk: one ``.npz`` file.

Arrays (numpy's ``.npz``, readable with ``numpy.load(path)`` alone):

- ``format``: this layout's version (1);
- ``params``: float64 ``[n_params]``, in the order of the ``params`` list
  given to ``compile`` (for ``micrograd.nn.MLP``: layer by layer, neuron by
  neuron, each neuron's weights in input order, then its bias);
- ``param_labels``: the ``label`` of each parameter's ``Value`` ('' where none);
- ``graph_hash``: names the graph the weights belong to;
- ``optimizer``, ``optimizer_state``: the compiled optimizer's name and state
  (its step count, then its vectors in ``params`` order);
- ``meta_<name>``: whatever the caller added (e.g. ``meta_layer_sizes``).
"""
import numpy as np

from compiler.files import atomic_write

FORMAT = 1
ZIP_MAGIC, NPY_MAGIC = b'PK\x03\x04', b'\x93NUMPY'     # how .npz and .npy files begin
# The vectors after the step count t in each optimizer's state (``optimizer``
# is the module's name for it); plain SGD (momentum 0) keeps t alone.
STATE_VECTORS = {'none': (), 'SGD': ('momentum buffer',),
                 'Adam': ('first moment m', 'second moment v'),
                 'AdamW': ('first moment m', 'second moment v')}
SECOND_MOMENT = 'second moment v'


class WeightsError(ValueError):
    """A weights file cannot be read, or belongs to another model; or an
    optimizer state that would poison training."""


def save(path, model, metadata=None):
    """Write ``model``'s weights to ``path``; ``metadata`` values must be what
    ``numpy.load`` reads back without pickle (numbers, strings, arrays of
    them): anything else is refused before a byte is written."""
    arrays = {'format': np.array(FORMAT), 'params': model.params(),
              'param_labels': np.array(model.param_labels, dtype=str),
              'graph_hash': np.array(model.module.graph_hash),
              'optimizer': np.array(model.module.optimizer),
              'optimizer_state': model.optimizer_state()}
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"save_weights(): metadata keys must be non-empty strings, not {key!r}")
        try:
            array = np.asarray(value)
        except (TypeError, ValueError) as e:
            array, problem = None, str(e)
        if array is None or array.dtype.kind in 'OV':
            raise TypeError(f"save_weights(): metadata[{key!r}] is a {type(value).__name__}: only numbers, "
                            f"strings and (nested lists or arrays of) them load without pickle; "
                            f"store it as a JSON string instead")
        arrays[f'meta_{key}'] = array
    # through a file object: np.savez given a name would append '.npz'
    with atomic_write(path) as f:
        np.savez(f, **arrays)


def _open(path):
    """The arrays of the ``.npz`` at ``path``, or a one-line ``WeightsError``."""
    not_ours = f"{path}: not a weights file written by save_weights"
    try:
        with open(path, 'rb') as f:
            start = f.read(len(NPY_MAGIC))
    except FileNotFoundError:
        raise WeightsError(f"{path}: no such file") from None
    except OSError as e:        # a folder, unreadable
        raise WeightsError(f"cannot read {path}: {e.strerror or e}") from None
    if not start:
        raise WeightsError(f"{path}: not a readable weights file: it is empty")
    if start == NPY_MAGIC:
        raise WeightsError(f"{not_ours}: it holds a single array (.npy), not the .npz that "
                           f"save_weights writes")
    if not start.startswith(ZIP_MAGIC):
        raise WeightsError(f"{not_ours}: it is neither an .npz nor an .npy file")
    try:
        with np.load(path, allow_pickle=False) as saved:
            return {key: saved[key] for key in saved.files}
    # A damaged file makes zipfile and numpy raise many things (BadZipFile,
    # ValueError, NotImplementedError for a compression method, RuntimeError
    # for "encrypted", struct.error...): each means the same here.
    except Exception as e:  # noqa: BLE001
        message = ' '.join(str(e).split())
        raise WeightsError(f"{path}: not a readable weights file ({type(e).__name__}: {message})") from None


def read(path):
    """The arrays of a weights file, as a dict, or a one-line ``WeightsError``
    saying what is wrong with it: everything that can be checked without the
    model (format, float64 finite parameters, a valid optimizer state)."""
    arrays = _open(path)
    missing = [k for k in ('format', 'params', 'graph_hash') if k not in arrays]
    if missing:
        raise WeightsError(f"{path}: not a weights file written by save_weights (no {', '.join(missing)})")
    if arrays['format'].shape != () or arrays['format'].dtype.kind not in 'iu' or int(arrays['format']) != FORMAT:
        raise WeightsError(f"{path}: weights format {arrays['format']!r}, this version reads {FORMAT}")
    params = arrays['params']
    if params.dtype != np.float64 or params.ndim != 1:
        raise WeightsError(f"{path}: {params.dtype} parameters of shape {params.shape}; "
                           f"they must be a float64 vector")
    bad = np.flatnonzero(~np.isfinite(params))
    if bad.size:
        raise WeightsError(f"{path}: {bad.size} of its parameters are not finite "
                           f"(parameter {bad[0]} is {params[bad[0]]})")
    if 'optimizer_state' in arrays:
        optimizer = arrays.get('optimizer', np.array('none'))
        if optimizer.shape != () or optimizer.dtype.kind != 'U' or str(optimizer) not in STATE_VECTORS:
            raise WeightsError(f"{path}: optimizer is {optimizer!r}, not one of {', '.join(STATE_VECTORS)}")
        check_state(arrays['optimizer_state'], str(optimizer), params.size, f"{path}: its optimizer state")
    return arrays


def check_state(state, optimizer, n_params, what):
    """Raise ``WeightsError`` (``what``, then the field) unless ``state`` is a
    state ``optimizer`` (a module's name for it) can continue from: a numeric
    vector of its length, all finite, the step count t a whole number >= 0,
    second moments >= 0. Anything else makes the next step NaN."""
    names = STATE_VECTORS[optimizer]
    state = np.asarray(state)
    if state.dtype.kind not in 'fiu' or state.ndim != 1:
        raise WeightsError(f"{what} must be a vector of numbers, got {state.dtype} of shape {state.shape}")
    sizes = {1 + len(names) * n_params} | ({1} if optimizer == 'SGD' else set())   # SGD without momentum: t
    if state.size not in sizes:
        raise WeightsError(f"{what} has {state.size} numbers; {optimizer}'s for {n_params} parameters has "
                           f"{' or '.join(map(str, sorted(sizes)))} (t, then "
                           f"{', '.join(names) or 'nothing'})")

    def field(i):
        return 'the step count t' if i == 0 else f"the {names[(i - 1) // n_params]} of parameter {(i - 1) % n_params}"

    values = state.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise WeightsError(f"{what} is not finite: {field(bad[0])} is {values[bad[0]]}")
    t = values[0]
    if t < 0 or t != int(t):
        raise WeightsError(f"{what}: the step count t must be a whole number >= 0, not {t!r}")
    if SECOND_MOMENT in names:
        v = values[1 + n_params:]
        negative = np.flatnonzero(v < 0)
        if negative.size:
            raise WeightsError(f"{what}: {field(1 + n_params + negative[0])} is {v[negative[0]]!r}; "
                               f"second moments are sums of squares, never negative")


def load(path, model):
    """Set ``model``'s parameters (and optimizer state, when the file has the
    same optimizer's, configured alike) from ``path``; on any error nothing changes."""
    arrays = read(path)
    params = arrays['params']
    if str(arrays['graph_hash']) != model.module.graph_hash:
        raise WeightsError(f"{path} holds the weights of another graph ({params.size} parameters; "
                           f"this one has {model.n_params})")
    if params.shape != (model.n_params,):
        raise WeightsError(f"{path}: params must be float64 [{model.n_params}], got {params.dtype} {params.shape}")
    state = arrays.get('optimizer_state')
    # Another optimizer's state, or SGD's with momentum for SGD without it
    # (or the reverse), does not apply: the parameters alone are loaded.
    same_optimizer = (state is not None and str(arrays.get('optimizer', 'none')) == model.module.optimizer
                      and state.shape == (model.module.state_size,))
    model.set_params(params)
    if same_optimizer:
        model.set_optimizer_state(state)
