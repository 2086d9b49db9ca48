"""Where a piece of Python state is changed, from the source: statements that mutate an attribute
(directly, through a local alias or a helper's parameter), and attributes assigned host tensors.

The state snapshot says what changed between steps (audit/scan/snapshot/state.py); these lookups name the
line a person has to change. Parsing is shared with lookup.py (cached per file).
"""

from __future__ import annotations

import ast
import re

from audit.detectors.host import names as _host_names
from audit.detectors.source import loop_aliases, scopes
from audit.detectors.host.factories import follows_default
from audit.detectors.source.lookup import _FUNC, HOST_FACTORIES, _on_cpu, tree
from audit.detectors.source.assign_targets import written
from audit.scan.sources.ast_nodes import all_nodes

MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "add", "discard",
            "setdefault", "popitem", "appendleft", "extendleft", "popleft", "sort", "reverse", "rotate",
            "move_to_end", "difference_update", "intersection_update", "symmetric_difference_update",
            "fromlist", "frombytes", "set",  # set: a ContextVar (threading.Event too)
            "put", "put_nowait"}  # a queue (queue.SimpleQueue has no attributes to watch); not get: dict.get reads
# functions (stdlib and alike) that change their first argument in place: `heapq.heappush(self.heap, x)`,
# `bisect.insort(self.sorted, x)`, `random.shuffle(self.order)` (called as `mod.f(...)` or imported `f(...)`)
IN_PLACE_FUNCS = {"heappush", "heappop", "heapify", "heapreplace", "heappushpop", "insort", "insort_left",
                  "insort_right", "shuffle"}
# functions and methods that write into a buffer passed as their first or second argument:
# `struct.pack_into(fmt, self.header, 0, n)`, `self.sock.recv_into(self.buf)`, `np.copyto(self.lens, v)`
INTO_FUNCS = {"pack_into", "readinto", "readinto1", "recv_into", "recvfrom_into", "copyto"}
# methods that only read: a call of one on an object is not how the step changed it
READERS = {"qsize", "empty", "full", "copy", "keys", "values", "items", "count", "index", "is_set", "locked",
           "__len__", "__repr__", "get_lock", "get_obj", "acquire", "release"}  # locks: not the change


def _setattr_names(call: ast.Call, attr: str) -> bool:
    """`object.__setattr__(obj, "attr", v)` (how a frozen dataclass or a class with its own
    __setattr__ is written past) or `obj.__setattr__("attr", v)` / `super().__setattr__("attr", v)`."""
    return any(len(call.args) > i + 1 and isinstance(call.args[i], ast.Constant) and call.args[i].value == attr
               for i in (0, 1))


def _names_attr(node, attr: str) -> bool:
    """Whether an attribute-name expression can name `attr`: the string itself, an f-string whose fixed
    parts fit (`f"n_{phase}"` names `n_decode`), or a name computed otherwise (request options applied by
    name: `setattr(self.opts, name, value)`)."""
    if isinstance(node, ast.Constant):
        return node.value == attr
    if isinstance(node, ast.JoinedStr):
        pat = "".join(re.escape(str(v.value)) if isinstance(v, ast.Constant) else ".*" for v in node.values)
        return re.fullmatch(pat, attr) is not None
    return True


def _instance_dict(n) -> bool:
    """`x.__dict__` or `vars(x)`: an object's attributes as a dict (`self.__dict__["n"] = v` sets one)."""
    return (isinstance(n, ast.Attribute) and n.attr == "__dict__") or (
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "vars" and len(n.args) == 1)


def _dict_update(call: ast.Call, attr: str) -> bool:
    """`x.__dict__.update(...)` / `vars(x).update(...)` that may set `attr`."""
    f = call.func
    if not (isinstance(f, ast.Attribute) and f.attr in ("update", "setdefault", "__setitem__") and _instance_dict(f.value)):
        return False
    if f.attr != "update" and call.args:
        return _names_attr(call.args[0], attr)
    return bool(call.args) or any(k.arg in (attr, None) for k in call.keywords)


def mutation_sites(filename: str, attr: str, lines: tuple[int, int] | None = None,
                   global_name: bool = False, named: bool = False) -> list[tuple[int, str]]:
    """(line, function) of statements that mutate `<x>.attr` (or global `attr`) in a file or a span.

    Catches `x.attr = / += ...`, `x.attr[k][j] = ...`, `x.attr.append(...)` and friends, `del x.attr`,
    `setattr(x, "attr", ...)` (or a computed name that can be "attr"), `x.__dict__["attr"] = ...`, `next(x.attr)`, `heapq.heappush(x.attr, ...)` and the other in-place
    functions of IN_PLACE_FUNCS, a mutating method passed uncalled (`stack.callback(x.attr.append, v)`),
    With `named`, a `setattr` counts only when it spells the name: a generic field copier's
    `setattr(result, field_name, v)` can set any attribute, weaker evidence than a statement that names it.
    And the same through an alias of the attribute's value:
    a local bound from it (`req = self.requests[rid]; req["recent"][i] = t`) or the parameter of a
    function of the file that is called with it (`bump(self.stats, key)` -> `stats[key] += n`)."""
    t = tree(filename)
    if t is None:
        return []

    def rooted(n) -> bool:
        return _rooted(n, attr, global_name)

    params = _param_aliases(t, rooted)
    out = []
    for func in all_nodes(t):
        if not isinstance(func, _FUNC) or (lines and not (lines[0] <= func.lineno <= lines[1])):
            continue
        aliases = set(params.get(id(func), ())) | {
            x.id for node in ast.walk(func) if isinstance(node, ast.Assign) and rooted(node.value) and _same_object(node.value)
            for x in node.targets if isinstance(x, ast.Name)} | loop_aliases.element_names(func, rooted)

        def target(n) -> bool:
            if not global_name and isinstance(n, ast.Subscript) and _instance_dict(n.value):
                return _names_attr(n.slice, attr)  # `self.__dict__["n_steps"] = ...`
            sub = isinstance(n, ast.Subscript)
            while isinstance(n, ast.Subscript):
                n = n.value
            if isinstance(n, ast.Name) and n.id in aliases:
                return sub  # `req[k] = v` writes into the object; `req = ...` only rebinds the name
            if global_name:
                return isinstance(n, ast.Name) and n.id == attr
            return isinstance(n, ast.Attribute) and n.attr == attr

        for node in ast.walk(func):
            hit = False
            if isinstance(node, (ast.Assign, ast.Delete, ast.AugAssign, ast.AnnAssign)):
                hit = any(target(x) for x in written(node))  # `self.n, self.last = n + 1, t` included
            elif isinstance(node, ast.Call) and _func_name(node) in IN_PLACE_FUNCS and node.args:
                a = node.args[0]
                hit = target(a) or rooted(a) and _same_object(a) or (isinstance(a, ast.Name) and a.id in aliases)
            elif isinstance(node, ast.Call) and _func_name(node) in INTO_FUNCS:
                hit = any(target(a) or rooted(a) and _same_object(a) or (isinstance(a, ast.Name) and a.id in aliases)
                          for a in node.args[:2])
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__setattr__":
                hit = _setattr_names(node, attr)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                v = node.func.value
                hit = node.func.attr in MUTATORS and (target(v) or (isinstance(v, ast.Name) and v.id in aliases)) \
                    or not global_name and _dict_update(node, attr)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "next":
                hit = bool(node.args) and target(node.args[0])  # advancing an iterator / itertools.count
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
                hit = len(node.args) > 1 and (_names_attr(node.args[1], attr) if not (global_name or named) else
                                              isinstance(node.args[1], ast.Constant) and node.args[1].value == attr)
            if not hit and isinstance(node, ast.Call):
                hit = any(_bound_mutator(a, target, aliases) for a in node.args + [k.value for k in node.keywords])
            if hit:
                out.append((node.lineno, getattr(func, "name", "<lambda>")))
    return sorted(set(out))


def _bound_mutator(a, target, aliases) -> bool:
    """A mutating method handed over uncalled, to run later or elsewhere: `stack.callback(self.done.append,
    rid)`, `map(self.seen.add, ids)`, `functools.partial(self.free.insert, 0)`. The call that runs it is in
    the stdlib (contextlib, map, partial), whose frames never host a finding, so the user's line is the one
    that passes the bound method: the state changes because of it."""
    if not (isinstance(a, ast.Attribute) and a.attr in MUTATORS):
        return False
    v = a.value
    return target(v) or (isinstance(v, ast.Name) and v.id in aliases)


def _rooted(n, attr: str, global_name: bool = False) -> bool:
    """An expression whose value lives under `<x>.attr` (or the global `attr`)."""
    while isinstance(n, (ast.Subscript, ast.Call)) or (isinstance(n, ast.Attribute) and n.attr != attr):
        n = n.func.value if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) else \
            n.value if not isinstance(n, ast.Call) else None
        if n is None:
            return False
    if global_name:
        return isinstance(n, ast.Name) and n.id == attr
    return isinstance(n, ast.Attribute) and n.attr == attr


def _func_name(call: ast.Call) -> str | None:
    """`f` of `f(...)` and of `mod.f(...)`."""
    return call.func.id if isinstance(call.func, ast.Name) else \
        call.func.attr if isinstance(call.func, ast.Attribute) else None


def _stores(node) -> list[ast.Attribute]:
    """The attribute targets an assignment statement writes (`a.b = v`, `a.b += v`, `a.b, a.c = v, w`)."""
    return [t for t in written(node) if isinstance(t, ast.Attribute) and not isinstance(node, ast.Delete)]


def method_calls(filename: str, holder: str, global_name: bool = False) -> list[tuple[int, str, str]]:
    """(line, function, method) of method calls on the object held in `<x>.holder` (or global `holder`),
    directly, through a subscript or a local alias: `self.out.put_nowait(t)`, `q = self.out; q.put(t)`;
    and of stores to its attributes (`self.done.value += 1` on a multiprocessing.Value); `next(self.it)` as a
    call of `__next__`.

    How user code changes an object whose class is not its own (a queue.Queue): the statements that
    mutate it are in the stdlib, which never hosts a finding; the call into it is the user's line."""
    t = tree(filename)
    if t is None:
        return []
    out = []
    for func in all_nodes(t):
        if not isinstance(func, _FUNC):
            continue
        aliases = {x.id for node in ast.walk(func) if isinstance(node, ast.Assign) and
                   _rooted(node.value, holder, global_name) and _same_object(node.value)
                   for x in node.targets if isinstance(x, ast.Name)}
        for node in ast.walk(func):
            for t in _stores(node):  # `self.counter.value += 1`: a property of the object set from outside
                if (_rooted(t.value, holder, global_name) and _same_object(t.value)) or \
                        (isinstance(t.value, ast.Name) and t.value.id in aliases):
                    out.append((node.lineno, getattr(func, "name", "<lambda>"), t.attr))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "next" and node.args:
                v = node.args[0]  # `next(self.it)` calls the iterator's `__next__` (a DataLoader's iterator)
                if (_rooted(v, holder, global_name) and _same_object(v)) or (isinstance(v, ast.Name) and v.id in aliases):
                    out.append((node.lineno, getattr(func, "name", "<lambda>"), "__next__"))
                continue
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)) or node.func.attr in READERS:
                continue
            v = node.func.value
            if (_rooted(v, holder, global_name) and _same_object(v)) or (isinstance(v, ast.Name) and v.id in aliases):
                out.append((node.lineno, getattr(func, "name", "<lambda>"), node.func.attr))
    return sorted(set(out))


def subscript_key(filename: str, line: int, attr: str, global_name: bool = False):
    """The constant key a statement on `line` indexes `<x>.attr` with (`self.stats["active"].append(n)`
    -> "active"), else None: which element of a container that line changes."""
    t = tree(filename)
    for node in all_nodes(t) if t is not None else ():
        if isinstance(node, ast.Subscript) and node.lineno == line and const_key(node.slice) is not _NO_KEY:
            v = node.value
            if (isinstance(v, ast.Name) and v.id == attr) if global_name else \
                    (isinstance(v, ast.Attribute) and v.attr == attr):
                return const_key(node.slice)
    return None


_NO_KEY = object()


def const_key(node):
    """The value of a constant subscript (`["active"]`, `[0]`, `[-1]`: a negative index is a unary minus), else
    _NO_KEY."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and type(node.operand.value) is int:
        return -node.operand.value
    return node.value if isinstance(node, ast.Constant) else _NO_KEY


def stores_element(filename: str, line: int, attr: str, key, global_name: bool = False) -> bool:
    """Whether a statement on `line` rebinds the element `<x>.attr[key]` itself (`d["hist"] = ...`), not
    something inside it (`d["hist"][0] = v` writes into the tensor it holds)."""
    t = tree(filename)
    for node in all_nodes(t) if t is not None else ():
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.lineno == line:
            for x in written(node):
                if isinstance(x, ast.Subscript) and const_key(x.slice) == key and \
                        ((isinstance(x.value, ast.Name) and x.value.id == attr) if global_name else
                         (isinstance(x.value, ast.Attribute) and x.value.attr == attr)):
                    return True
    return False


def _same_object(value) -> bool:
    """An assigned expression that hands back the stored object itself (`x.attr`, `x.attr[k]`,
    `x.attr.get(k)`), not a new one (`x.attr.copy()`, `len(x.attr)`)."""
    while isinstance(value, (ast.Subscript, ast.Attribute, ast.Call)):
        if isinstance(value, ast.Call):
            if not (isinstance(value.func, ast.Attribute) and value.func.attr in ("get", "setdefault")):
                return False
            value = value.func.value
        else:
            value = value.value
    return True


def _param_aliases(t: ast.Module, rooted) -> dict[int, list[str]]:
    """id(function def) -> its parameters that some call in the file passes a value rooted at the
    attribute (by position or keyword; methods called as `self.f(...)` skip `self`)."""
    defs: dict[str, list] = {}
    for f in all_nodes(t):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defs.setdefault(f.name, []).append(f)
    out: dict[int, list[str]] = {}
    for call in all_nodes(t):
        if not isinstance(call, ast.Call):
            continue
        for f in defs.get(_func_name(call), ()):
            names = [a.arg for a in f.args.posonlyargs + f.args.args]
            if isinstance(call.func, ast.Attribute) and names and names[0] in ("self", "cls"):
                names = names[1:]
            hits = [names[i] for i, a in enumerate(call.args) if i < len(names) and rooted(a)]
            hits += [k.arg for k in call.keywords if k.arg and rooted(k.value)]
            if hits:
                out.setdefault(id(f), []).extend(hits)
    return out


def assigns_host_tensor(filename: str, attr: str, lines: tuple[int, int] | None = None) -> bool:
    """Whether the source (or a span of it) assigns `<x>.attr` a tensor it names the CPU for:
    `torch.zeros(..., device="cpu")`, `t.cpu()`, `t.to("cpu")` (a host tensor on a GPU too); the
    device may be a name assigned only the CPU (`device=self.host`)."""
    t = tree(filename)
    if t is None:
        return False
    for node in all_nodes(t):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or (lines and not lines[0] <= node.lineno <= lines[1]):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if not any(isinstance(x, ast.Attribute) and x.attr == attr for x in targets) or node.value is None:
            continue
        for call in ast.walk(node.value):
            if not isinstance(call, ast.Call):
                continue
            if isinstance(call.func, ast.Attribute) and call.func.attr == "cpu":
                return True
            if isinstance(call.func, ast.Attribute) and call.func.attr == "to" and call.args[:1] and \
                    scopes.names_cpu(t, call.args[0], call.lineno):
                return True
            if any(k.arg == "device" and scopes.names_cpu(t, k.value, call.lineno) for k in call.keywords):
                return True
    return False


# what makes an attribute in host memory: the factories, and host data made a tensor (`torch.tensor(lens, device="cpu")`,
# `torch.from_numpy(fb)`: always the CPU, sharing the array's memory)
_ATTR_FACTORIES = HOST_FACTORIES + ("tensor", "as_tensor", "from_numpy", "frombuffer")


def _host_factory(filename: str, call) -> bool:
    """`torch.<factory>(...)` naming no device or the CPU; `torch.<f>_like(t, ...)` or `t.new_<f>(...)` naming the
    CPU (without a device they follow t's: `torch.zeros_like(self.dev, device="cpu")` is a host pool)."""
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
        return False
    if call.func.attr in _FOLLOWING:
        return any(k.arg == "device" and _on_cpu(filename, k.value) for k in call.keywords)
    named = [k for k in call.keywords if k.arg == "device"]
    return (call.func.attr in _ATTR_FACTORIES and isinstance(call.func.value, ast.Name) and call.func.value.id == "torch"
            and all(_on_cpu(filename, k.value) for k in named) and (named or not follows_default(filename, call.lineno)))


_FOLLOWING = frozenset({"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "new_empty",
                        "new_zeros", "new_ones", "new_full"})


_SAME_DEVICE = frozenset({"float", "double", "half", "bfloat16", "long", "int", "bool", "contiguous", "clone",
                          "abs", "neg", "exp", "sqrt", "t", "mul", "add", "sub", "div", "view", "reshape",
                          "share_memory_", "zero_", "fill_", "normal_", "uniform_"})  # in place: same memory


def _host_computed(filename: str, node, _depth: int = 0) -> bool:
    """Host factories combined only with constants and ops that keep the device (arithmetic, a cast):
    the result stays in host memory. A name, an attribute or `.to(...)` could bring a device in: no."""
    if _host_factory(filename, node) or isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Name) and _depth < 4:  # a module-level number, a local bound to a host computation
        vals = _host_names.bound_values(filename, node)
        return bool(vals) and all(_host_computed(filename, v, _depth + 1) for v in vals)
    if isinstance(node, ast.UnaryOp):
        return _host_computed(filename, node.operand, _depth)
    if isinstance(node, ast.BinOp):
        sides = (node.left, node.right)
        return all(_host_computed(filename, x, _depth) for x in sides) and not all(isinstance(x, ast.Constant) for x in sides)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _SAME_DEVICE:
        args = list(node.args) + [k.value for k in node.keywords]
        return _host_computed(filename, node.func.value, _depth) and all(
            isinstance(a, ast.Constant) or (isinstance(a, ast.Attribute) and getattr(a.value, "id", "") == "torch")
            for a in args)  # `.view(2, 3)`, `.to`-free casts; `torch.float32` as an argument
    return False


def device_attr(filename: str, attr: str, lines: tuple[int, int] | None = None) -> bool:
    """The source (or a span) makes `<x>.attr` on a device, at every assignment: a call naming a device that
    is not the CPU (`torch.zeros(n, device=device)`), or ending in `.to(D)` / `.cuda()` with D not the CPU."""
    t = tree(filename)
    seen = False
    for node in all_nodes(t) if t is not None else ():
        if not isinstance(node, ast.Assign) or (lines and not lines[0] <= node.lineno <= lines[1]) \
                or not any(isinstance(x, ast.Attribute) and x.attr == attr for x in node.targets):
            continue
        v = node.value
        while isinstance(v, ast.BinOp):  # `torch.randn(n, device=device) * 0.1`
            v = v.left
        if not isinstance(v, ast.Call):
            return False
        named = [k.value for k in v.keywords if k.arg == "device"]
        if getattr(v.func, "attr", "") in ("to", "cuda") and v.args and not named:
            named = [v.args[0]]
        if not (getattr(v.func, "attr", "") == "cuda" or (named and not _on_cpu(filename, named[0]))):
            return False
        seen = True
    return seen


def _field_factory(value):
    """The expression a dataclass (or attrs) field's factory returns: `field(default_factory=lambda:
    torch.ones(1))`, `attr.ib(factory=lambda: ...)`. Each instance gets that tensor as its attribute, made
    where the class declares the field, not in `__init__`, so the field is how the class makes it."""
    if not (isinstance(value, ast.Call) and _func_name(value) in ("field", "ib", "attrib")):
        return None
    for k in value.keywords:
        if k.arg in ("default_factory", "factory") and isinstance(k.value, ast.Lambda):
            return k.value.body
    return None
