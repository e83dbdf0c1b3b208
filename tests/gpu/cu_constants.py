"""The constants of a CUDA source, read from the source itself, for the CPU models of the
kernels (tests/gpu/*_model.py): what a model checks is then what the kernel declares, and a
change of a tile size, a ring depth or an arrival count in the .cu changes the model's run
(tests/kernel_models.sh shows one that makes it fail).

  constants(FILE)    {NAME: value} of every `constexpr` (file scope) and `#define NAME
                     number` of kernels/cuda/FILE, and of every `static constexpr` of a
                     struct as "STRUCT::NAME"; each value evaluated as C would (integer
                     division, shifts, names defined above it); one that depends on a
                     template parameter is left out
  mbar_counts(FILE)  {BARRIER: count} of every `mbar_init(BARRIER..., count)` in FILE

$SHLM_KERNELS_DIR names the directory read (default: this tree's kernels/cuda)."""
import ast
import operator
import os
import re

KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "kernels", "cuda")

COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
TRANSPARENT = re.compile(r'(?:\bnamespace(?:\s+\w+)?|\bextern\s*"C")\s*$')
STRUCT = re.compile(r"\bstruct\s+(\w+)\s*\{")
DECL = re.compile(r"\b(static\s+)?constexpr\s+(?:unsigned\s+)?(?:int|float|double|size_t|uint32_t|"
                  r"uint64_t|int64_t|long)\s+([^;]*);")
DEFINE = re.compile(r"^\s*#\s*define\s+(\w+)\s+([^\n]+)$", re.M)
MBAR_INIT = re.compile(r"\bmbar_init\(\s*(\w+)[^,]*,\s*([^)]+)\)")
CAST = re.compile(r"\(\s*(?:unsigned\s+)?(?:int|float|double|size_t|uint32_t|uint64_t|int64_t|long)\s*\)")
NUMBER = re.compile(r"\b(\d+\.\d*(?:[eE][-+]?\d+)?|\d*\.\d+(?:[eE][-+]?\d+)?|0[xX][0-9a-fA-F]+|\d+)"
                    r"([uUlLfF]*)\b")

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
       ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.Mod: operator.mod,
       ast.BitOr: operator.or_, ast.BitAnd: operator.and_}


def source(name):
    path = os.path.join(os.environ.get("SHLM_KERNELS_DIR", KERNELS), name)
    with open(path, encoding="utf-8") as fh:
        return COMMENT.sub(" ", fh.read())


def evaluate(expr, names):
    """EXPR (C) with NAMES: an int or a float, or None where a name is unknown"""
    expr = NUMBER.sub(lambda m: m.group(1), CAST.sub("", expr)).strip()
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return None

    def ev(n):
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)):
            return n.value
        if isinstance(n, ast.Name):
            if n.id not in names:
                raise KeyError(n.id)
            return names[n.id]
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -ev(n.operand)
        if isinstance(n, ast.BinOp):
            a, b = ev(n.left), ev(n.right)
            if isinstance(n.op, ast.Div):  # C: integer division truncates toward zero
                if isinstance(a, int) and isinstance(b, int):
                    return int(a / b) if a * b < 0 else a // b
                return a / b
            if type(n.op) in OPS:
                return OPS[type(n.op)](a, b)
        raise KeyError(ast.dump(n))

    try:
        return ev(tree)
    except (KeyError, ZeroDivisionError, TypeError):
        return None


def split_declarators(text):
    """'A = 1, B = (2, 3)' -> ['A = 1', 'B = (2, 3)']: commas outside parentheses"""
    out, depth, cur = [], 0, ""
    for c in text:
        depth += c in "(<"
        depth -= c in ")>"
        if c == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += c
    return out + [cur]


def constants(name):
    text = source(name)
    depth = [0] * (len(text) + 1)  # the brace depth at each position, namespaces and
    opened, last = [], 0             # extern "C" blocks not counted (they are file scope)
    for i, c in enumerate(text):
        depth[i + 1] = depth[i]
        if c == "{":
            scope = not TRANSPARENT.search(text[last:i])
            opened.append(scope)
            depth[i + 1] += scope
        elif c == "}" and opened:
            depth[i + 1] -= opened.pop()
        if c in "{};":
            last = i + 1
    structs = []  # (start, end, NAME) of each struct's body
    for m in STRUCT.finditer(text):
        i = m.end()
        while i < len(text) and depth[i + 1] >= depth[m.end()]:
            i += 1
        structs.append((m.end(), i, m.group(1)))
    found = {}
    events = [(m.start(), m) for m in DECL.finditer(text)] + [(m.start(), m) for m in DEFINE.finditer(text)]
    for pos, m in sorted(events, key=lambda e: e[0]):
        if m.re is DEFINE:
            value = evaluate(m.group(2), found)
            if value is not None:
                found[m.group(1)] = value
            continue
        struct = next((s for a, b, s in structs if a <= pos < b and depth[pos] == depth[a]), None)
        if struct is None and depth[pos] != 0:
            continue  # local to a function
        for decl in split_declarators(m.group(2)):
            lhs, eq, rhs = decl.partition("=")
            if not eq or not re.fullmatch(r"\s*\w+\s*", lhs):
                continue
            key = lhs.strip()
            local = dict(found)
            if struct:  # a member sees its struct's earlier members by their plain names
                local.update({k.split("::", 1)[1]: v for k, v in found.items()
                              if k.startswith(struct + "::")})
            value = evaluate(rhs, local)
            if value is not None:
                found[f"{struct}::{key}" if struct else key] = value
    return found


def mbar_counts(name):
    text = source(name)
    counts = {}
    for m in MBAR_INIT.finditer(text):
        value = evaluate(m.group(2), constants(name))
        if value is not None:
            counts[m.group(1)] = value
    return counts
