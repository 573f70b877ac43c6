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
import zipfile

import numpy as np

from compiler.files import atomic_write

FORMAT = 1


class WeightsError(ValueError):
    """A weights file cannot be read, or belongs to another model."""


def save(path, model, metadata=None):
    arrays = {'format': np.array(FORMAT), 'params': model.params(),
              'param_labels': np.array(model.param_labels, dtype=str),
              'graph_hash': np.array(model.module.graph_hash),
              'optimizer': np.array(model.module.optimizer),
              'optimizer_state': model.optimizer_state()}
    for key, value in (metadata or {}).items():
        arrays[f'meta_{key}'] = np.asarray(value)
    # through a file object: np.savez given a name would append '.npz'
    with atomic_write(path) as f:
        np.savez(f, **arrays)


def read(path):
    """The arrays of a weights file, as a dict, or a ``WeightsError`` saying
    what is wrong with it."""
    try:
        saved = np.load(path, allow_pickle=False)
        if not isinstance(saved, np.lib.npyio.NpzFile):
            raise WeightsError(f"{path}: a single .npy array, not a weights file (.npz)")
        with saved:
            arrays = {key: saved[key] for key in saved.files}
    except WeightsError:
        raise
    except FileNotFoundError:
        raise WeightsError(f"{path}: no such file") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise WeightsError(f"{path}: not a readable weights file ({type(e).__name__}: {e})") from None
    missing = [k for k in ('format', 'params', 'graph_hash') if k not in arrays]
    if missing:
        raise WeightsError(f"{path}: not a weights file written by save_weights (no {', '.join(missing)})")
    if arrays['format'].shape != () or int(arrays['format']) != FORMAT:
        raise WeightsError(f"{path}: weights format {arrays['format']!r}, this version reads {FORMAT}")
    return arrays


def load(path, model):
    """Set ``model``'s parameters (and optimizer state, when the file has the
    same optimizer's) from ``path``; on any error nothing changes."""
    arrays = read(path)
    params = arrays['params']
    if str(arrays['graph_hash']) != model.module.graph_hash:
        raise WeightsError(f"{path} holds the weights of another graph ({params.size} parameters; "
                           f"this one has {model.n_params})")
    if params.dtype != np.float64 or params.shape != (model.n_params,):
        raise WeightsError(f"{path}: params must be float64 [{model.n_params}], got {params.dtype} {params.shape}")
    bad = np.flatnonzero(~np.isfinite(params))
    if bad.size:
        raise WeightsError(f"{path}: params[{bad[0]}] is not finite ({params[bad[0]]!r})")
    state = arrays.get('optimizer_state')
    same_optimizer = ('optimizer' in arrays and str(arrays['optimizer']) == model.module.optimizer
                      and state is not None and state.shape == (model.module.state_size,))
    if same_optimizer and not np.isfinite(state).all():
        raise WeightsError(f"{path}: the optimizer state is not finite")
    model.set_params(params)
    if same_optimizer:
        model.set_optimizer_state(state)
