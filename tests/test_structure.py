"""The shape of the runtime: imports run down the floors (no circles, the runtime never imports the lab, only the
front imports api.py), a model named in `generate` loads once per process, and request settings are validated by one
rule wherever they enter."""

from __future__ import annotations

import ast
import pathlib

import pytest
from tiny_hf import make_tiny_hf_dir

import leapdecode
from leapdecode import RequestParams, generate
from leapdecode.engine import Engine
from leapdecode.errors import LeapDecodeError
from leapdecode.models import forget_models, resolve

SRC = pathlib.Path(leapdecode.__file__).parent.parent


def import_graph() -> dict[str, set[str]]:
    """Module -> the leapdecode modules it imports (anywhere in the file, lazy imports included)."""
    files = {}
    for path in SRC.rglob("leapdecode/**/*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        package = parts[-1] == "__init__"
        files[".".join(parts[:-1] if package else parts)] = (path, package)
    graph = {}
    for module, (path, package) in files.items():
        here = module.split(".") if package else module.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
                deps |= {f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names}
        graph[module] = {d for d in deps if d in files and d != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on.discard(component[-1])
            if len(component) > 1:
                found.append(component)

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_circles():
    assert cycles(import_graph()) == []


def test_cycle_finder_sees_a_planted_circle():
    graph = import_graph()
    graph["leapdecode.forward"] = graph["leapdecode.forward"] | {"leapdecode.runner"}  # runner imports forward
    assert any({"leapdecode.forward", "leapdecode.runner"} <= set(c) for c in cycles(graph))


def test_the_runtime_never_imports_the_lab_and_only_the_front_imports_api():
    graph = import_graph()
    assert graph["leapdecode.runner"] >= {"leapdecode.forward"}  # the parser sees imports at all
    upward = [
        (m, d)
        for m, deps in graph.items()
        for d in deps
        if d.startswith("leapdecode.lab") and not m.startswith("leapdecode.lab") and m != "leapdecode.cli"
    ]
    assert upward == []
    assert {m for m, deps in graph.items() if "leapdecode.api" in deps} <= {
        "leapdecode",
        "leapdecode.cli",
        "leapdecode.lab.bench.methods",
    }


def test_a_model_named_in_generate_loads_once(tmp_path, monkeypatch):
    directory = str(make_tiny_hf_dir(tmp_path / "tiny"))
    loads = []
    real = resolve.load_model
    monkeypatch.setattr(resolve, "load_model", lambda spec, dtype: loads.append(spec) or real(spec, dtype=dtype))
    forget_models()
    first = generate(directory, [5, 6, 7], max_new_tokens=4)
    second = generate(directory, [5, 6, 7], max_new_tokens=4)
    assert first.token_ids == second.token_ids and loads == [directory]
    generate(directory, [5, 6, 7], max_new_tokens=4, dtype="bfloat16")  # another dtype is another model
    assert len(loads) == 2
    forget_models()
    generate(directory, [5, 6, 7], max_new_tokens=4)
    assert len(loads) == 3


@pytest.mark.parametrize(
    "options",
    [
        {"max_new_tokens": True},
        {"max_new_tokens": 0},
        {"temperature": float("nan")},
        {"top_k": 1.5},
        {"seed": "1"},
        {"stop": [""]},
        {"max_new_tokesn": 4},
    ],
)
def test_request_settings_follow_one_rule_in_generate_and_the_engine(tmp_path_factory, options):
    directory = str(make_tiny_hf_dir(tmp_path_factory.mktemp("rules") / "tiny"))
    with pytest.raises(LeapDecodeError) as in_params:
        RequestParams.of(**options)
    with pytest.raises(LeapDecodeError) as in_engine:
        Engine(directory).add_request([5, 6, 7], **options)
    assert str(in_engine.value) == str(in_params.value)
    if "stop" not in options:  # generate refuses stop strings on their own account
        with pytest.raises(LeapDecodeError) as in_generate:
            generate(directory, [5, 6, 7], **options)
        assert str(in_generate.value) == str(in_params.value)


def test_a_cancelled_request_finishes_as_abort(tmp_path):
    engine = Engine(str(make_tiny_hf_dir(tmp_path / "tiny")))
    outputs = []
    rid = engine.add_request([5, 6, 7], max_new_tokens=8, on_output=outputs.append)
    engine.step()
    engine.cancel(rid)
    assert outputs[-1].finished and outputs[-1].finish_reason == "abort"
    assert engine.metrics()["running"] == 0 and not engine.has_work
