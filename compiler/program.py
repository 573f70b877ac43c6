"""The compiler's IR: a flat list of ops over dense integer slots.

Slot layout: inputs ``[0, n_inputs)``, then parameters (in ``params`` order,
unless a pass permuted them: ``param_order``), then constants, then one slot
per computed value. Every op writes one slot (or one contiguous block,
for the lifted ops of ``compiler/vectorize.py``) from slots written earlier.
The first ``n_grad_ops`` ops are the loss's cone, the ones ``backward`` walks;
the rest compute extra ``outputs`` only.
"""
from dataclasses import dataclass, field


@dataclass(eq=False, slots=True)
class Op:
    """``out = name(args...)``; ``k`` is the exponent of ``**``."""
    name: str
    out: int
    args: tuple
    k: float = None

    @property
    def reads(self):
        return self.args

    @property
    def writes(self):
        return (self.out,)

    def __str__(self):
        args = ', '.join(f'%{a}' for a in self.args)
        if self.k is not None:
            args += f', {self.k!r}'
        return f'%{self.out} = {self.name}({args})'


@dataclass(eq=False)
class Program:
    n_slots: int
    n_inputs: int
    n_params: int
    constants: dict          # slot -> float
    ops: list
    n_grad_ops: int
    loss: int
    outputs: tuple
    passes: tuple = field(default=())
    slot_map: list = None    # after a renumbering pass: old slot -> new slot (None: eliminated)
    param_order: tuple = None   # the slot of each parameter, in ``params`` order (None: in order)

    @property
    def param_start(self):
        return self.n_inputs

    @property
    def param_end(self):
        return self.n_inputs + self.n_params

    @property
    def param_slots(self):
        """The slot of each parameter, in ``params`` order: a permutation of
        ``[param_start, param_end)``."""
        return self.param_order or range(self.param_start, self.param_end)

    def __str__(self):
        lines = [f'program: {self.n_slots} slots, {len(self.ops)} ops'
                 + (f' (passes: {", ".join(self.passes)})' if self.passes else ''),
                 f'  inputs  %0..%{self.n_inputs - 1}' if self.n_inputs else '  inputs  none',
                 f'  params  %{self.param_start}..%{self.param_end - 1}' if self.n_params else '  params  none']
        for slot, value in self.constants.items():
            lines.append(f'  const   %{slot} = {value!r}')
        for i, op in enumerate(self.ops):
            if i == self.n_grad_ops:
                lines.append('  -- outputs only (not differentiated) --')
            lines.append(f'  {op}')
        lines.append(f'  loss    %{self.loss}')
        if self.outputs:
            lines.append(f'  outputs {", ".join(f"%{s}" for s in self.outputs)}')
        return '\n'.join(lines)

