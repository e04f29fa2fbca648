"""The package's shape, for a closing note: modules and lines per subpackage, imports that run upwards, the largest
classes and functions, and `TransformerBlock`'s argument count.

    python tools/package_shape.py [--root PATH]

`--root` reads another checkout (e.g. a `git worktree` of an older commit). The ranks and the import graph are
`tests/test_package.py`'s.
"""

import argparse
import ast
import collections
import os
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"), root]
    import test_package

    test_package.PACKAGE = os.path.join(root, "keras_vit")
    modules = test_package.module_names()
    per_package = collections.defaultdict(lambda: [0, 0])
    sizes = []
    for name, path in sorted(modules.items()):
        source = open(path).read()
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        per_package[package][0] += 1
        per_package[package][1] += len(source.splitlines())
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                kind = "class" if isinstance(node, ast.ClassDef) else "def"
                sizes.append((node.end_lineno - node.lineno + 1, f"{kind} {name}.{node.name}"))
    print("| package | modules | lines |\n|---|---|---|")
    for package, (count, lines) in sorted(per_package.items()):
        print(f"| {package} | {count} | {lines} |")
    print(f"| all | {len(modules)} | {sum(lines for _, lines in per_package.values())} |")
    graph = test_package.import_graph()
    upward = test_package.imports_running_upwards(graph)
    print(f"\nimports: {sum(map(len, graph.values()))}; running upwards: {len(upward)}")
    for name, target in upward:
        print(f"  {name} -> {target}")
    print("\nlargest classes and functions (lines):")
    for lines, what in sorted(sizes, reverse=True)[: args.top]:
        print(f"  {lines:4d} {what}")
    for name, path in modules.items():
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ClassDef) and node.name == "TransformerBlock":
                init = next(item for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "__init__")
                count = len(init.args.args) - 1 + len(init.args.kwonlyargs)
                print(f"\nTransformerBlock.__init__ ({name}): {count} named arguments"
                      + (" and **kwargs" if init.args.kwarg else ""))


if __name__ == "__main__":
    main()
