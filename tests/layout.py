#!/usr/bin/env python3
"""The tree's floor plan, checked from the #include lines of the product's sources
(kernels/, io/, src/): folders are layers, and

  1. a file includes only headers of its own folder or of a LOWER layer (LAYERS below,
     lowest first); two folders of one layer (the model families) never include each
     other;
  2. no include circle between modules (a module is X.c/X.cc/X.cu with its X.h/X.cuh),
     inside a folder or across folders;
  3. a model family's folder (src/model/NAME/) is included from its own folder and from
     the registry (src/families/) only: the job, the run, checkpoints, generation and
     `plan` see a family through src/model/family.h.

usage: layout.py [ROOT]          checks the tree at ROOT (default: this file's ../)
       layout.py --self-test     plants an upward include and a circle in a copy of
                                 the tree and requires each to be reported
Exit 0 when the plan holds, 1 with one line per violation otherwise."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

# Lowest first. A folder not listed here fails the check (a new folder takes a place).
LAYERS = [
    ["kernels"],                     # the ops and comm tables, the check macros
    ["kernels/cpu", "kernels/cuda"],  # the compute backends behind ops.h
    ["kernels/comm"],                # the comm backends behind comm.h, the watchdog
    ["kernels/backends"],            # which compute backend pairs with which comm backend
    ["io"],                          # files on disk: formats, safe writes
    ["src/base"],                    # rng, shard arithmetic, signals, the start-up timeline
    ["src/tokenizer"],
    ["src/data"],                    # token files' loader, data prepare, chat templates
    ["src/engine"],                  # what the engine knows of a model, the plan, FSDP
    ["src/model"],                   # the family interface and what families share
    ["src/model/*"],                 # one folder per family
    ["src/families"],                # the registry: the only includer of a family
    ["src/job"],                     # the job's keys, its plan
    ["src/ckpt"],                    # checkpoints, the Hugging Face files they keep
    ["src/watch"],                   # the step line, metrics, exporter, telemetry
    ["src/run"],                     # set-up, the loop, validation, generation
    ["src/cli"],                     # the commands
]
PRODUCT = ("kernels", "io", "src")
SOURCE_EXT = (".c", ".cc", ".cu", ".h", ".cuh")
FAMILY_PREFIX = "src/model/"
REGISTRY = "src/families"

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(folder):
    for rank, names in enumerate(LAYERS):
        for n in names:
            if n == folder or (n.endswith("/*") and os.path.dirname(folder) == n[:-2]):
                return rank
    return None


def family_of(folder):
    """NAME for src/model/NAME (or below), else None."""
    if folder.startswith(FAMILY_PREFIX):
        return folder[len(FAMILY_PREFIX):].split("/")[0]
    return None


def sources(root):
    for top in PRODUCT:
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if f.endswith(SOURCE_EXT):
                    yield os.path.relpath(os.path.join(d, f), root)


def module(path):
    return os.path.splitext(path)[0]


def check(root):
    errors = []
    edges = {}  # module -> {module: "file:line"}
    files = set(sources(root))
    for f in sorted(files):
        folder = os.path.dirname(f)
        rank = layer_of(folder)
        if rank is None:
            errors.append(f"{f}: folder {folder}/ has no place in tests/layout.py's LAYERS")
            continue
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for m in INCLUDE.finditer(text):
            inc = m.group(1)
            if inc not in files:
                continue  # generated (shlm_config.h) or outside the product
            line = text.count("\n", 0, m.start()) + 1
            where = f"{f}:{line}"
            to = os.path.dirname(inc)
            to_rank = layer_of(to)
            fam_to = family_of(to)
            if to == folder:
                pass
            elif to_rank is None:
                errors.append(f"{where}: includes {inc}, whose folder has no layer")
            elif to_rank > rank:
                errors.append(f"{where}: {folder}/ includes {inc} of a higher layer ({to}/)")
            elif to_rank == rank:
                errors.append(f"{where}: {folder}/ and {to}/ are one layer and may not "
                              f"include each other ({inc})")
            if fam_to and family_of(folder) != fam_to and folder != REGISTRY:
                errors.append(f"{where}: includes {inc}: a model family is included only "
                              f"from its folder and from {REGISTRY}/ (use src/model/family.h)")
            a, b = module(f), module(inc)
            if a != b:
                edges.setdefault(a, {}).setdefault(b, where)
    errors += circles(edges)
    return errors


def circles(edges):
    """One message per include circle between modules (Tarjan's strongly connected
    components; each component of more than one module is a circle)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comp.sort()
                via = [edges[a][b] for a in comp for b in edges.get(a, {}) if b in comp]
                out.append(f"include circle between {', '.join(comp)} (via {', '.join(via)})")

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def self_test(root):
    """A copy of the tree must report, beyond what it reports as it is (the plain check
    judges that), an upward include planted (src/engine includes src/cli) and a circle
    planted inside a folder."""
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for top in PRODUCT:
            shutil.copytree(os.path.join(root, top), os.path.join(tmp, top))
        base = set(check(tmp))
        target = os.path.join(tmp, "src/engine/fsdp.c")
        original = open(target).read()
        with open(target, "w") as fh:
            fh.write('#include "src/cli/commands.h"\n' + original)
        errs = [e for e in check(tmp) if e not in base]
        hits = [e for e in errs if "higher layer" in e and "src/cli/commands.h" in e]
        if not hits:
            print("FAIL: layout self-test: an upward include (src/engine -> src/cli) was "
                  "not reported")
            ok = False
        else:
            print("PASS: layout self-test: an upward include is reported:", hits[0])
        with open(target, "w") as fh:
            fh.write(original)
        # a circle inside src/engine: shard_plan.h includes fsdp.h, which includes it
        target = os.path.join(tmp, "src/engine/shard_plan.h")
        original = open(target).read()
        with open(target, "w") as fh:
            fh.write('#include "src/engine/fsdp.h"\n' + original)
        errs = [e for e in check(tmp) if e not in base]
        if not any("include circle" in e and "src/engine/fsdp" in e for e in errs):
            print("FAIL: layout self-test: a circle inside src/engine was not reported")
            ok = False
        else:
            print("PASS: layout self-test: a circle is reported:",
                  [e for e in errs if "circle" in e][0])
    return ok


def main():
    args = sys.argv[1:]
    here = os.path.dirname(os.path.abspath(__file__))
    if args and args[0] == "--self-test":
        root = args[1] if len(args) > 1 else os.path.join(here, "..")
        return 0 if self_test(root) else 1
    root = args[0] if args else os.path.join(here, "..")
    errors = check(root)
    for e in errors:
        print("layout:", e)
    if not errors:
        n = sum(1 for _ in sources(root))
        print(f"layout: {n} files in {len(LAYERS)} layers: no upward include, no circle, "
              f"families included only by the registry")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
