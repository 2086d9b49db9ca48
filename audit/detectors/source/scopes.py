"""What a name in the source stands for: its assignments in the same function, class or module.

Device choices are often made once and stored (`self.host = torch.device("cpu")`,
`self.on_accelerator = device != "cpu"`) and only read in the step. To tell what such a read means
we look the name up where Python would: a local of the function, else a module global; `self.X`
in every method of the class that assigns it (bases defined in the same file included). Any
binding we cannot read (a parameter, a loop target, `+=`, tuple unpacking) leaves it unresolved.
These helpers are pure AST: they take a parsed module and a line in it.
"""

from __future__ import annotations

import ast
import functools

from audit.scan.sources.ast_nodes import all_nodes, nodes_of


_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_DEPTH = 3  # names resolved through names: a flag set from a flag set from a device test
DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "hpu", "npu")  # compared as strings: `if dev == "cuda"`
_DEVICE_FLAGS = ("is_cuda", "is_cpu", "is_mps", "is_xpu", "is_meta")


def _span(node, line: int) -> bool:
    return node.lineno <= line <= (node.end_lineno or node.lineno)


def owners(tree: ast.Module, line: int):
    """(innermost function, innermost class) whose source holds `line` (None where there is none)."""
    func = cls = None
    for n in nodes_of(tree, _FUNCS + (ast.ClassDef,)):
        if isinstance(n, _FUNCS) and _span(n, line) and (func is None or n.lineno >= func.lineno):
            func = n
        elif isinstance(n, ast.ClassDef) and _span(n, line) and (cls is None or n.lineno >= cls.lineno):
            cls = n
    return func, cls


@functools.lru_cache(maxsize=4096)
def own_nodes(scope) -> tuple:
    """The nodes of `scope`'s body, not descending into nested functions or classes (once per scope: a scan
    asks the same function's bindings for every name each traced op reads)."""
    out, stack = [], list(scope.body) if isinstance(scope.body, list) else [scope.body]
    while stack:
        n = stack.pop()
        out.append(n)
        if not isinstance(n, _FUNCS + (ast.ClassDef,)):
            stack.extend(ast.iter_child_nodes(n))
    return tuple(out)


_BINDS = (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor, ast.comprehension, ast.NamedExpr,
          ast.withitem)


@functools.lru_cache(maxsize=4096)
def _own_binds(scope) -> tuple:
    """The statements of `scope`'s own body that bind a name: all `_bindings` reads."""
    return tuple(n for n in own_nodes(scope) if isinstance(n, _BINDS))


def _bindings(nodes, hit) -> list | None:
    """Values of the plain assignments whose target satisfies `hit`, or None when some other
    binding of it exists (augmented, unpacked, a loop / with / walrus target)."""
    out = []
    for n in nodes:
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if hit(t):
                    out.append((n.value, n.lineno))
                elif isinstance(t, (ast.Tuple, ast.List)) and any(hit(x) for x in ast.walk(t)):
                    return None
        elif isinstance(n, ast.AnnAssign) and hit(n.target):
            if n.value is None:
                continue
            out.append((n.value, n.lineno))
        elif isinstance(n, (ast.AugAssign, ast.For, ast.AsyncFor, ast.comprehension, ast.NamedExpr)) and \
                any(hit(x) for x in ast.walk(n.target)):
            return None
        elif isinstance(n, ast.withitem) and n.optional_vars is not None and \
                any(hit(x) for x in ast.walk(n.optional_vars)):
            return None
    return out


def _params(func) -> set[str]:
    a = func.args
    return {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x is not None}


def _self_name(func) -> str | None:
    args = func.args.posonlyargs + func.args.args if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
    return args[0].arg if args else None


def _classes(tree: ast.Module, cls: ast.ClassDef) -> list[ast.ClassDef]:
    """`cls` and its bases defined in the same module (by name), nearest first."""
    by_name = {n.name: n for n in nodes_of(tree, ast.ClassDef)}
    out, todo = [], [cls]
    while todo:
        c = todo.pop(0)
        if c in out:
            continue
        out.append(c)
        todo += [by_name[b.id] for b in c.bases if isinstance(b, ast.Name) and b.id in by_name]
    return out


def _init_field(c: ast.ClassDef, attr: str) -> bool:
    """`attr: T = default` in the body of a `@dataclass` class, not `field(init=False)`: a parameter of the
    generated `__init__` (`Constraint(ids, "cuda")` sets it positionally), so the default is not its value."""
    deco = [ast.unparse(d.func if isinstance(d, ast.Call) else d).split(".")[-1] for d in c.decorator_list]
    if "dataclass" not in deco:
        return False
    for st in c.body:
        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.target.id == attr:
            v = st.value
            return not (isinstance(v, ast.Call) and any(k.arg == "init" and isinstance(k.value, ast.Constant)
                                                        and k.value.value is False for k in v.keywords))
    return False


def _field_default(v):
    """The `default=` of a dataclass `field(...)` call, else the value itself."""
    if isinstance(v, ast.Call) and ast.unparse(v.func).split(".")[-1] == "field":
        return next((k.value for k in v.keywords if k.arg == "default"), v)
    return v


def _attr_values(tree: ast.Module, cls: ast.ClassDef, attr: str) -> list | None:
    """Values assigned to `self.<attr>` in the methods of `cls` (else of its bases in this module)."""
    for c in _classes(tree, cls):
        if _init_field(c, attr):
            return None  # a dataclass field: its default is what callers leave out, any of them may pass another
        found = _bindings(c.body, lambda t: isinstance(t, ast.Name) and t.id == attr)  # a class attribute
        if found is None:
            return None
        found = [(_field_default(v), ln) for v, ln in found]  # `field(init=False, default="cpu")`: its default
        for m in (n for n in c.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            me = _self_name(m)
            got = _bindings(_own_binds(m), lambda t, me=me: isinstance(t, ast.Attribute) and t.attr == attr
                            and isinstance(t.value, ast.Name) and t.value.id == me)
            if got is None:
                return None
            found += got
        if found:
            return found
    return None


def values(tree: ast.Module, expr: ast.AST, line: int) -> list | None:
    """(value, line) of every assignment a read of `expr` (a name or `self.attr`) on `line` can
    see, or None when it cannot be resolved from the source."""
    func, cls = owners(tree, line)
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and func is not None \
            and cls is not None and expr.value.id == _self_name(func):
        return _attr_values(tree, cls, expr.attr)
    if not isinstance(expr, ast.Name):
        return None
    def hit(t):
        return isinstance(t, ast.Name) and t.id == expr.id
    if func is not None and not isinstance(func, ast.Lambda):
        if expr.id in _params(func):
            return None
        local = _bindings(_own_binds(func), hit)
        if local is None or local:
            return local
    return _bindings(_own_binds(tree), hit) or None


def resolves_all(tree: ast.Module, expr: ast.AST, line: int, pred, depth: int = _DEPTH) -> bool:
    """Whether `expr` is a name/`self.attr` whose every assignment satisfies `pred(tree, value, line)`."""
    vals = values(tree, expr, line) if depth > 0 else None
    return bool(vals) and all(pred(tree, v, ln, depth - 1) for v, ln in vals)


# ------------------------------------------------------------------ device literals and tests

def cpu_literal(n) -> bool:
    """"cpu" / "cpu:0", or torch.device("cpu") written in the source."""
    if isinstance(n, ast.Constant):
        return isinstance(n.value, str) and n.value.startswith("cpu")
    return isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", "")) == "device" and \
        bool(n.args) and cpu_literal(n.args[0])


def names_cpu(tree: ast.Module, n: ast.AST, line: int, depth: int = _DEPTH) -> bool:
    """A CPU device literal, or a name / `self.attr` every assignment of which is one
    (`self.host = torch.device("cpu")` then `.to(self.host)`)."""
    if isinstance(n, ast.Call) and _dotted(n.func) in ("torch.device", "device") and n.args and depth > 0:
        return names_cpu(tree, n.args[0], line, depth - 1)  # torch.device(HOST)
    if isinstance(n, ast.Attribute) and n.attr not in _COMPUTE_FIELDS and values(tree, n, line) is None:
        vals = field_values(tree, n.attr)  # `self.cfg.offload_device` with the default "cpu"
        return bool(vals) and all(cpu_literal(v) for v in vals)
    return cpu_literal(n) or resolves_all(tree, n, line, names_cpu, depth)


# A config field with one of these names is the compute device: its "cpu" default is what a launcher in
# another file overrides with the GPU (`Config(device=args.device)`), so the default says nothing.
_COMPUTE_FIELDS = frozenset({"device", "dev", "compute_device", "model_device", "default_device", "target_device",
                             "torch_device", "run_device", "main_device"})


def field_values(tree: ast.Module, attr: str) -> list | None:
    """Every value a config field `attr` can hold, read from the whole file: its defaults in class
    bodies (`offload_device: str = "cpu"` in a dataclass), every `x.attr = v` and every `attr=v` keyword
    of a call. None when no class declares it, one declares it without a default, or a call passes
    positional arguments to such a class (the field may be set positionally)."""
    classes, vals = set(), []
    for c in all_nodes(tree):
        if not isinstance(c, ast.ClassDef):
            continue
        for st in c.body:
            names = [st.target] if isinstance(st, ast.AnnAssign) else st.targets if isinstance(st, ast.Assign) else []
            if any(isinstance(t, ast.Name) and t.id == attr for t in names):
                if st.value is None:
                    return None
                classes.add(c.name)
                vals.append(st.value)
    if not classes:
        return None
    for n in all_nodes(tree):
        if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any(isinstance(t, ast.Attribute) and t.attr == attr for t in targets):
                vals.append(n.value if not isinstance(n, ast.AugAssign) else n)
        elif isinstance(n, ast.Call):
            if n.args and getattr(n.func, "id", getattr(n.func, "attr", None)) in classes:
                return None
            vals += [k.value for k in n.keywords if k.arg == attr or k.arg is None]
    return vals


def _dotted(n) -> str:
    return ast.unparse(n) if isinstance(n, (ast.Name, ast.Attribute)) else ""


def _device_str(n) -> bool:
    return isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.split(":")[0] in DEVICE_TYPES


def _device_value(n) -> bool:
    """An expression whose value is a device (or its type / index): `x.device`, `torch.device(...)`,
    a name called `device` / `*_device`, `str(...)` or `.type` / `.index` of one."""
    if isinstance(n, ast.Attribute):
        return n.attr == "device" or (n.attr in ("type", "index") and _device_value(n.value))
    if isinstance(n, ast.Name):
        return n.id in ("device", "dev") or n.id.endswith("_device")
    if isinstance(n, ast.Call):
        fn = _dotted(n.func)
        if fn in ("torch.device", "device") or fn.endswith(".get_device"):
            return True
        return fn == "str" and len(n.args) == 1 and _device_value(n.args[0])
    return False


def _backend_call(n) -> bool:
    """`torch.cuda.<anything>(...)` or `torch.<backend>.is_available()`."""
    if not isinstance(n, ast.Call):
        return False
    fn = _dotted(n.func)
    return fn.startswith("torch.cuda.") or (fn.startswith("torch.") and fn.endswith(".is_available"))


def _device_side(tree: ast.Module, n: ast.AST, line: int, depth: int = _DEPTH) -> bool:
    """One side of a comparison that makes it a device test: a device value, a device-type string,
    a backend query, or a name every assignment of which is a device value (`self.host =
    torch.device("cpu")`). A name assigned only a string is a constant, not a device choice."""
    if isinstance(n, (ast.Tuple, ast.List, ast.Set)):
        return bool(n.elts) and all(_device_str(e) for e in n.elts)
    return _device_value(n) or _device_str(n) or _backend_call(n) or \
        resolves_all(tree, n, line, lambda _t, v, _ln, _d: _device_value(v), depth)


def device_test(tree: ast.Module, test: ast.AST, line: int | None = None, depth: int = _DEPTH) -> bool:
    """Whether an `if` test asks which device the code runs on: a comparison of a device value or
    device-type string (`logits.device != torch.device("cpu")`, `dev.type == "cuda"`), `x.is_cuda`,
    a `torch.cuda.*` call, or a flag every assignment of which is such a test
    (`self.on_accelerator = device != "cpu"`). Tests on ordinary data are not."""
    line = getattr(test, "lineno", 0) if line is None else line
    if isinstance(test, ast.BoolOp):
        return any(device_test(tree, v, line, depth) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return device_test(tree, test.operand, line, depth)
    if isinstance(test, ast.Compare):
        if any(isinstance(c, ast.Constant) and c.value is None for c in test.comparators):
            return False  # `if device is None:` asks whether one was chosen, not which
        return any(_device_side(tree, s, line, depth) for s in [test.left, *test.comparators])
    if isinstance(test, ast.Attribute) and test.attr in _DEVICE_FLAGS:
        return True
    if _backend_call(test):
        return True
    if isinstance(test, ast.Call):  # a helper named for the device (`if is_cuda(x):`), or one of this file
        # whose every `return` is a device test (`def on_gpu(d): return torch.device(d).type == "cuda"`)
        return "cuda" in _dotted(test.func).rpartition(".")[2].lower() or \
            (depth > 0 and _helper_test(tree, test, depth - 1))
    if not isinstance(test, (ast.Name, ast.Attribute)):
        return False
    vals = values(tree, test, line) if depth > 0 else None
    if vals:
        return all(device_test(tree, v, ln, depth - 1) for v, ln in vals)
    return "cuda" in _dotted(test).rpartition(".")[2].lower()  # unresolved (a parameter): `if use_cuda:`


def _helper_test(tree: ast.Module, call: ast.Call, depth: int) -> bool:
    """Whether the function a call names (`on_gpu(...)`: a function of this file; `self.on_gpu(...)`: a method
    of a class of this file) returns a device test on every `return`, read from its source."""
    f = call.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) and \
        isinstance(f.value, ast.Name) and f.value.id in ("self", "cls") else None
    if name is None:
        return False
    scopes = tree.body if isinstance(f, ast.Name) else \
        [st for c in tree.body if isinstance(c, ast.ClassDef) for st in c.body]
    defs = [d for d in scopes if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) and d.name == name]
    rets = [r for d in defs for r in ast.walk(d) if isinstance(r, ast.Return)]
    return len(defs) == 1 and bool(rets) and all(
        r.value is not None and device_test(tree, r.value, r.lineno, depth) for r in rets)


def device_move(t: ast.Module, call: ast.AST, spelled: bool = False) -> bool:
    """A call that sends its receiver to a device: `.cuda()`, or `.to(d)` / `.to(device=d)` with `d` no CPU, no
    dtype (`torch.float16`) and no tensor it takes its device from (`x.to(y.cuda())`); with `spelled`, `d` must also
    read as a device (a name or attribute about a device, a "cuda" string)."""
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
        return False
    if call.func.attr == "cuda":
        return True
    if call.func.attr != "to":
        return False
    dev = next((k.value for k in call.keywords if k.arg == "device"), call.args[0] if call.args else None)
    if dev is None or isinstance(dev, ast.Call) and getattr(dev.func, "attr", "") in ("to", "cuda"):
        return False
    dotted = _dotted(dev) or ""
    if dotted.startswith("torch.") and dotted != "torch.device":
        return False  # `.to(torch.float16)`: a dtype
    if names_cpu(t, dev, call.lineno):
        return False
    text = ast.unparse(dev).lower()
    return not spelled or "device" in text or "cuda" in text
