"""Per-call dispatch of a model's `nn.Linear` layers to a linear path, inside leapdecode's own forwards only.

Paths: "hf" (the layer's own forward, `F.linear`), "native" (an fp32 weight packed once into column panels for a
small C kernel: kernels.native_linear), "native-q" (the same product from the weight's exact 4- or 8-bit codes,
where it has them: the same bits from a sixth or a third of the bytes), "packed" (a copy of the weight packed once into oneDNN's blocked layout:
`F.linear` re-lays out a plain weight on every call), "packed-pad" (the same, fewer than four rows zero-padded to
four), and for a greedy output head "argmax-bf16-packed" / "argmax-bf16-linear" (ArgmaxOutputHead). Under the "auto"
setting each layer follows the plan calibration measured for its shape, dtype and row count on this host.
"""

from __future__ import annotations

import contextlib
import contextvars
import types
import weakref

import torch
import torch.nn.functional as F

from . import native_linear
from .argmax_head import ArgmaxOutputHead, fast_bf16
from .ops import notice, packed_matmul, packed_ops, reorder
from .settings import _settings

LINEAR_PATHS = ("hf", "native-q", "native", "packed", "packed-pad")  # in order of preference at equal speed
NATIVE_PATHS = ("native", "native-q")  # the panel kernel's paths: the same bits for a row whatever the row count
ARGMAX_PATHS = ("argmax-bf16-packed", "argmax-bf16-linear")
MODES = ("auto",) + LINEAR_PATHS
ARGMAX_MODES = ("auto", "on", "off")
DECODERS = ("fused", "hf")
ATTENTIONS = ("native", "sdpa")
ELEMENTWISE = ("native", "torch")
STEPS = ("native", "layers")
NATIVE_WEIGHTS = ("codes", "fp32")

_mode = contextvars.ContextVar("leapdecode_packed_linear", default=False)
_epoch = [0]  # bumped by forget_routes
_argmax_only = contextvars.ContextVar("leapdecode_argmax_only", default=False)
# module -> {kind: ((weight pointer, version), derived weight)}; outside the module so that copies of a model don't
# carry it, and rebuilt when the weight is replaced or changed in place
_derived: "weakref.WeakKeyDictionary[torch.nn.Linear, dict]" = weakref.WeakKeyDictionary()
_DERIVED_KIND = {
    "native": "native",
    "native-q": "native-q",
    "packed": "packed",
    "packed-pad": "packed",
    "argmax-bf16-packed": "argmax-packed",
    "argmax-bf16-linear": "argmax-linear",
}


def settings() -> dict:
    return dict(_settings)


def configure(
    linear: str | None = None,
    argmax_head: str | None = None,
    decoder: str | None = None,
    attention: str | None = None,
    elementwise: str | None = None,
    step: str | None = None,
    native_weights: str | None = None,
    cache_dir=None,
) -> dict:
    """Set the process's kernel choice (None leaves a setting as is); returns the previous settings.
    linear: "auto" | "hf" | "packed" | "packed-pad"; argmax_head: "auto" | "on" | "off"; decoder: "fused" | "hf";
    attention: "native" | "sdpa"; elementwise: "native" | "torch"; step: "native" | "layers"; native_weights:
    "codes" | "fp32" (whether "native-q" may keep a weight as its exact codes)."""
    for name, value, allowed in (
        ("linear kernels", linear, MODES),
        ("argmax_head", argmax_head, ARGMAX_MODES),
        ("decoder", decoder, DECODERS),
        ("attention", attention, ATTENTIONS),
        ("elementwise", elementwise, ELEMENTWISE),
        ("step", step, STEPS),
        ("native_weights", native_weights, NATIVE_WEIGHTS),
    ):
        if value is not None and value not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    previous = settings()
    forget_routes()
    for key, value in (
        ("linear", linear),
        ("argmax_head", argmax_head),
        ("decoder", decoder),
        ("attention", attention),
        ("elementwise", elementwise),
        ("step", step),
        ("native_weights", native_weights),
        ("cache_dir", cache_dir),
    ):
        if value is not None:
            _settings[key] = value
    return previous


@contextlib.contextmanager
def configured(**kwargs):
    """configure(...) for the duration of a with block."""
    previous = configure(**kwargs)
    try:
        yield
    finally:
        _settings.update(previous)
        forget_routes()


def route_linear(model: torch.nn.Module) -> None:
    """Let the model's CPU fp32/bf16 nn.Linear layers run on the chosen linear path while `packed_kernels` is on
    (install.install_packed_linear also gives them their calibrated plans)."""
    for module in model.modules():
        if type(module) is torch.nn.Linear and not hasattr(module, "_leapdecode_linear") and _eligible(module.weight):
            module._leapdecode_linear = module.forward
            module.forward = types.MethodType(_dispatch, module)


def route_argmax_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """Let the model's fp32 output head (without bias, already routed) run as an ArgmaxOutputHead under
    `argmax_logits(True)`; returns the head, or None where it may not."""
    head = model.get_output_embeddings()
    if not (hasattr(head, "_leapdecode_linear") and head.weight.dtype == torch.float32 and head.bias is None):
        return None
    if _settings["argmax_head"] == "off":
        return None
    head._leapdecode_argmax = True
    return head


def installed(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if hasattr(m, "_leapdecode_linear")]


def packed_kernels(on: bool | str):
    """While on, nn.Linear layers given install_packed_linear run on their chosen path: True follows the settings
    (calibrated "auto" by default), a mode name forces it, False keeps the layers' own forward."""
    if isinstance(on, str) and on not in MODES:
        raise ValueError(f"linear kernels must be one of {', '.join(MODES)}, got {on!r}")
    return _switched(_mode, on)


def kernels_on() -> bool:
    """Whether leapdecode's kernels are switched on here (inside a forward that asked for them)."""
    return bool(_mode.get())


def argmax_logits(on: bool):
    """While on, an output head given install_argmax_head may return logits faithful only in their argmax."""
    return _switched(_argmax_only, on)


def chosen_path(module: torch.nn.Linear, rows: int, mode: bool | str = True, argmax_only: bool = False) -> str:
    """The path a call of `rows` rows takes through `module` under `mode`."""
    if not mode or not hasattr(module, "_leapdecode_linear"):
        return "hf"
    if mode is True:
        mode = _settings["linear"]
    head, wanted = argmax_only and getattr(module, "_leapdecode_argmax", False), _settings["argmax_head"]
    native = getattr(module, "_leapdecode_native_rows", None)  # whole_step.check's outcome for the model
    if mode == "auto" and native is not None and native(rows) and not (head and wanted == "on"):
        return "native-q"  # from the weight's codes where it has them, else its fp32 panels (_route)
    plan = getattr(module, "_leapdecode_plan", None)
    linear = (plan.linear(rows) if plan is not None else "hf") if mode == "auto" else mode
    if head:
        if wanted == "on":
            return plan.argmax_variant(rows) if plan is not None and plan.has_argmax else default_argmax_path()
        if wanted == "auto" and mode != "hf" and plan is not None and plan.has_argmax:
            best = plan.argmax(rows)
            if best in ARGMAX_PATHS:
                return best
    return linear


def default_argmax_path() -> str:
    return "argmax-bf16-packed" if fast_bf16() and packed_ops(torch.bfloat16) else "argmax-bf16-linear"


def prepare(path: str, weight: torch.Tensor):
    """What `path` computes with, derived from a weight (packing it, or a bf16 copy for the argmax head)."""
    if path == "hf":
        return weight
    if path == "native":
        return native_linear.Panels(weight)
    if path == "native-q":  # None where the weight has no exact codes (its calls take "native")
        return native_linear.coded_form(weight) if _settings["native_weights"] == "codes" else None
    if path in ("packed", "packed-pad"):
        return reorder(weight)
    return ArgmaxOutputHead(weight, packed=path == "argmax-bf16-packed")


def apply(path: str, state, flat: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """flat [rows, in] through `path` with its prepared state."""
    if path == "hf":
        return F.linear(flat, state, bias)
    if path in ("packed", "packed-pad"):
        return packed_matmul(flat, state, bias, pad=path == "packed-pad")
    if path in NATIVE_PATHS:
        return state(flat, bias)
    return state(flat)


def available(path: str, dtype: torch.dtype) -> bool:
    if path == "hf" or path == "argmax-bf16-linear":
        return True
    if path == "argmax-bf16-packed":
        return packed_ops(torch.bfloat16)
    if path in NATIVE_PATHS:
        return dtype == torch.float32 and native_linear.library() is not None
    return packed_ops(dtype)


def drop_derived(module: torch.nn.Linear, keep: set[str]) -> None:
    """Free derived weights of paths the module's plan never takes (a packed copy is as large as the weight)."""
    entries = _derived.get(module, {})  # the codes (or their absence) are kept: finding them reads the whole weight
    for kind in [k for k in entries if k not in {_DERIVED_KIND.get(p) for p in keep} | {"native-q"}]:
        del entries[kind]


def _eligible(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype in (torch.float32, torch.bfloat16)


def _weight_key(weight: torch.Tensor) -> tuple[int, int]:
    """What tells a weight replaced or changed in place (inference tensors have no version counter)."""
    return weight.data_ptr(), (0 if weight.is_inference() else weight._version)


def coded_bits(module: torch.nn.Linear) -> int | None:
    """4, 8 or 6 where the module's weight has exact codes for "native-q" (found once per weight and kept), else None.
    A part of a fused layer (kernels.fused_decoder, whose fused layer holds the codes) is not encoded."""
    if not available("native-q", module.weight.dtype) or getattr(module, "_leapdecode_fused_part", False):
        return None
    state = _state(module, "native-q")
    return None if state is None else state.bits


def _state(module: torch.nn.Linear, path: str):
    kind = _DERIVED_KIND[path]
    key = (*_weight_key(module.weight), _settings["native_weights"])
    entries = _derived.setdefault(module, {})
    if kind not in entries or entries[kind][0] != key:
        entries[kind] = (key, prepare(path, module.weight.detach()))
    return entries[kind][1]


def _dispatch(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    mode = _mode.get()
    if not mode:
        return self._leapdecode_linear(x)
    path, state = _route(self, x.numel() // max(1, x.shape[-1]), mode, _argmax_only.get())
    if state is None:
        return self._leapdecode_linear(x)
    try:
        flat = apply(path, state, x if x.dim() == 2 else x.reshape(-1, x.shape[-1]), self._parameters["bias"])
    except Exception as e:  # noqa: BLE001 - a private op failing on this input: F.linear from now on, never a crash
        self._leapdecode_broken = True
        forget_routes()
        notice(f"the {path} linear kernel failed ({type(e).__name__}); this layer uses F.linear from now on")
        return self._leapdecode_linear(x)
    return flat if x.dim() == 2 else flat.reshape(*x.shape[:-1], flat.shape[-1])


def _route(module: torch.nn.Linear, rows: int, mode, argmax_only: bool) -> tuple[str, object]:
    """(chosen_path, its prepared state, or None for the layer's own forward), remembered per module and row count
    until the settings, the module's plan or its weight change: a decode step calls every linear layer, and working
    the choice out again each time costs more than a small layer's product."""
    epoch, routes = module.__dict__.get("_leapdecode_routes", (None, None))
    if epoch != _epoch[0]:
        routes = {}
        module.__dict__["_leapdecode_routes"] = (_epoch[0], routes)
    weight = module._parameters["weight"]
    key = (mode, argmax_only, rows)
    route = routes.get(key)
    if route is None or route[2] != _weight_key(weight):
        path = chosen_path(module, rows, mode, argmax_only)
        usable = path != "hf" and not module.__dict__.get("_leapdecode_broken") and available(path, weight.dtype)
        state = _state(module, path) if usable else None
        if path == "native-q" and state is None and usable:  # no exact codes: the fp32 panels, same bits
            path, state = "native", _state(module, "native")
        route = routes[key] = (path, state, _weight_key(weight))
    return route[0], route[1]


def prepare_routes(module: torch.nn.Linear, rows: tuple[int, ...]) -> None:
    """Derive now what calls of these row counts take (codes, panels, a packed or bf16 copy), so that no call pays for
    it: a row count first met mid-request (a verification of 7 rows, a 13-token prompt) would stall that request for
    as long as the derivation takes (a second or more for a 0.5B model's bf16 output head)."""
    for r in rows:
        _route(module, r, True, False)
        if getattr(module, "_leapdecode_argmax", False):
            _route(module, r, True, True)


def forget_routes() -> None:
    """The settings or a plan changed: every module works its paths out again on its next call."""
    _epoch[0] += 1


@contextlib.contextmanager
def _switched(switch: contextvars.ContextVar, on):
    token = switch.set(on)
    try:
        yield
    finally:
        switch.reset(token)
