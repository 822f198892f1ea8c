"""int8 weights for CPU decoding: torch's dynamic quantization of every linear layer (int8 weights per output
channel, activations quantized on the fly). A decode step is bound by reading the weights, and int8 reads a quarter
of fp32's bytes: for a draft model this trades a little acceptance for much cheaper draft tokens, and never changes
the output (the target verifies every token)."""

from __future__ import annotations

import warnings

import torch

from ..errors import LeapDecodeError

INT8 = "int8"
Q4 = "q4"  # weight-only int4 groups with an int8 head (models.weight_only): the packaged GGUF files' weights


def is_int8(dtype) -> bool:
    return isinstance(dtype, str) and dtype.lower() == INT8


def is_q4(dtype) -> bool:
    return isinstance(dtype, str) and dtype.lower() == Q4


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Replace the model's nn.Linear layers, in place, by dynamically quantized int8 ones (fp32 model expected)."""
    try:
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
    except ImportError as e:  # torch dropped its quantized tensors
        raise LeapDecodeError(f"int8 needs torch.ao.quantization's dynamic quantization, missing here: {e}") from None
    if "x86" in torch.backends.quantized.supported_engines:
        torch.backends.quantized.engine = "x86"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch 2.13 deprecates quantized tensors (still supported)
        return quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)


def dtype_name(model: torch.nn.Module) -> str:
    """'int8' or 'q4' for a model quantized here, else the dtype of its parameters ('float32', 'bfloat16', ...)."""
    from torch.ao.nn.quantized.dynamic import Linear as Int8Linear

    from .weight_only import has_q4_layers

    if any(isinstance(m, Int8Linear) for m in model.modules()):
        return INT8
    if has_q4_layers(model):
        return Q4
    return str(next(model.parameters()).dtype).removeprefix("torch.")
