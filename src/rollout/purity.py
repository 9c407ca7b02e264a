# The tool cache's purity classifier (src/rollout/purity.ts starts it once per rollout): whether a
# program, run again on the same stdin, can only print the same thing. An allow-list judged on
# Python's own syntax tree, not on substrings: every module the program imports must be on PURE,
# the restricted ones (numpy, sympy, mpmath, statistics, sys) without their random, I/O and
# introspection parts, and it must use none of the dynamic escapes (exec/eval/compile,
# __import__, getattr by a computed name, vars()/globals()/__dict__, frames, ...). What the tree
# cannot show (a default repr's memory address, a run near its time limit) the result side checks.
#
# Protocol: one JSON request per line on stdin, {"id", "code"}; one answer per line on stdout,
# {"id", "pure", "sets", "why"}: `sets` when the output may depend on the string-hash seed (set
# order; sympy orders some results by hash), `why` the first reason it is not pure.
import ast
import json
import re
import sys

# Modules whose every public name is a pure function of its arguments.
PURE = {
    '__future__', 'abc', 'array', 'bisect', 'cmath', 'collections', 'copy', 'dataclasses',
    'decimal', 'enum', 'fractions', 'functools', 'heapq', 'itertools', 'json', 'keyword', 'math',
    'numbers', 'operator', 're', 'string', 'textwrap', 'typing', 'unicodedata',
}

RAND = re.compile('rand', re.I)
NUMPY_DENY = {
    'random', 'empty', 'empty_like', 'ndarray', 'load', 'loadtxt', 'save', 'savez',
    'savez_compressed', 'savetxt', 'genfromtxt', 'fromfile', 'fromregex', 'tofile', 'memmap',
    'ctypes', 'ctypeslib', 'lib', 'core', 'matlib', 'testing', 'f2py', 'distutils', 'DataSource',
    'show_config', 'show_runtime', 'setbufsize', 'seterrcall',
}
SYMPY_DENY = {
    'stats', 'crypto', 'external', 'import_module', 'plot', 'plotting', 'preview', 'interactive',
    'init_session', 'lambdify', 'utilities.lambdify',
}
SYS_ALLOW = {
    'stdin', 'stdout', 'stderr', 'setrecursionlimit', 'getrecursionlimit', 'maxsize', 'exit',
    'float_info', 'int_info', 'set_int_max_str_digits', 'get_int_max_str_digits', 'maxunicode',
    'byteorder', 'getsizeof', 'version_info', 'float_repr_style',
}


def numpy_denies(part):
    return part in NUMPY_DENY


def sympy_denies(part):
    return part in SYMPY_DENY or bool(RAND.search(part))


# Restricted modules: allowed, but an attribute path through them is checked part by part.
RESTRICTED = {
    'numpy': numpy_denies,
    'sympy': sympy_denies,
    'mpmath': lambda part: bool(RAND.search(part)),
    'statistics': lambda part: part == 'NormalDist',
    'sys': lambda part: part not in SYS_ALLOW,
}

BANNED_NAMES = {
    '__import__', 'exec', 'eval', 'compile', 'open', 'id', 'hash', 'vars', 'globals', 'locals',
    'breakpoint', 'help', 'getattr', 'setattr', 'delattr', 'hasattr',
}
NAME_BY_ARG = {'getattr', 'setattr', 'delattr', 'hasattr'}
# A file directly in the working directory: no separator, no leading dot (so no '..').
OWN_FILE = re.compile(r'^[A-Za-z0-9_][A-Za-z0-9_.-]*$')
# numpy generators seeded with a constant draw the same numbers every run:
# `np.random.default_rng(1)`, `from numpy.random import RandomState; RandomState(7)`.
SEEDED = {'default_rng', 'RandomState'}


def constant_seed(call):
    """Whether a call's arguments are whole-number constants (a seed fixed in the program)."""
    def whole(node):
        if isinstance(node, (ast.List, ast.Tuple)):
            return len(node.elts) > 0 and all(whole(e) for e in node.elts)
        return isinstance(node, ast.Constant) and type(node.value) is int
    args = list(call.args) + [k.value for k in call.keywords if k.arg == 'seed']
    return len(args) == 1 and len(call.keywords) == (1 if len(call.args) == 0 else 0) and all(whole(a) for a in args)
# Attribute names that reach frames, buffers' addresses, or files, on any object.
BANNED_ATTRS = {
    'f_globals', 'f_locals', 'f_back', 'f_builtins', 'f_code', 'tb_frame', 'tb_next', 'gi_frame',
    'cr_frame', 'ag_frame', 'gi_code', 'buffer_info', 'tofile', 'ctypes', 'modules', '_getframe',
    'settrace', 'setprofile', 'getrefcount', 'meta_path', 'path_hooks', 'exc_info', 'last_traceback',
    '_current_frames', 'attrgetter', 'methodcaller',
}
# Dunders an ordinary program uses; any other (__dict__, __class__, __subclasses__, __globals__,
# __builtins__, __code__, ...) is a way around the module check.
DUNDER = re.compile(r'^__\w+__$')
DUNDER_IN_TEXT = re.compile(r'__\w+__')
OK_DUNDERS = {
    '__name__', '__main__', '__init__', '__str__', '__repr__', '__eq__', '__ne__', '__lt__',
    '__le__', '__gt__', '__ge__', '__hash__', '__len__', '__getitem__', '__setitem__', '__delitem__',
    '__contains__', '__iter__', '__next__', '__call__', '__add__', '__sub__', '__mul__',
    '__truediv__', '__floordiv__', '__mod__', '__pow__', '__neg__', '__pos__', '__abs__',
    '__radd__', '__rsub__', '__rmul__', '__iadd__', '__bool__', '__int__', '__float__',
    '__index__', '__doc__', '__post_init__', '__enter__', '__exit__', '__lshift__', '__rshift__',
    '__and__', '__or__', '__xor__', '__invert__', '__matmul__', '__rtruediv__', '__divmod__',
    '__round__', '__slots__', '__annotations__', '__future__', '__missing__',
}


class Impure(Exception):
    pass


def bound_names(tree):
    """Names the program binds itself (a variable called `id` is not the builtin)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split('.')[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


class Judge:
    def __init__(self, tree):
        self.tree = tree
        self.own = bound_names(tree)
        self.modules = set()  # top-level modules imported
        self.aliases = {}  # local name -> module path bound by `import X [as Y]`
        self.sets = False
        self.star = []  # the rules of restricted modules imported with *
        self.seeded = set()  # local names of numpy's generator classes, each call seeded by a constant

    def deny(self, why):
        raise Impure(why)

    def check_path(self, parts, where):
        """A module path (plus imported names) against the allow-list and its module's rule."""
        root = parts[0]
        if root not in PURE and root not in RESTRICTED:
            self.deny(f'{where}: {root} is not on the list of pure modules')
        self.modules.add(root)
        rule = RESTRICTED.get(root)
        for part in parts[1:]:
            self.check_attr(part, where)
            if rule is not None and rule(part):
                self.deny(f'{where}: {".".join(parts)} is outside the pure part of {root}')

    def check_attr(self, name, where):
        if name in BANNED_ATTRS:
            self.deny(f'{where}: .{name}')
        if DUNDER.match(name) and name not in OK_DUNDERS:
            self.deny(f'{where}: {name}')

    def imports(self):
        for node in ast.walk(self.tree):
            where = f'line {getattr(node, "lineno", 0)}'
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.check_path(a.name.split('.'), where)
                    if a.name.split('.')[0] in RESTRICTED:
                        local = a.asname or a.name.split('.')[0]
                        self.aliases[local] = a.name.split('.') if a.asname else [a.name.split('.')[0]]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    self.deny(f'{where}: relative import')
                path = (node.module or '').split('.')
                for a in node.names:
                    if path == ['numpy', 'random'] and a.name in SEEDED:
                        self.modules.add('numpy')
                        self.seeded.add(a.asname or a.name)
                        continue
                    self.check_path(path if a.name == '*' else path + [a.name], where)
                    if a.name == '*' and path[0] in RESTRICTED:
                        if path[0] == 'sys':
                            self.deny(f'{where}: from sys import *')
                        # Its names arrive bare (`randprime`, `empty`): checked where they are used.
                        self.star.append(RESTRICTED[path[0]])

    def visit(self):
        # Every restricted module's rule applies to attribute names anywhere: a module reached
        # through a variable (`m = np.ma; m.empty(3)`) is checked by the name it is used with.
        rules = [RESTRICTED[m] for m in self.modules if m in RESTRICTED and m != 'sys']
        parents = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                parents[child] = node
        for node in ast.walk(self.tree):
            where = f'line {getattr(node, "lineno", 0)}'
            if isinstance(node, ast.Attribute):
                self.check_attr(node.attr, where)
                if self.seeded_generator(node, parents):
                    continue
                for rule in rules:
                    if rule(node.attr):
                        self.deny(f'{where}: .{node.attr}')
                if isinstance(node.value, ast.Name) and node.value.id in self.aliases:
                    parts = self.aliases[node.value.id] + [node.attr]
                    rule = RESTRICTED[parts[0]]
                    if any(rule(p) for p in parts[1:]):
                        self.deny(f'{where}: {".".join(parts)} is outside the pure part of {parts[0]}')
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                if DUNDER.match(node.id) and node.id not in OK_DUNDERS:
                    self.deny(f'{where}: {node.id}')
                if node.id in BANNED_NAMES and node.id not in self.own:
                    call = parents.get(node)
                    if node.id in NAME_BY_ARG and isinstance(call, ast.Call) and call.func is node:
                        self.constant_name(call, where)
                    elif node.id == 'open' and isinstance(call, ast.Call) and call.func is node:
                        self.own_file(call, where)
                    else:
                        self.deny(f'{where}: {node.id}')
                if node.id in self.aliases:
                    parent = parents.get(node)
                    if not (isinstance(parent, ast.Attribute) and parent.value is node):
                        # The module object itself handed on: what is done with it is not known here.
                        self.deny(f'{where}: the module {node.id} used as a value')
                if node.id not in self.own and any(rule(node.id) for rule in self.star):
                    self.deny(f'{where}: {node.id}')
                if node.id in self.seeded:
                    call = parents.get(node)
                    if not (isinstance(call, ast.Call) and call.func is node and constant_seed(call)):
                        self.deny(f'{where}: {node.id} without a constant seed')
                if node.id in ('set', 'frozenset'):
                    self.sets = True
            elif isinstance(node, (ast.Set, ast.SetComp)):
                self.sets = True
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                self.check_text(node.value, where)

    def seeded_generator(self, node, parents):
        """`np.random` as the head of `np.random.default_rng(<constant>)`."""
        if not (node.attr == 'random' and isinstance(node.value, ast.Name)):
            return False
        if self.aliases.get(node.value.id) != ['numpy']:
            return False
        parent = parents.get(node)
        call = parents.get(parent)
        return (
            isinstance(parent, ast.Attribute)
            and parent.attr in SEEDED
            and isinstance(call, ast.Call)
            and call.func is parent
            and constant_seed(call)
        )

    def constant_name(self, call, where):
        """getattr(x, 'name'): allowed only with a constant name that passes the attribute rules."""
        name = call.args[1] if len(call.args) > 1 else None
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            self.deny(f'{where}: {call.func.id} with a computed name')
        obj = call.args[0]
        if isinstance(obj, ast.Name) and obj.id in self.aliases:
            self.check_path(self.aliases[obj.id] + [name.value], where)
        self.check_attr(name.value, where)
        for m in self.modules:
            if m in RESTRICTED and m != 'sys' and RESTRICTED[m](name.value):
                self.deny(f'{where}: {call.func.id}(..., {name.value!r})')

    def own_file(self, call, where):
        """open('data.txt', ...): a file of the working directory, named by a constant, with constant
        arguments. The directory holds the problem's files and what the program (or, in a session,
        an earlier cell of the same history) wrote there, so what is read is the same every run;
        any other path (/proc, /dev/urandom, a computed name, an opener) may differ."""
        name = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == 'file'), None)
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str) and OWN_FILE.match(name.value)):
            self.deny(f'{where}: open of a path that is not a constant name in the working directory')
        for arg in list(call.args[1:]) + [k.value for k in call.keywords if k.arg != 'file']:
            if not isinstance(arg, ast.Constant):
                self.deny(f'{where}: open with a computed argument')
        if any(k.arg is None or k.arg == 'opener' for k in call.keywords):
            self.deny(f'{where}: open with an opener or unpacked arguments')

    def check_text(self, text, where):
        """Strings that code can turn into attribute names or, through sympify, into code."""
        for word in DUNDER_IN_TEXT.findall(text):
            if word not in OK_DUNDERS:
                self.deny(f'{where}: {word} in a string')
        if 'sympy' in self.modules:
            # sympy evaluates strings it is given (sympify, S, parse_expr, most functions).
            if '__' in text:
                self.deny(f'{where}: a string sympy may evaluate holds __')
            try:
                expr = ast.parse(text, mode='eval')
            except (SyntaxError, ValueError):
                return
            for node in ast.walk(expr):
                name = node.id if isinstance(node, ast.Name) else getattr(node, 'attr', None)
                if name is not None and (name in BANNED_NAMES or sympy_denies(name)):
                    self.deny(f'{where}: {name} in a string sympy may evaluate')


def judge(code):
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError) as error:
        return False, False, f'does not parse: {error}'
    j = Judge(tree)
    try:
        j.imports()
        j.visit()
    except Impure as why:
        return False, j.sets, str(why)
    # sympy orders some results by hash (free_symbols, set-valued results).
    return True, j.sets or 'sympy' in j.modules, ''


def main():
    for line in sys.stdin:
        request = json.loads(line)
        try:
            pure, sets, why = judge(request['code'])
        except RecursionError:
            pure, sets, why = False, False, 'nested too deeply to judge'
        except Exception as error:  # never let one program stop the classifier: it is not shared
            pure, sets, why = False, False, f'could not judge: {error!r}'
        sys.stdout.write(json.dumps({'id': request['id'], 'pure': pure, 'sets': sets, 'why': why}) + '\n')
        sys.stdout.flush()


if __name__ == '__main__':
    main()
